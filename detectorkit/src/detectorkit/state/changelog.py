"""The changelog topic: created with the service's topics, read back a task's partitions at a time.

One changelog partition per input partition (partition p's state in partition p), compacted, so it
holds about one record per live key. Compaction waits an hour (`min.compaction.lag.ms`): a crash
leaves changes of a batch that was never committed in the log, and until its replay writes them
again, the older, committed value of a key must still be there for a restore to find.

An input that gains partitions moves keys away from their state: a stateful job refuses it, at start
and at every assignment, with one line that says what to do (`partitions_changed`).

A task's partitions are read back together, with a consumer of its own, assigned, in no group (as
Kafka Streams' `StoreChangelogReader`), each until the end it reports after a fetch (exact on every
broker, where ListOffsets is not on Tansu); a read that stops making progress fails the task, and
with it the batch. A start the changelog no longer has (the topic was truncated, or deleted and
created again) is reported, never skipped to the end as librdkafka would by default, and the caller
reads that partition again from its first record (`Reader.restart`), as Kafka Streams does on
`InvalidOffsetException`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import structlog
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, KafkaException, TopicPartition

from detectorkit.kafka import broker_kind, clients
from detectorkit.kafka.access import KafkaAccess
from detectorkit.kafka.worker_clients import WorkerClients
from detectorkit.settings import SettingsError
from detectorkit.state.codec import tag_of

# An hour: far longer than a crashed task takes to be replayed, far shorter than a segment lives.
COMPACTION_LAG_MS = 3_600_000
TOPIC_CONFIG = {"cleanup.policy": "compact", "min.compaction.lag.ms": str(COMPACTION_LAG_MS)}
# The README's section on what to do when the input's partition count changed.
RESET = "Changing the input's partition count"


@dataclass(frozen=True)
class StateContext:
    """What a task needs to find its partitions' state: pickled to the workers with the task."""

    topic: str
    access: KafkaAccess
    # A store no task has used for this long is dropped from the worker (its partition moved away).
    idle_seconds: float = 600.0
    # A partition with nothing to read is taken to have reached this long before the wall clock (timers).
    idle_grace_seconds: float = 60.0
    input_topic: str = ""
    # read_committed with exactly-once: an aborted batch's changes are never read back.
    isolation: str = "read_uncommitted"
    # How often a task writes its stores' changes (0: every batch); the group's committed offset
    # then carries how far the changelog reflects the input (`durable`), a restore reads it up to
    # there and the records after it are replayed (runtime.processing).
    flush_interval_seconds: float = 0.0

    @property
    def client_conf(self) -> dict[str, Any]:
        return self.access.client_conf

    @property
    def timeout(self) -> float:
        return self.access.timeout

    @property
    def group(self) -> str:
        return self.access.group


def create(base_conf: Mapping[str, Any], topic: str, input_topic: str, kind: str, timeout: float) -> None:
    """The changelog topic with the input's partition count; SettingsError when one exists with another."""
    admin = clients.new_admin(base_conf)
    wanted = len(clients.topic_partitions(admin, input_topic, timeout))
    # Without compaction (Tansu) the changelog just grows: a demo broker.
    config = TOPIC_CONFIG if broker_kind.profile(kind).compacts else {}
    if topic in clients.create_topics(base_conf, {topic: wanted}, timeout, config=config):
        return  # created now, as asked (its metadata may take a moment to reach every broker)
    have = len(_partitions_when_known(admin, topic, timeout))
    if have != wanted:
        raise SettingsError(partitions_changed(topic, have, input_topic, wanted))


def require(base_conf: Mapping[str, Any], topic: str, input_topic: str, timeout: float) -> None:
    """TOPICS_AS_CODE: the changelog topic made elsewhere, with the input's partition count;
    SettingsError in one line, saying how to make it, when it is missing or has another count."""
    admin = clients.new_admin(base_conf)
    wanted = len(clients.topic_partitions(admin, input_topic, timeout))
    try:
        have = len(clients.topic_partitions(admin, topic, timeout))
    except LookupError:
        settings = ", ".join(f"{k}={v}" for k, v in TOPIC_CONFIG.items())
        raise SettingsError(
            f"TOPICS_AS_CODE=true and the state's changelog topic {topic!r} does not exist: create it where the topics are defined, "
            f"with {wanted} partitions (the input's) and {settings}"
        ) from None
    if have != wanted:
        raise SettingsError(partitions_changed(topic, have, input_topic, wanted))


