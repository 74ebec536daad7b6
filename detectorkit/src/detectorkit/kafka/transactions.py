"""Exactly-once: what a task writes for its input partitions, and their next offsets, in one Kafka
transaction (Kafka Streams' `exactly_once_v2`: a transaction per thread, not per partition; each
transaction costs round trips to the transaction coordinator and its markers, and a task's
partitions one transaction each made every checkpoint several times slower).

A task's transactional id is its first partition's, `<group>-<topic>-<p>`, and whoever next owns
that partition starts a producer on it, which fences every earlier one and aborts its open
transaction: the member the group gives the partition (runtime.partition_owner fences the id of
every partition it takes, so a killed owner's transactions end at once), the query that starts
again after a failed task (the same), or a later task that begins with it. A zombie (a task of a
paused instance, a failed attempt's forerunner) can then neither write nor commit. The offsets go
into the transaction with the driver's group metadata (`send_offsets_to_transaction`): the broker
checks the member's generation (KIP-447), so a transaction begun before a rebalance cannot commit
after it, whichever partition its id names. A task first reads the group's committed offset of each
partition (read_committed: it waits for a pending transaction to end) and skips a range already
committed, so a task attempt Spark runs again after a success writes nothing twice.

A worker keeps its producers between tasks (initialising one costs round trips to the transaction
coordinator). A producer that another process of this machine has since started on the same id
(the task ran in the other Python worker) is fenced: a small file per id says which producer
started last, and a fenced one is replaced before its task begins. A producer is also replaced
when the group's generation changes, since its partitions may have been in another instance since.
"""

from __future__ import annotations

import hashlib
import pathlib
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from detectorkit.kafka import clients, offset_store
from detectorkit.kafka.sink import Sink
from detectorkit.kafka.worker_clients import WorkerClients

log = structlog.get_logger("detectorkit.transactions")

_FENCED = {KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH, KafkaError._FENCED}
_REBALANCED = {
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.FENCED_INSTANCE_ID,
    KafkaError.STALE_MEMBER_EPOCH,
}
_UNSUPPORTED = {KafkaError._UNSUPPORTED_FEATURE, KafkaError.UNSUPPORTED_VERSION, KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}


class TransactionError(RuntimeError):
    """A transaction could not commit; it was aborted (or its producer fenced) and the batch is planned again."""


def transactional_id(group: str, topic: str, partition: int) -> str:
    return f"{group}-{topic}-{partition}"


def generation_of(metadata: bytes) -> bytes:
    """The part of the group metadata that changes with each rebalance: all of it but the group name
    (opaque to us; compared, never parsed)."""
    return hashlib.sha256(metadata).digest()[:12]


class TransactionalSink(Sink):
    """A sink whose producer writes in transactions under one transactional id."""

    def __init__(self, producer_conf: Mapping[str, Any], tid: str, timeout_ms: int, init_timeout: float):
        super().__init__({**producer_conf, "transactional.id": tid, "transaction.timeout.ms": timeout_ms})
        self.transactional_id = tid
        self.token = uuid.uuid4().hex
        self.timeout_ms = timeout_ms
        self.open = False
        # Set once the broker said a newer producer holds the id (maybe in another instance, where
        # the file below cannot tell): the worker replaces it before its next task.
        self.fenced = False
        # The input partitions of the last task it wrote for, and when it began: what a task of its
        # worker claims again (`held`).
        self.partitions: frozenset[int] = frozenset()
        self.used = 0.0
        self.began = time.monotonic()
        try:
            # Fences every earlier producer with this id and aborts its open transaction.
            self.producer.init_transactions(init_timeout)
        except KafkaException as exc:
            self.close(0)
            raise TransactionError(describe(exc.args[0], tid, "starting the transactional producer")) from None
        _owner_file(tid).write_text(self.token)

    def close(self, timeout: float = 5.0) -> None:
        try:
            super().close(timeout)
        except KafkaException:  # a fenced producer's close reports the fencing once more: nothing is left to lose
            pass

    def current(self) -> bool:
        """False once another producer of this machine has started on the same id (this one is fenced)."""
        if self.fenced:
            return False
        try:
            return _owner_file(self.transactional_id).read_text() == self.token
        except FileNotFoundError:
            return False

    def begin(self) -> None:
        self._errors.clear()
        try:
            self.producer.begin_transaction()
        except KafkaException as exc:
            self._note(exc.args[0])
            raise TransactionError(describe(exc.args[0], self.transactional_id, "beginning a transaction")) from None
        self.open = True
        self.began = time.monotonic()

    def commit(self, offsets: list[TopicPartition], metadata: bytes, timeout: float, offsets_sent: Callable[[], None] | None = None) -> None:
        """The offsets into the transaction, then the transaction committed; TransactionError
        (after an abort where one is possible) when it cannot be."""
        deadline = time.monotonic() + timeout
        step = "adding the input offsets"
        try:
            self.producer.send_offsets_to_transaction(offsets, metadata, timeout)
            if offsets_sent is not None:
                offsets_sent()
            step = "committing"
            while True:
                try:
                    self.producer.commit_transaction(max(0.1, deadline - time.monotonic()))
                    break
                except KafkaException as exc:
                    if exc.args[0].retriable() and time.monotonic() < deadline:
                        continue
                    raise
        except KafkaException as exc:
            error = exc.args[0]
            self._note(error)
            if error.txn_requires_abort():
                self.abort(timeout)
            opened = time.monotonic() - self.began
            raise TransactionError(describe(error, self.transactional_id, step, opened, self.timeout_ms / 1000)) from None
        self.open = False

    def _note(self, error: KafkaError) -> None:
        if error.fatal() or error.code() in _FENCED:
            self.fenced = True

    def abort(self, timeout: float) -> None:
        if not self.open:
            return
        self.open = False
        try:
            self.producer.abort_transaction(timeout)
        except KafkaException as exc:  # fenced or timed out: the broker aborts it anyway (fencing, or the timeout)
            log.warning("aborting a transaction failed; the broker aborts it", transactional_id=self.transactional_id, error=exc.args[0].str())


