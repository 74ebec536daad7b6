"""A task's commit sequence, in the order it runs: nothing is committed that is not written, and
no state change stands for an output that was not written (Quix Streams' `Checkpoint.commit`).

In each slice's task (a Python worker, runtime.slices), steps 1 and 2 as records and ticks come,
steps 3 to 6 (`TaskCheckpoint.commit`) at each of its checkpoints:
  1. the records are processed: detections and dead letters sent as they are found;
  2. the timers of partitions with nothing to read fire (a tick);
  3. the outputs are flushed;
  4. the state's changes are sent, one record per key tagged with the input position they stand
     for, and flushed;
  5. the partitions' next offsets are committed. With exactly-once (PROCESSING_GUARANTEE) by the
     task: 3 to 5 are one Kafka transaction for the task's input partitions (runtime.writers), so
     outputs, dead letters, the state's changes and the partitions' next offsets become visible
     together or not at all. At-least-once by the driver, with the positions the tasks report
     (`runtime.driver_checkpoint.DriverCheckpoint`), for the partitions this instance still owns;
  6. the stores go back into the worker's cache, each with where its changes should have landed in
     the changelog (checked by its next catch-up, state.cache): after 5, so a task that failed
     leaves none behind and its stores are read back instead;
  7. in the driver: metrics, and the slice's log line.
A crash before 5 replays what was read since from the committed offsets, with state read back as of them
(changes tagged past them are skipped): outputs may repeat, nothing is lost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from detectorkit.runtime import crash_points
from detectorkit.runtime.task_context import PartitionSummary, TaskContext
from detectorkit.runtime.task_stores import TaskStores
from detectorkit.runtime.writers import CommitsFailed, Writer

__all__ = ["CommitsFailed", "TaskCheckpoint"]


@dataclass
class TaskCheckpoint:
    """The end of a task, once its records are processed and its idle timers fired."""

    ctx: TaskContext
    writer: Writer
    stores: TaskStores | None
    summaries: dict[int, PartitionSummary]
    ends: dict[int, int]  # each partition's next offset: its range's end, read in full

    def commit(self) -> CommitsFailed | None:
        """Steps 3 to 6 of the task, in order; what failed to commit, if some transactions did."""
        ctx, writer, stores, summaries = self.ctx, self.writer, self.stores, self.summaries
        # 3. the outputs.
        writer.flush_outputs()
        # 4. the state's changes, in the changelog partition of the input partition: of the partitions
        #    whose flush is due (each changed key once since the last), the others' kept in the store.
        due: set[int] = set()
        if stores is not None:
            now = time.monotonic()
            due = {p for p in stores.stores if stores.flush_due(ctx, p, now)}
            for p in stores.stores:
                stores.send_changes(ctx, writer.sink_of(p), p, summaries, send=p in due)
        writer.flush_changes(due)
        if stores is not None:
            for p in due:
                # The changelog now reflects the input up to the batch's end: with the offset, the
                # driver commits this (step 5), and a restore reads it up to there and replays the rest.
                stores.stores[p].flushed_at = now
                summaries[p].durable = stores.tags[p]
        if self.ends:  # (a task that claimed nothing has nothing to commit)
            crash_points.reach("before-commit")
        # 5. where the task commits (exactly-once); else the driver does, after every task.
        failed = writer.commit(self.ends)
        # 6. only now: a task that failed before here leaves no store behind.
        if stores is not None and failed is None:
            stores.keep(ctx, summaries)
        return failed
