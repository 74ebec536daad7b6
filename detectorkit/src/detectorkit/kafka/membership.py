"""This instance's membership of its service's consumer group: which input partitions it owns.

Spark has no notion of a group member, so the membership lives beside the query, in the driver:
a confluent-kafka consumer subscribes with the cooperative-sticky assignor, never fetches (every
partition it gets is paused at once) and only takes part in rebalances and commits. It is the one
client that commits the group's offsets, because Kafka refuses a commit from a non-member
(generation -1, UNKNOWN_MEMBER_ID) once the group has members, and because its commits carry its
generation: a member that lost its partitions while paused (a zombie) is refused, so it cannot move
the group's offsets backwards.

How Kafka is read is not its business: the owner (`Owner`) is told to release partitions, and
waits until their batch in flight is written and committed before returning, and reads whatever
`owned` says, from the group's committed offsets. Rebalance callbacks run in `poll()`, on the thread
that polls; so does the owner's release.

Every call on the consumer runs on that one thread. Measured here: a synchronous commit from another
thread while a revoke callback runs waits for the rebalance, which waits for the callback, until the
generation is gone (ILLEGAL_GENERATION after 40 s); the same commit from inside the callback takes
20 ms. So `commit` and `committed` from other threads are queued and run by `serve()`, which `poll()`
calls and which an owner waiting for its batch inside `release` calls too.

INSTANCE_ID, when set, becomes group.instance.id (static membership): an instance restarted under the
same id within the session timeout gets its partitions back without a rebalance. A static member
does not leave the group when it stops (that is the point), so its partitions move only after the
session timeout; instances started without an INSTANCE_ID are dynamic members and hand their
partitions over at once when they stop. A killed member's partitions wait for the session timeout
either way; 10 s by default (bench/handover.py has the measurements behind it).

GROUP_PROTOCOL=consumer (KIP-848, Kafka 4.0+) lets the broker assign and time members out. Measured
on Kafka 4.2.1 with its defaults it is no faster here, and a static member restarted after a crash
is refused (UNRELEASED_INSTANCE_ID) until the broker drops the dead one (45 s): classic is the default.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import structlog
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from detectorkit.kafka import clients, offset_store
from detectorkit.kafka.clients import retrying

log = structlog.get_logger("detectorkit.membership")

# The broker's answers to a commit from a member whose generation is over: the partitions are,
# or may be, someone else's now. The group's offsets stay where their owner put them.
_NOT_OWNER = {KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID, KafkaError.FENCED_INSTANCE_ID, KafkaError._FENCED}
# Answers that a rebalance is under way, given to a member still in the group, so the commit is
# tried again once the rebalance's callbacks have run. ILLEGAL_GENERATION is one of them: a commit
# built under the generation the rebalance is replacing reaches the broker after the member has
# joined the new one (measured: 9 refusals in 3 joins and leaves while committing in a loop). With
# the cooperative protocol no other member owns a partition until this one has revoked it, and
# the revoke runs on the thread that retries, which drops what is no longer owned: the retry can
# never move another owner's offsets.
# STALE_MEMBER_EPOCH is the consumer protocol's ILLEGAL_GENERATION: the commit carried the epoch
# an assignment change has just replaced (seen in a rolling replacement: the batch's query failed
# and its records were written again after the restart).
_AFTER_REBALANCE = {KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION, KafkaError.STALE_MEMBER_EPOCH}

# group.protocol: "classic" (JoinGroup/SyncGroup, any broker) or "consumer" (KIP-848, Kafka 4.0+).
PROTOCOLS = ("classic", "consumer")
# Settings of the classic protocol that librdkafka refuses under the consumer protocol.
CLASSIC_ONLY = ("partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms")


class CommitRefused(KafkaException):
    """The group refused a commit: this instance no longer owns the partitions (a zombie)."""


class _Call:
    def __init__(self, fn):
        self.fn, self.done, self.result, self.error, self.attempts = fn, threading.Event(), None, None, 0
        self._lock = threading.Lock()
        self._claimed = False

    def claim(self) -> bool:
        """True for the one thread that gets to run it."""
        with self._lock:
            claimed, self._claimed = self._claimed, True
            return not claimed

    def run(self) -> None:
        self.attempts += 1
        try:
            self.result = self.fn()
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            self.error = exc


class Owner(Protocol):
    def release(self, partitions: set[int], lost: bool) -> None:
        """Stop reading `partitions`. Revoked (lost=False): return once the batch in flight is
        written and committed. Lost (another member may already read them): commit nothing more."""


class GroupMember:
    def __init__(
        self,
        base_conf: Mapping[str, Any],
        group: str,
        topic: str,
        *,
        static_id: str | None = None,
        session_timeout: float = 10.0,
        protocol: str = "classic",
        timeout: float = 30.0,
    ):
        if protocol not in PROTOCOLS:
            raise ValueError(f"unknown group protocol {protocol!r}: one of {', '.join(PROTOCOLS)}")
        self.group, self.topic, self.timeout = group, topic, timeout
        self.owner: Owner | None = None  # who is told to release what the group takes away: `subscribe`'s
        self.static_id, self.protocol = static_id, protocol
        if protocol == "consumer":
            # KIP-848: the broker assigns (always incrementally) and times members out
            # (group.consumer.session.timeout.ms); librdkafka refuses the classic keys.
            membership = {"group.protocol": "consumer"}
        else:
            membership = {
                "partition.assignment.strategy": "cooperative-sticky",
                "session.timeout.ms": int(session_timeout * 1000),
                "heartbeat.interval.ms": int(min(3000, session_timeout * 1000 / 4)),
            }
        conf = clients.consumer(
            base_conf,
            group,
            **membership,
            **{
                # Never fetches, so polls are short; a hand-over (a batch finishing) must fit in it.
                "max.poll.interval.ms": 600_000,
                # Partitions are paused the moment they arrive; keep what a fetch may still bring small.
                "queued.max.messages.kbytes": 1024,
                # Partitions added to the topic join the assignment within this (librdkafka: 5 min).
                "topic.metadata.refresh.interval.ms": 5000,
                "error_cb": self._on_error,
            },
        )
        if protocol == "consumer":
            for key in CLASSIC_ONLY:
                conf.pop(key, None)
        if static_id:
            conf["group.instance.id"] = static_id
        self._consumer = clients.new_consumer(conf)
        self.owned: frozenset[int] = frozenset()
        self.changed_at = time.monotonic()  # when the last change of `owned` began
        self.fatal: str | None = None
        self._calls: queue.Queue[_Call] = queue.Queue()
        self._server: threading.Thread | None = None  # the thread that polls and runs the calls
        self.joined = False  # the first assignment arrived (it may be empty)

    def subscribe(self, owner: Owner) -> GroupMember:
        """Joins the group; `owner` releases what a rebalance takes away (in `poll`)."""
        self.owner = owner
        self._consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost)
        return self

    def poll(self, timeout: float) -> None:
        """Serve the group for `timeout` s: queued calls, and rebalance callbacks (heartbeats run
        by themselves). Messages can only slip through before their pause: dropped."""
        deadline = time.monotonic() + timeout
        while True:
            self.serve(wait=min(0.05, max(0.0, deadline - time.monotonic())))
            message = self._consumer.poll(0)
            if message is not None and message.error() is not None:  # consumer errors come as messages too
                self._on_error(message.error())
            if time.monotonic() >= deadline:
                return

    def serve(self, wait: float = 0.0) -> None:
        """Run the calls other threads queued, on this thread (which becomes the serving one)."""
        self._server = threading.current_thread()
        retry = []
        try:
            call = self._calls.get(timeout=wait) if wait > 0 else self._calls.get_nowait()
            while True:
                if not call.claim():  # its caller ran it: nobody was serving then
                    call = self._calls.get_nowait()
                    continue
                call.run()
                error = call.error
                if isinstance(error, KafkaException) and error.args[0].code() in _AFTER_REBALANCE and call.attempts < 200:
                    call.error = None
                    call._claimed = False
                    retry.append(call)  # again after the next poll
                else:
                    call.done.set()
                call = self._calls.get_nowait()
        except queue.Empty:
            pass
        for call in retry:
            self._calls.put(call)

    def stop_serving(self) -> None:
        """This thread serves the group no more (the job is stopping and nothing polls): calls
        queued from now on run on their callers. Else a call from another thread (the metrics
        reporter's last offsets) waits for a thread that is itself waiting for that caller."""
        if self._server is threading.current_thread():
            self._server = None

    def _run(self, fn):
        if self._server is threading.current_thread():
            return fn()
        call = _Call(fn)  # the server runs it, or the caller when nobody serves: who claims it first
        self._calls.put(call)
        deadline = time.monotonic() + self.timeout + 60
        while not call.done.wait(0.05):
            # No thread serves any more (the group's thread has ended, the job is stopping).
            if (self._server is None or not self._server.is_alive()) and call.claim():
                call.run()
                break
            if time.monotonic() > deadline:
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "the consumer group's thread did not take the call"))
        if call.error is not None:
            raise call.error
        return call.result

    # ---- rebalance callbacks (on the polling thread) ---------------------------------------------

    def _on_assign(self, consumer, partitions: list[TopicPartition]) -> None:
        consumer.incremental_assign(partitions)
        self.joined = True
        if partitions:
            consumer.pause(partitions)
            self._change(self.owned | {tp.partition for tp in partitions})

    def _on_revoke(self, consumer, partitions: list[TopicPartition]) -> None:
        self._release(consumer, partitions, lost=False)

    def _on_lost(self, consumer, partitions: list[TopicPartition]) -> None:
        self._release(consumer, partitions, lost=True)

    def _release(self, consumer, partitions: list[TopicPartition], lost: bool) -> None:
        gone = {tp.partition for tp in partitions}
        if gone:
            self.changed_at = time.monotonic()
            if lost:  # another member may read them already: no commit of theirs runs from now on
                self._change(self.owned - gone, started=self.changed_at)
            self.owner.release(gone, lost)
            self._change(self.owned - gone, started=self.changed_at)
        consumer.incremental_unassign(partitions)

    def _change(self, owned: Iterable[int], started: float | None = None) -> None:
        self.owned = frozenset(owned)
        self.changed_at = started or time.monotonic()

    def _on_error(self, error: KafkaError) -> None:
        # librdkafka reports the fencing as code _FATAL, with fatal() False (measured, 2.16).
        fatal = error.fatal() or error.code() == KafkaError._FATAL
        if error.code() == KafkaError.UNRELEASED_INSTANCE_ID or (fatal and "instance id is still used" in error.str().lower()):
            # The consumer protocol refuses the newcomer, not the member holding the id (seen: code
            # _FATAL, "The instance ID is still used by another member in the consumer group").
            self.fatal = (
                f"INSTANCE_ID={self.static_id!r} is still held in consumer group {self.group!r}: by a running instance (each "
                "instance of a service needs its own INSTANCE_ID), or by one that crashed, until the broker's session "
                "timeout (group.consumer.session.timeout.ms) drops it"
            )
        elif error.code() == KafkaError.FENCED_INSTANCE_ID or (fatal and "fenced" in error.str().lower()):
            self.fatal = (
                f"another instance joined consumer group {self.group!r} with INSTANCE_ID={self.static_id!r}; "
                "each instance of a service needs its own INSTANCE_ID"
            )
        elif fatal:
            self.fatal = f"consumer group {self.group!r}: {error.str()}"

    # ---- offsets --------------------------------------------------------------------------------

    def committed(self, partitions: Iterable[int]) -> dict[int, int | None]:
        """The group's committed offset of each partition, None where it has none."""
        partitions = list(partitions)
        return self._run(lambda: offset_store.committed(self._consumer, self.topic, partitions, self.timeout))

    def commits(self, partitions: Iterable[int]) -> dict[int, offset_store.Commit]:
        """Each partition's committed offset and how far its state changelog reflects the input (the
        commit's metadata), in one request."""
        partitions = list(partitions)
        return self._run(lambda: offset_store.commits(self._consumer, self.topic, partitions, self.timeout))

    def _committed_partitions(self, partitions: list[int]) -> list[TopicPartition]:
        return offset_store.committed_partitions(self._consumer, self.topic, partitions, self.timeout)

    def commit(self, offsets: Mapping[int, int], metadata: Mapping[int, str] | None = None) -> None:
        """Commit as the group member, only partitions it owns when the commit runs (the release of
        partitions runs on the same thread, so a late commit never lands after it); CommitRefused
        when the group says these are not ours. `metadata`: each partition's, kept with its offset."""
        if offsets:
            self._run(lambda: self._commit(offsets, metadata))

    def _commit(self, offsets: Mapping[int, int], metadata: Mapping[int, str] | None = None) -> None:
        metadata = metadata or {}
        tps = [_partition(self.topic, p, o, metadata.get(p)) for p, o in sorted(offsets.items()) if p in self.owned]
        if len(tps) < len(offsets):
            log.warning("not committing partitions this instance no longer owns", partitions=sorted(set(offsets) - self.owned))
        if not tps:
            return
        try:
            result = retrying(lambda: self._consumer.commit(offsets=tps, asynchronous=False), self.timeout)
        except KafkaException as exc:
            if exc.args[0].code() in _NOT_OWNER:
                raise CommitRefused(exc.args[0]) from None
            raise
        failed = [tp.error for tp in result or [] if tp.error]
        if failed:
            if failed[0].code() in _NOT_OWNER:
                raise CommitRefused(failed[0])
            raise KafkaException(failed[0])

    def recommit(self, partitions: Iterable[int]) -> dict[int, int]:
        """Commit the group's positions of the owned `partitions` again, read and written in one
        call on the serving thread, so no batch's commit can come in between."""

        def again():
            owned = [p for p in partitions if p in self.owned]
            tps = [tp for tp in self._committed_partitions(owned) if tp.offset >= 0]
            known = {tp.partition: tp.offset for tp in tps}
            self._commit(known, {tp.partition: tp.metadata for tp in tps if tp.metadata})  # the metadata too: where the state is
            return known

        return self._run(again)

    def group_metadata(self) -> bytes:
        """The member's group metadata (group, generation, member id), with which a transactional
        producer in another process commits offsets as this member (KIP-447)."""
        return self._run(self._consumer.consumer_group_metadata)

    def member_id(self) -> str:
        return self._consumer.memberid() or ""

    def close(self) -> None:
        """Leave the group (a dynamic member; a static one is only forgotten after the session
        timeout). Release callbacks may run in here. Always call it: a member left to the garbage
        collector with a rebalance pending makes librdkafka spin forever in its destroy."""
        try:
            self._consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("leaving the consumer group failed", error=str(exc))


def _partition(topic: str, partition: int, offset: int, metadata: str | None) -> TopicPartition:
    # confluent-kafka takes no None for the metadata: only a string, or nothing.
    return TopicPartition(topic, partition, offset) if metadata is None else TopicPartition(topic, partition, offset, metadata)