def check_assignment(admin, topic: str, input_topic: str, owned: frozenset[int], timeout: float) -> None:
    """At an assignment: SettingsError unless every partition of the input, and every one the group
    gave (`owned`), has its changelog partition. One metadata request, of every topic (naming one
    would create it on a broker that creates topics on demand)."""
    topics = admin.list_topics(timeout=timeout).topics
    entry = topics.get(topic)
    if entry is None or entry.error is not None or not entry.partitions:
        have = set(_partitions_when_known(admin, topic, timeout))  # (or the broker's reason why not)
    else:
        have = set(entry.partitions)
    entry = topics.get(input_topic)
    # The group may know of partitions a lagging broker's metadata does not show yet.
    inputs = set(owned) | (set(entry.partitions) if entry is not None and entry.error is None else set())
    if not inputs <= have:
        raise SettingsError(partitions_changed(topic, len(have), input_topic, max(inputs) + 1))


def partitions_changed(topic: str, have: int, input_topic: str, wanted: int) -> str:
    """The one line that stops a stateful job whose input's partition count is not its changelog's:
    at start (`create`) and at every assignment (`check_assignment`). More changelog partitions would
    not mend it: the key picks the partition, so a key's records would go where its state is not.
    Kafka Streams refuses a changed source partition count too."""
    return (
        f"input topic {input_topic!r} now has {wanted} partitions but state changelog {topic!r} has {have}: "
        "partition p's state lives in changelog partition p and the key picks the partition, so keys would "
        "move to other partitions and lose their state; give the State a new name (State(name=...)) to start "
        f'from empty state, or reset as README.md\'s "{RESET}" says'
    )


# One consumer per worker process, assigned for each read: a restore is often a catch-up of a few
# records, which a new consumer per read would cost more than.
_consumers = WorkerClients(close=lambda consumer: consumer.close())