def describe(error: KafkaError, tid: str, step: str, open_seconds: float | None = None, timeout_seconds: float | None = None) -> str:
    """One line for a transaction that failed, naming the cause a reader can act on."""
    code = error.code()
    fenced = code in _FENCED or (error.fatal() and "fenced" in error.str().lower())
    if open_seconds is not None and timeout_seconds is not None and open_seconds >= timeout_seconds and (fenced or code == KafkaError._TIMED_OUT):
        # The coordinator aborts a transaction open past its timeout and bumps the producer's
        # epoch: the producer then hears "fenced", though no newer writer exists.
        return (
            f"transaction {tid} timed out while {step}: open {open_seconds:.1f} s, past TRANSACTION_TIMEOUT_SECONDS "
            f"({timeout_seconds:g} s), so the broker aborted it and the batch is planned again; the timeout must exceed a task's longest batch"
        )
    if fenced:
        return (
            f"transaction {tid} fenced while {step}: a newer task (another Python worker, another instance, or a retried "
            "attempt) writes this partition now; nothing of this one becomes visible"
        )
    if code in _REBALANCED:
        return f"transaction {tid} aborted while {step}: the consumer group rebalanced during the batch ({error.name()}); the batch is planned again"
    if code == KafkaError._TIMED_OUT or "timed out" in error.str().lower() or "timeout" in error.str().lower():
        return f"transaction {tid} timed out while {step} ({error.str()}); TRANSACTION_TIMEOUT_SECONDS must exceed a task's longest batch"
    if code in _UNSUPPORTED:
        return (
            f"the broker refused transaction {tid} while {step} ({error.str()}): exactly-once needs "
            "a broker with transactions and the right to use this transactional id (PROCESSING_GUARANTEE=at-least-once runs without)"
        )
    return f"transaction {tid} failed while {step}: {error.str()}"


def _owner_file(tid: str) -> pathlib.Path:
    directory = pathlib.Path(tempfile.gettempdir()) / "detectorkit-transactions"
    directory.mkdir(exist_ok=True)
    return directory / hashlib.sha256(tid.encode()).hexdigest()[:32]


_producers = WorkerClients(close=lambda sink: sink.close(5.0))


def held(group: str, topic: str, metadata: bytes) -> set[int]:
    """The partitions of `topic` of this worker's last task with an unfenced producer of this
    generation: a task that runs them again reuses the producer, whose id is the first's
    (kafka.claims gives a worker's tasks those partitions first)."""
    prefix, suffix = f"{group}-{topic}-", f"/{generation_of(metadata).hex()}"
    sinks = [sink for k, sink in _producers.held().items() if k.startswith(prefix) and k.endswith(suffix) and sink.current()]
    return set(max(sinks, key=lambda sink: sink.used).partitions) if sinks else set()


_readers = WorkerClients(close=lambda consumer: consumer.close())


class TaskTransactions:
    """A task's transaction over every input partition it runs, begun at the start and after each commit."""

    def __init__(self, sink: TransactionalSink, topic: str, partitions: frozenset[int], metadata: bytes, timeout: float):
        self.sink = sink
        self.topic = topic
        # The partitions whose offsets it commits: those of the task not already committed.
        self.partitions = partitions
        self.metadata = metadata
        self.timeout = timeout

    def commit(self, ends: Mapping[int, int], offsets_sent: Callable[[], None] | None = None) -> None:
        """Every partition's next offset in `ends` and what was written since the last commit, at once."""
        offsets = [TopicPartition(self.topic, p, o) for p, o in sorted(ends.items()) if p in self.partitions]
        self.sink.commit(offsets, self.metadata, self.timeout, offsets_sent)

    def begin(self) -> None:
        self.sink.begin()

    def abort_open(self) -> None:
        self.sink.abort(self.timeout)


