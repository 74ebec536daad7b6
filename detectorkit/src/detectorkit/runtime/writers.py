"""The two ways a task writes, behind one interface: at-least-once (the worker's shared producer; the
driver commits the offsets after every task has flushed) and transactional (a transaction per input
partition, which commits the partition's writes and its next offset together).

A writer is entered before anything is read (a transactional one fences every earlier writer of its
partitions first) and left when the task is done."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import AbstractContextManager
from typing import Protocol

from detectorkit.kafka import sink as sinks
from detectorkit.kafka import transactions
from detectorkit.kafka.planning import PartitionRange
from detectorkit.kafka.source_options import SourceOptions
from detectorkit.kafka.transactions import TaskTransactions, TransactionError
from detectorkit.runtime import crash_points
from detectorkit.runtime.task_context import TaskContext


class CommitsFailed(TransactionError):
    """Some of a task's transactions could not commit (a rebalance during the batch, a fenced
    producer) and were aborted; the others committed. The task reports what committed and the
    driver fails the batch after counting it: the failed partitions are read again from the
    group's offsets, and records whose transaction committed are counted once."""

    def __init__(self, message: str, partitions: set[int]):
        super().__init__(message)
        self.partitions = frozenset(partitions)


class Writer(Protocol):
    # Each partition's records go to its own sink (its transaction), so they are split by partition.
    splits_by_partition: bool

    def sink_of(self, partition: int) -> sinks.Sink: ...

    def flush_outputs(self) -> None:
        """Step 3: the outputs written, before the state's changes that stand for them."""

    def flush_changes(self, due: set[int]) -> None:
        """Step 4's end: the state's changes (of the partitions in `due`) written."""

    def commit(self, ends: dict[int, int]) -> CommitsFailed | None:
        """Step 5 where the task commits: each partition's next offset. None if all committed."""

    def begin_next(self) -> None:
        """After a commit that is not the task's last, what the next checkpoint writes into."""


class AtLeastOnceWriter(AbstractContextManager):
    """The worker's shared producer for the task; the driver commits the offsets after the tasks."""

    splits_by_partition = False

    def __init__(self, ctx: TaskContext):
        self.ctx = ctx
        self._sink: sinks.Sink | None = None

    def __enter__(self) -> AtLeastOnceWriter:
        self._held = sinks.for_worker(self.ctx.producer_conf, self.ctx.client_idle_seconds)
        self._sink = self._held.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._held.__exit__(*exc)

    def sink_of(self, partition: int) -> sinks.Sink:
        return self._sink

    def flush_outputs(self) -> None:
        self._sink.flush(self.ctx.flush_timeout)

    def flush_changes(self, due: set[int]) -> None:
        if due:
            self._sink.flush(self.ctx.flush_timeout)

    def commit(self, ends: dict[int, int]) -> CommitsFailed | None:
        return None  # the driver's, once every task has flushed

    def begin_next(self) -> None:
        return None  # one producer, no transaction to open


class TransactionalWriter(AbstractContextManager):
    """A transaction per input partition (kafka.transactions): its outputs, dead letters, state
    changes and next offset become visible together or not at all."""

    splits_by_partition = True

    def __init__(self, ctx: TaskContext, source: SourceOptions, ranges: list[PartitionRange], known: frozenset[int] = frozenset()):
        if source.group_metadata is None:
            raise ValueError("exactly-once needs the group's metadata in the source options")
        self.ctx, self.source, self._known = ctx, source, known
        self._starts = {r.partition: (r.start, r.end) for r in ranges}
        self.txns: TaskTransactions | None = None

    def __enter__(self) -> TransactionalWriter:
        ctx, source = self.ctx, self.source
        self._held = transactions.for_task(
            source.client_conf,
            ctx.producer_conf,
            source.group,
            source.topic,
            self._starts,
            bytes.fromhex(source.group_metadata),
            ctx.transaction_timeout_ms,
            ctx.flush_timeout,
            ctx.client_idle_seconds,
            self._known,
        )
        self.txns, self._done = self._held.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._held.__exit__(*exc)

    def sink_of(self, partition: int) -> sinks.Sink:
        return self.txns.of(partition)

    def flush_outputs(self) -> None:
        return None  # flushed with the changes, which join the same transactions first

    def flush_changes(self, due: set[int]) -> None:
        # Every partition's, due or not: `flush_outputs` left each transaction's outputs to this flush.
        for p in sorted(self._starts):
            if p not in self._done:
                self.txns.of(p).flush(self.ctx.flush_timeout)

    def begin_next(self) -> None:
        """After a commit, the next transaction of each partition (a slice commits many)."""
        for p in sorted(self._starts):
            if p not in self._done:
                self.txns.of(p).begin()

    def commit(self, ends: dict[int, int]) -> CommitsFailed | None:
        try:
            _commit_all(self.txns, ends)
        except CommitsFailed as exc:
            # The others committed: reported, they are counted once; raised, Spark would drop
            # them with the task, and no one would read their records again.
            self.txns.abort_open()
            return exc
        return None


def _commit_all(txns: TaskTransactions, ends: dict[int, int]) -> None:
    """Each partition's transaction committed, all at once: a commit is round trips to the group
    and transaction coordinators (the offsets, then the end and its markers), which librdkafka
    waits out with the GIL released, and one after the other they were a tenth of a batch's time
    with exactly-once. The transactions are independent: one that fails leaves the others
    committed, and its partition is planned again (as when the commits ran in turn):
    CommitsFailed names the partitions whose transactions failed. Any other error is raised as is."""

    def commit(p: int) -> None:
        txns.commit(p, ends[p], offsets_sent=lambda: crash_points.reach("during-commit"))

    failures: dict[int, BaseException] = {}
    if len(ends) <= 1:
        for p in ends:
            try:
                commit(p)
            except TransactionError as exc:
                failures[p] = exc
    else:
        with ThreadPoolExecutor(max_workers=len(ends), thread_name_prefix="commit") as pool:
            futures = {pool.submit(commit, p): p for p in sorted(ends)}
            for n, future in enumerate(as_completed(futures), 1):
                error = future.exception()
                if error is not None:
                    failures[futures[future]] = error
                elif n < len(futures):
                    crash_points.reach("between-commits")  # one partition committed, another not yet
    for error in failures.values():
        if not isinstance(error, TransactionError):
            raise error
    if failures:
        raise CommitsFailed(str(failures[min(failures)]), set(failures))