def _partitions_when_known(admin, topic: str, timeout: float) -> list[int]:
    """The partitions of a topic that exists, once the broker's metadata shows it: another instance
    may have created it a moment ago (seen failing a job's start when the diamond's jobs started
    side by side)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return clients.topic_partitions(admin, topic, timeout)
        except LookupError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


# A changelog record read back: (key, value, input offset tag, changelog offset).
Record = tuple[str, bytes | None, int | None, int]

# A fetch from an offset the partition no longer has (librdkafka reports it so with auto.offset.reset=error).
_OUT_OF_RANGE = {KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE}

_log = structlog.get_logger("detectorkit.state")


class Part(NamedTuple):
    """Records of one partition, in order, as a read gives them."""

    partition: int
    records: list[Record]
    # On the partition's last part: its end, the offset after its last record (a transaction's
    # commit marker included), where a store that read it all next reads from.
    end: int | None = None
    # Its start is not in the changelog (truncated, or deleted and created again): nothing was read.
    out_of_range: bool = False


def _conf(ctx: StateContext) -> dict[str, Any]:
    return clients.consumer(
        ctx.client_conf,
        ctx.group,  # never subscribes or commits: assigned only
        **{
            "enable.partition.eof": True,
            "isolation.level": ctx.isolation,
            "enable.auto.commit": False,
            # Not "latest" (librdkafka's default): a store that jumped to the end would miss every
            # record in between without a word.
            "auto.offset.reset": "error",
        },
    )


class Reader:
    """The parts of each partition of `starts` from its start (None: its first record) to its end;
    `restart` reads a partition again from its first record (the caller drops what it read of it)."""

    def __init__(self, ctx: StateContext, starts: Mapping[int, int | None]):
        self._ctx = ctx
        self._starts = dict(starts)
        self._restarts: list[int] = []

    def restart(self, partition: int) -> None:
        self._restarts.append(partition)

    def __iter__(self) -> Iterator[Part]:
        ctx = self._ctx
        conf = _conf(ctx)
        with _consumers.use(clients.conf_key(conf), lambda: clients.new_consumer(conf)) as consumer:
            consumer.assign([TopicPartition(ctx.topic, p, OFFSET_BEGINNING if start is None else start) for p, start in self._starts.items()])
            reading = set(self._starts)
            try:
                progress = time.monotonic()
                while reading or self._restarts:
                    if self._restarts:
                        # Assigned afresh: what was fetched from the old position is never delivered.
                        again = [TopicPartition(ctx.topic, p, OFFSET_BEGINNING) for p in dict.fromkeys(self._restarts)]
                        self._restarts.clear()
                        consumer.incremental_unassign(again)
                        consumer.incremental_assign(again)
                        reading.update(tp.partition for tp in again)
                        progress = time.monotonic()
                    # A short wait: consume() returns only when it has as many records as asked or its
                    # timeout passed, and the end of a catch-up comes after a few.
                    messages = consumer.consume(10_000, timeout=0.05)
                    if messages:
                        progress = time.monotonic()
                    elif time.monotonic() - progress > ctx.timeout:
                        waiting = ", ".join(f"{ctx.topic}-{p}" for p in sorted(reading))
                        raise TimeoutError(f"reading state changelog {waiting} made no progress for {ctx.timeout:g} s")
                    records: dict[int, list[Record]] = {}
                    last: dict[int, Part] = {}  # a partition's end reached, or its start out of range
                    for message in messages:
                        error = message.error()
                        if error is None:
                            got = records.get(p := message.partition())
                            if got is None:
                                got = records[p] = []
                            got.append((message.key().decode(), (value := message.value()), tag_of(message.headers(), value), message.offset()))
                        elif error.code() == KafkaError._PARTITION_EOF:
                            if (p := message.partition()) in reading:
                                reading.discard(p)
                                last[p] = Part(p, [], end=message.offset())
                        elif error.code() in _OUT_OF_RANGE:
                            if (p := message.partition()) in reading:
                                reading.discard(p)
                                _log.warning("state changelog offset out of range", partition=f"{ctx.topic}-{p}", error=error.str())
                                last[p] = Part(p, [], out_of_range=True)
                        elif error.fatal() or not error.retriable():
                            raise KafkaException(error)
                    # Records past a partition's end (written since it was reached) are left for the
                    # store's next read.
                    parts = {p: Part(p, got) for p, got in records.items() if p in reading}
                    for p, part in last.items():
                        if not part.out_of_range:
                            part = part._replace(records=[r for r in records.get(p, ()) if r[3] < part.end])
                        parts[p] = part
                    yield from parts.values()
            finally:
                consumer.unassign()


def read(ctx: StateContext, starts: Mapping[int, int | None]) -> Reader:
    """The parts of each partition of `starts` from its start (None: its first record) to its end."""
    return Reader(ctx, starts)


def ends(ctx: StateContext, partitions: list[int]) -> dict[int, int]:
    """Each partition's end as ListOffsets answers it (the offset after its last record, commit
    markers included; under read_committed the last stable offset), in one request, reading
    nothing. Empty on a broker whose ListOffsets is wrong (Tansu) or when the answer fails: the
    caller then reads instead."""
    if not partitions or not _exact_ends(ctx):
        return {}
    conf = _conf(ctx)
    try:
        with _consumers.use(clients.conf_key(conf), lambda: clients.new_consumer(conf)) as consumer:
            # A timestamp of -1 asks ListOffsets for the latest offset, with the consumer's isolation.
            answers = consumer.offsets_for_times([TopicPartition(ctx.topic, p, OFFSET_END) for p in partitions], timeout=ctx.timeout)
    except KafkaException as exc:
        _log.info("state changelog ends unknown", topic=ctx.topic, error=str(exc))
        return {}
    return {tp.partition: tp.offset for tp in answers if tp.error is None and tp.offset >= 0}


_exact: dict[str, bool] = {}


def _exact_ends(ctx: StateContext) -> bool:
    """Whether the broker's ListOffsets is exact (Apache Kafka): asked once per worker process."""
    key = clients.conf_key(ctx.client_conf)
    if key not in _exact:
        try:
            _exact[key] = broker_kind.profile(broker_kind.detect(ctx.client_conf, ctx.timeout)).lists_latest
        except KafkaException:
            return False  # asked again next time
    return _exact[key]
