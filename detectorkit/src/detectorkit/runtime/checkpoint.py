"""A batch's commit sequence, in the order it runs: nothing is committed that is not written, and
no state change stands for an output that was not written (Quix Streams' `Checkpoint.commit`).

In each task (a Python worker; `runtime.processing._process`; for a stage that runs in the driver,
the driver, `processing.process_in_driver`):
  1. the records are processed: detections and dead letters sent as they are found;
  2. the timers of partitions with nothing to read fire (a tick of the source);
  3. the outputs are flushed (`finish_task`, from here on);
  4. the state's changes are sent, one record per key tagged with the batch's end, and flushed;
  5. the stores go back into the worker's cache, at the range's end and tick, each with where its
     changes should have landed in the changelog (checked by its next catch-up, state.cache); a
     failed task's are read back instead.
In the driver, once every task has returned (`runtime.batch_committer.BatchCommitter.finish`):
  6. a stage that runs in the driver delivers what it wrote (`Stage.after_flush`: the notifier's
     notifications): after 4, but a restore counts 4's changes only once 7 has committed them, so
     a crash during the deliveries delivers them again;
  7. the batch's end offsets are committed to the group, for the partitions this instance still owns;
  8. metrics, and the batch's log line.
With exactly-once (PROCESSING_GUARANTEE), 3 to 7 are one Kafka transaction per input partition,
committed by the task (`finish_transactions`): outputs, dead letters, the state's changes and the
partition's next offset become visible together or not at all, and the driver commits nothing.
A crash before 7 replays the batch from the committed offsets, with state read back as of them
(changes tagged past them are skipped): outputs may repeat, nothing is lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TYPE_CHECKING

import structlog

from detectorkit.kafka import sink as sinks
from detectorkit.kafka.transactions import TransactionError
from detectorkit.runtime import crash_points
from detectorkit.runtime.task_context import PartitionSummary, Stores, TaskContext
from detectorkit.state import cache
from detectorkit.state.codec import INPUT_OFFSET_HEADER, tag_of
from detectorkit.state.store import EVENT_TIME_KEY

_log = structlog.get_logger("detectorkit.transactions")

if TYPE_CHECKING:
    from detectorkit.kafka.transactions import TaskTransactions


def finish_task(ctx: TaskContext, sink: sinks.Sink, stores: Stores | None, summaries: dict[int, PartitionSummary]) -> None:
    """Steps 3 to 5 of a task (the records processed, the idle timers fired)."""
    # 3. the outputs.
    sink.flush(ctx.flush_timeout)
    if stores is None:
        crash_points.reach("before-commit")  # the driver's commit is next
        return
    # 4. the state's changes, in the changelog partition of the input partition: of the partitions
    #    whose flush is due (each changed key once since the last), the others' kept in the store.
    now = time.monotonic()
    due = {p for p in stores.stores if _flush_due(ctx, stores, p, now)}
    for p in stores.stores:
        _send_changes(ctx, sink, stores, p, summaries, send=p in due)
    if due:
        sink.flush(ctx.flush_timeout)
    for p in due:
        # The changelog now reflects the input up to the batch's end: with the offset, the driver
        # commits this (step 7), and a restore reads the changelog up to it and replays the rest.
        stores.stores[p].flushed_at = now
        summaries[p].durable = stores.tags[p]
    # 5. only now: a task that failed before here leaves no store behind.
    _keep(ctx, stores, summaries)
    crash_points.reach("before-commit")


def _flush_due(ctx: TaskContext, stores: Stores, p: int, now: float) -> bool:
    """Every batch without an interval; else once it has passed, and whenever the partition was
    read to its end: the interval only saves work while a backlog is read, and a partition that then
    goes quiet must not keep its changes for a replay from input that retention may delete. After
    a tick too: timers fired by the wall clock are not in the input, and a replay could not repeat them."""
    interval = ctx.state.flush_interval_seconds
    return interval <= 0 or p in stores.idle or p in stores.caught_up or now - stores.stores[p].flushed_at >= interval


def finish_transactions(
    ctx: TaskContext,
    txns: TaskTransactions,
    stores: Stores | None,
    summaries: dict[int, PartitionSummary],
    ends: dict[int, int],
    before_commit: Callable[[], None] | None = None,
) -> None:
    """Steps 3 to 7 with exactly-once: each partition's state changes join its transaction, then
    (a stage in the driver) the deliveries run, then each transaction commits the partition's
    outputs, changes and next offset together (kafka.transactions). A crash before a commit
    aborts what that partition wrote, and its replay delivers again (a delivery is at-least-once)."""
    for p in sorted(ends):
        if stores is not None and p in stores.stores:
            _send_changes(ctx, txns.of(p), stores, p, summaries)
    # 3-4 flushed, as without transactions: the deliveries come after what they deliver is written
    # (the commit would flush them too, but after the deliveries).
    for p in sorted(ends):
        txns.of(p).flush(ctx.flush_timeout)
    if ends:  # (a task that claimed nothing has nothing to commit)
        crash_points.reach("before-commit")
    if before_commit is not None:
        before_commit()
    began = time.monotonic()
    _commit_all(txns, ends)
    _log.debug("transactions committed", partitions=sorted(ends), seconds=round(time.monotonic() - began, 4))
    if stores is not None:
        _keep(ctx, stores, summaries)


class CommitsFailed(TransactionError):
    """Some of a task's transactions could not commit (a rebalance during the batch, a fenced
    producer) and were aborted; the others committed. The task reports what committed and the
    driver fails the batch after counting it: the failed partitions are read again from the
    group's offsets, and records whose transaction committed are counted once."""

    def __init__(self, message: str, partitions: set[int]):
        super().__init__(message)
        self.partitions = frozenset(partitions)


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


