"""A slice's task cut to one read (runtime.slices._Loop): the records through the stage, the timers
of quiet partitions, then the last checkpoint, in the test's process, with the writer and stores a
test hands it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa

from detectorkit.runtime import checkpoint
from detectorkit.runtime.processing import fire_quiet, process_chunk, summary_batch
from detectorkit.runtime.task_context import PartitionSummary, TaskContext
from detectorkit.runtime.task_stores import TaskStores
from detectorkit.runtime.writers import Writer


def run_task(
    ctx: TaskContext, batches: Iterator[pa.RecordBatch], ends: dict[int, int], stores: TaskStores | None, writer: Writer
) -> Iterator[pa.RecordBatch]:
    """Yields the task's result, a row per partition, once its checkpoint is done; `ends`: each
    partition's position after `batches`."""
    summaries: dict[int, PartitionSummary] = {}
    process_chunk(ctx, batches, writer, stores, summaries)
    if stores is not None:
        fire_quiet(ctx, stores, writer, summaries)
        for p in stores.stores:
            summaries.setdefault(p, PartitionSummary())
    failed = checkpoint.TaskCheckpoint(ctx, writer, stores, summaries, ends).commit()
    lost = failed.partitions if failed is not None else frozenset()
    for p in lost:
        summaries.pop(p, None)
    for p, end in ends.items():
        if p not in lost:
            s = summaries.setdefault(p, PartitionSummary())
            s.next_offset = max(s.next_offset, end)
    if summaries or failed is not None:
        yield summary_batch(summaries, time.time() * 1000, None if failed is None else str(failed))
