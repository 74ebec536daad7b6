"""The two ways a task writes, behind one interface: at-least-once (the worker's shared producer; the
driver commits the offsets after every task has flushed) and transactional (one transaction for the
task's input partitions, which commits their writes and next offsets together).

A writer is entered before anything is read (a transactional one fences every earlier writer of its
id first) and left when the task is done."""

from __future__ import annotations

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
    """A task's transaction could not commit (a rebalance during the slice, a fenced producer) and
    was aborted. The task reports its partitions with what committed before, and the driver reads
    them again from the group's offsets: records whose transaction committed are counted once."""

    def __init__(self, message: str, partitions: set[int]):
        super().__init__(message)
        self.partitions = frozenset(partitions)


class Writer(Protocol):
    def sink_of(self, partition: int) -> sinks.Sink: ...

    def flush_outputs(self) -> None:
        """Step 3: the outputs written, before the state's changes that stand for them."""

    def flush_changes(self, due: set[int]) -> None:
        """Step 4's end: the state's changes (of the partitions in `due`) written."""

    def commit(self, ends: dict[int, int]) -> CommitsFailed | None:
        """Step 5 where the task commits: each partition's next offset. None if it committed."""

    def begin_next(self) -> None:
        """After a commit that is not the task's last, what the next checkpoint writes into."""


class AtLeastOnceWriter(AbstractContextManager):
    """The worker's shared producer for the task; the driver commits the offsets after the tasks."""

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
    """One transaction for the task's input partitions (kafka.transactions): their outputs, dead
    letters, state changes and next offsets become visible together or not at all."""

    def __init__(self, ctx: TaskContext, source: SourceOptions, ranges: list[PartitionRange], known: frozenset[int] = frozenset()):
        if source.group_metadata is None:
            raise ValueError("exactly-once needs the group's metadata in the source options")
        self.ctx, self.source, self._known = ctx, source, known
        self._starts = {r.partition: r.start for r in ranges}
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
        self.txns = self._held.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._held.__exit__(*exc)

    def sink_of(self, partition: int) -> sinks.Sink:
        return self.txns.sink

    def flush_outputs(self) -> None:
        return None  # flushed with the changes, which join the same transaction first

    def flush_changes(self, due: set[int]) -> None:
        self.txns.sink.flush(self.ctx.flush_timeout)

    def begin_next(self) -> None:
        """After a commit, the next transaction (a slice commits many)."""
        self.txns.begin()

    def commit(self, ends: dict[int, int]) -> CommitsFailed | None:
        if not ends:
            return None
        try:
            self.txns.commit(ends, offsets_sent=lambda: crash_points.reach("during-commit"))
        except TransactionError as exc:
            # Reported, not raised: raised, Spark would drop the task's summaries with it, and the
            # driver would not know where its partitions are to be read again from.
            self.txns.abort_open()
            return CommitsFailed(str(exc), set(ends))
        return None