@contextmanager
def for_task(
    base_conf: Mapping[str, Any],
    producer_conf: Mapping[str, Any],
    group: str,
    topic: str,
    starts: Mapping[int, int],
    metadata: bytes,
    timeout_ms: int,
    timeout: float,
    idle_seconds: float | None = None,
    known: frozenset[int] = frozenset(),
) -> Iterator[TaskTransactions]:
    """The task's transaction over the partitions of `starts` (partition -> the offset it reads
    from). Each one's committed offset must be that start, else someone moved it on (another
    member, or an earlier attempt of this task that committed before it failed): TransactionError,
    and the slice is planned again from the group's offsets. `known`: partitions whose committed
    offset the caller knows is their start, because the task that committed it in this generation
    returned it (a slice continuing its predecessor). If they are all of them, the group's offsets
    are not read: right after that commit a stable read waits for the transaction's markers
    (UNSTABLE_OFFSET_COMMIT, then the client's backoff). An exception out of the block aborts the
    transaction if it is open."""
    generation = generation_of(metadata).hex()
    tid = transactional_id(group, topic, min(starts))
    began, created = time.monotonic(), []

    def create() -> TransactionalSink:
        created.append(tid)
        return TransactionalSink(producer_conf, tid, timeout_ms, timeout)

    with _producers.use(f"{tid}/{generation}", create, idle_seconds, valid=TransactionalSink.current) as sink:
        sink.partitions, sink.used = frozenset(starts), time.monotonic()
        # Only now, with every earlier producer of this id fenced and its transaction aborted, is
        # the committed offset stable: nothing can move it but this task.
        ready = time.monotonic()
        read = not set(starts) <= known
        committed = _committed(base_conf, group, topic, list(starts), timeout, idle_seconds) if read else dict(starts)
        log.debug(
            "transactions begin",
            partitions=sorted(starts),
            new_producers=created,
            read_committed=read,
            producers_seconds=round(ready - began, 4),
            committed_seconds=round(time.monotonic() - ready, 4),
        )
        moved = {p: (at, start) for p, start in starts.items() if (at := committed.get(p)) is not None and at != start}
        if moved:
            where = ", ".join(f"{topic}-{p} at {at}, planned from {start}" for p, (at, start) in sorted(moved.items()))
            raise TransactionError(
                f"the group's committed offsets are not where this slice starts ({where}): someone moved them; the slice is planned again"
            )
        txns = TaskTransactions(sink, topic, frozenset(starts), metadata, timeout)
        txns.begin()
        try:
            yield txns
        except BaseException:
            txns.abort_open()
            raise


def _committed(
    base_conf: Mapping[str, Any], group: str, topic: str, partitions: list[int], timeout: float, idle_seconds: float | None
) -> dict[int, int | None]:
    # read_committed: librdkafka asks for stable offsets (KIP-447), waiting out a pending transaction's.
    conf = clients.consumer(base_conf, group, **{"isolation.level": "read_committed", "enable.auto.commit": False})
    with _readers.use(clients.conf_key(conf), lambda: clients.new_consumer(conf), idle_seconds) as consumer:
        return offset_store.committed(consumer, topic, partitions, timeout)


def fence(producer_conf: Mapping[str, Any], group: str, topic: str, partitions: list[int], timeout_ms: int, timeout: float) -> None:
    """Start, then close, a producer on each partition's transactional id, all at once: the broker
    aborts what an earlier owner left open (a job killed mid-transaction). Until then its pending
    offsets hold every read_committed fetch of the group's offsets, until the transaction timeout
    (measured: a restart after a kill -9 between a task's offsets and its commit waited 30 s)."""
    if not partitions:
        return

    def start(p: int) -> TransactionalSink:
        return TransactionalSink(producer_conf, transactional_id(group, topic, p), timeout_ms, timeout)

    with ThreadPoolExecutor(max_workers=min(8, len(partitions))) as pool:
        sinks = list(pool.map(start, partitions))
        list(pool.map(lambda sink: sink.close(timeout), sinks))


def check_broker(producer_conf: Mapping[str, Any], group: str, timeout: float) -> None:
    """At start: the broker accepts transactions for this group's ids; TransactionError saying why not."""
    sink = TransactionalSink(producer_conf, f"{group}-probe", 10_000, timeout)
    sink.close(timeout)