def _send_changes(ctx: TaskContext, sink: sinks.Sink, stores: Stores, p: int, summaries: dict[int, PartitionSummary], send: bool = True) -> None:
    """The partition's state changes to its changelog partition if `send`, and its state summary."""
    store, tag = stores.stores[p], stores.tags[p]
    expired = written = 0
    if send:
        expired = store.expire(tag)
        changes = store.take_changes()
        # A value carries its batch's offset (state.codec); a tombstone and the event time, in a header.
        event = [changes.pop()] if changes and changes[-1][0] == EVENT_TIME_KEY else []
        values = [c for c in changes if c[1] is not None]
        headed = [c for c in changes if c[1] is None] + event
        # The record sent last lands last (one producer, one partition, in order); send_batch may
        # reorder its own when the local queue fills, so the last value goes alone when it is last.
        if values:
            sink.send_batch(ctx.state.topic, p, values if headed else values[:-1])
        if headed:
            sink.send_all(ctx.state.topic, p, headed, [(INPUT_OFFSET_HEADER, str(tag).encode())])
            stores.last_written[p] = (headed[-1][0], headed[-1][1], tag)
        elif values:
            sink.send_all(ctx.state.topic, p, values[-1:], None)
            stores.last_written[p] = (values[-1][0], values[-1][1], tag_of(None, values[-1][1]))
        written = len(changes) + len(event)
    restored, seconds = stores.restored[p]
    summaries[p].state = {
        "keys": len(store),
        "bytes": store.bytes,
        "written": written,
        "expired": expired,
        "restored": restored,
        "restore_seconds": seconds,
        "replayed": stores.replayed.get(p, 0),
    }


def _keep(ctx: TaskContext, stores: Stores, summaries: dict[int, PartitionSummary]) -> None:
    for p, store in stores.stores.items():
        # It reflects the input to the range's end, at the range's tick (opening it set that), also
        # when the batch changed none of its keys: the next task, starting there, finds it current.
        store.position = stores.tags[p]
        written = summaries[p].state["written"]
        if written:
            # Its changes follow what it had read or written (only the partition's task writes its
            # changelog partition), so a later catch-up need not read them back: a partition still
            # moves between Python workers now and then (on a cluster, or as the claims of
            # kafka.claims even out), and each catch-up read both workers' changes before this. A
            # zombie's writes (at-least-once: a paused instance's task) may come between, so this
            # is a guess: the catch-up checks the last change is where it is expected (state.cache).
            last = store.changelog_offset + written - 1
            store.last_written = (last, *stores.last_written[p])
            # With exactly-once, the transaction's commit marker comes next.
            store.changelog_offset = last + 1 + int(ctx.exactly_once)
        cache.keep(ctx.state, store)
