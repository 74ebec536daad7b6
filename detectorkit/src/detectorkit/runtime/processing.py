"""One Spark task's work: parse, detect, write detections and dead letters, report what was done.

It runs on the executors, in the Python worker of the job's source, which reads the task's planned
Kafka offset ranges itself (or in `mapInArrow` over records Spark delivers), so records never pass
through the driver. What it yields is a summary per Kafka partition, which the
driver collects to commit offsets and count.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import structlog

from detectorkit import logs
from detectorkit.kafka import claims, offset_store, transactions
from detectorkit.kafka import sink as sinks
from detectorkit.kafka.claims import Claim
from detectorkit.kafka.planning import PartitionRange
from detectorkit.kafka.range_reader import read_planned
from detectorkit.kafka.source import ranges_from_row
from detectorkit.kafka.source_options import SourceOptions
from detectorkit.kafka.transactions import TaskTransactions
from detectorkit.metrics import executors
from detectorkit.metrics.registry import bucket_counts
from detectorkit.runtime import checkpoint, crash_points, gc_tuning, task_result
from detectorkit.runtime.stage import Source
from detectorkit.runtime.task_context import PartitionSummary, Stores, TaskContext
from detectorkit.runtime.task_result import NO_PARTITION, TaskResult
from detectorkit.state import cache
from detectorkit.state.store import PartitionStore

_log = structlog.get_logger("detectorkit.state")


def _headers(ctx: TaskContext, reason: str, message: str, topic: str, partition: int, offset: int) -> list[tuple[str, bytes]]:
    return [
        ("error_type", reason.encode()),
        ("error_message", message.encode(errors="replace")),
        ("source_topic", topic.encode()),
        ("source_partition", str(partition).encode()),
        ("source_offset", str(offset).encode()),
        ("service", ctx.service.encode()),
    ]


def process_batch(ctx: TaskContext, batch: pa.RecordBatch, sink: sinks.Sink, summaries: dict[int, PartitionSummary]) -> None:
    """A stateless stage's records, as read (a stage with state goes by partition: `_process`)."""
    if batch.num_rows == 0:
        return
    _process_records(ctx, batch, sink, summaries, None, None)


def _by_partition(batches: Iterable[pa.RecordBatch]) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Each Kafka partition's records of `batches`, in the order read, as one record batch.

    One stable sort of the whole task's records by partition and one `take`, then zero-copy
    slices: a filter per partition per chunk and a concatenation per partition copied every
    record twice, at 0.3-0.5 µs a record (a fifth of what the state costs a record)."""
    chunks = [b for b in batches if b.num_rows]
    if not chunks:
        return
    batch = chunks[0] if len(chunks) == 1 else pa.Table.from_batches(chunks).combine_chunks().to_batches()[0]
    partitions = batch.column("partition").to_numpy()
    if (partitions == partitions[0]).all():
        yield int(partitions[0]), batch
        return
    order = np.argsort(partitions, kind="stable")
    ordered = batch.take(pa.array(order))
    partitions = partitions[order]
    starts = [0, *(np.flatnonzero(partitions[1:] != partitions[:-1]) + 1).tolist()]
    for start, end in zip(starts, [*starts[1:], len(partitions)], strict=True):
        yield int(partitions[start]), ordered.slice(start, end - start)


def _stamps_ms(batch: pa.RecordBatch) -> pa.Array:
    """The records' timestamps in ms, as Kafka has them (the source gives microseconds)."""
    return pc.divide(batch.column("timestamp").cast(pa.int64()), 1000)


def _process_records(
    ctx: TaskContext, batch: pa.RecordBatch, sink: sinks.Sink, summaries: dict[int, PartitionSummary], stores: Stores | None, partition: int | None
) -> None:
    partitions = batch.column("partition").to_numpy()
    offsets = batch.column("offset").to_numpy()
    topic = batch.column("topic")[0].as_py()
    # Only the rows that are written out are turned into Python objects.
    keys, values = batch.column("key"), batch.column("value")
    stamps = _stamps_ms(batch)

    def source(position: int) -> Source:
        key = keys[position].as_py()
        return Source(
            topic, int(partitions[position]), int(offsets[position]), stamps[position].as_py(), None if key is None else key.decode(errors="replace")
        )

    if stores is None:
        found, rejected = ctx.stage.run(values, ctx.config, source, ctx.service)
    else:
        store, tag = stores.stores[partition], stores.tags[partition]
        found, rejected = ctx.stage.run_keyed(values, keys, stamps.to_numpy(), ctx.config, source, ctx.service, store, tag, topic)
    _send_outputs(ctx, found, sink, summaries, keys, partitions, stamps, topic)
    for r in rejected:
        i = r.position
        p = int(partitions[i])
        headers = _headers(ctx, r.reason, r.message, topic, p, int(offsets[i]))
        sink.send(ctx.dlq_topic, keys[i].as_py(), values[i].as_py() or b"", headers)
        summaries.setdefault(p, PartitionSummary()).dead_letters[r.reason] += 1

    detections_in = Counter(int(partitions[out.position]) for out in found if out.position >= 0) if ctx.stage.counts_as_detection else Counter()
    for p in np.unique(partitions).tolist():
        mask = partitions == p
        s = summaries.setdefault(p, PartitionSummary())
        s.records += int(mask.sum())
        s.detections += detections_in.get(p, 0)
        s.next_offset = max(s.next_offset, int(offsets[mask].max()) + 1)


def _send_outputs(ctx: TaskContext, found, sink: sinks.Sink, summaries: dict[int, PartitionSummary], keys, partitions, stamps, topic: str) -> None:
    for out in found:
        if out.position < 0:  # a timer's: it names no input record
            if out.dead_letter is not None:
                reason, message, value = out.dead_letter
                sink.send(ctx.dlq_topic, out.key.encode(), value, _headers(ctx, reason, message, topic, out.partition, -1))
                summaries.setdefault(out.partition, PartitionSummary()).dead_letters[reason] += 1
                continue
            sink.send(ctx.output_topic, out.key.encode(), json.dumps(out.value, default=str).encode(), timestamp_ms=out.timestamp_ms)
            if ctx.stage.counts_as_detection:
                summaries.setdefault(out.partition, PartitionSummary()).timer_detections += 1
            continue
        p = int(partitions[out.position])
        key = keys[out.position].as_py() if out.key is None else out.key.encode()
        sink.send(ctx.output_topic, key, json.dumps(out.value, default=str).encode(), timestamp_ms=out.timestamp_ms)
        summaries.setdefault(p, PartitionSummary()).detected_at.append(stamps[out.position].as_py())


def process_planned(ctx: TaskContext, source: SourceOptions, ranges: list[PartitionRange], claim: Claim | None = None) -> Iterator[pa.RecordBatch]:
    """A task of the job's source (kafka.source.task_source): reads its planned ranges, in the
    source's own Python worker, and processes them there, so records never cross the JVM.

    The position it reports is each range's planned end, not its last record + 1: the offsets
    after the last record may hold transaction markers or aborted records, and a position short
    of them would leave lag that never reaches 0.

    With a `claim`, `ranges` are the whole batch's, and the task runs the share it claims
    (kafka.claims), the partitions whose stores this worker holds first."""
    _setup_worker(ctx)
    if claim is not None:
        held = cache.held(ctx.state, ctx.stage.state) if ctx.state is not None else set()
        current = cache.current(ctx.state, ctx.stage.state, {r.partition: (r.start, r.tick) for r in ranges}) if ctx.state is not None else None
        if ctx.exactly_once and source.group_metadata is not None:
            held |= transactions.held(source.group, source.topic, bytes.fromhex(source.group_metadata))
        ranges = claims.take(claim, ranges, held, current)
    if ctx.exactly_once:
        return _process_in_transactions(ctx, source, ranges)
    ends: dict[int, int] = {}
    stores = _open_stores(ctx, ranges, source) if ctx.state is not None else None
    return _process(ctx, _read(source, ranges, ends), ends, stores)


def _read(source: SourceOptions, ranges: list[PartitionRange], ends: dict[int, int]) -> Iterator[pa.RecordBatch]:
    reading = [r for r in ranges if r.size]
    if reading:
        yield from read_planned(source, reading)
    for r in ranges:  # read in full: only now may the position move to its end
        ends[r.partition] = max(ends.get(r.partition, -1), r.end)


def _process_in_transactions(
    ctx: TaskContext, source: SourceOptions, ranges: list[PartitionRange], before_commit: Callable[[], None] | None = None
) -> Iterator[pa.RecordBatch]:
    """`process_planned` with exactly-once (and `process_in_driver`, whose deliveries run as
    `before_commit`): the transactions begin before anything is read (their producers fence any
    earlier writer of the partitions, and the committed offsets are checked), then the stores are
    opened read_committed, and each partition's transaction commits its writes with its next
    offset. A range an earlier attempt already committed is skipped."""
    if source.group_metadata is None:
        raise ValueError("exactly-once needs the group's metadata in the source options")
    starts = {r.partition: (r.start, r.end) for r in ranges}
    metadata = bytes.fromhex(source.group_metadata)
    with transactions.for_task(
        source.client_conf,
        ctx.producer_conf,
        source.group,
        source.topic,
        starts,
        metadata,
        ctx.transaction_timeout_ms,
        ctx.flush_timeout,
        ctx.client_idle_seconds,
    ) as (txns, done):
        todo = [r for r in ranges if r.partition not in done]
        ends: dict[int, int] = {}
        stores = _open_stores(ctx, todo, source) if ctx.state is not None else None
        # What an earlier attempt committed is reported as read to its end, with nothing done now.
        skipped = {p: starts[p][1] for p in done}
        return iter(list(_process(ctx, _read(source, todo, ends), ends, stores, txns, skipped, before_commit)))


def _fire_idle(ctx: TaskContext, stores: Stores, sink_of: Callable[[int], sinks.Sink], summaries: dict[int, PartitionSummary]) -> None:
    """The timers of partitions with nothing to read in this batch (a tick of the source's planner)
    fire as the wall clock minus the grace passes them: no record says how far their event time got."""
    idle_ms = int(time.time() * 1000 - ctx.state.idle_grace_seconds * 1000)
    empty = pa.array([], pa.binary())
    for p in stores.idle:
        found, _ = ctx.stage.run_keyed(
            empty, empty, np.array([], "int64"), ctx.config, None, ctx.service, stores.stores[p], stores.tags[p], ctx.state.input_topic, idle_ms
        )
        _send_outputs(ctx, found, sink_of(p), summaries, None, None, None, ctx.state.input_topic)


def _open_stores(ctx: TaskContext, ranges: list[PartitionRange], source: SourceOptions | None = None) -> Stores:
    """Each partition's store, reflecting its input up to the range's start (the group's committed
    offset): restored from the changelog first when this worker's copy is not that. The changelog
    may reflect less (a flush interval, now or in the deployment before: the group's commit says
    how much, whatever the settings are now), and the records from there to the start are replayed
    into the store from the `source`; under exactly-once, inside the task's transactions."""
    idle = {r.partition for r in ranges if r.size == 0}
    wanted = {r.partition: (r.start, r.tick) for r in ranges}
    durable = None
    if source is not None:

        def durable(behind: list[int]) -> dict[int, int | None]:
            return offset_store.committed_durable(source.client_conf, source.group, source.topic, behind, ctx.state.timeout)

    opened = cache.open_stores(ctx.state, ctx.stage.state, wanted, durable)
    replays = [
        PartitionRange(r.topic, r.partition, opened[r.partition].replay_from, r.start) for r in ranges if opened[r.partition].replay_from is not None
    ]
    replayed = {}
    if replays:
        replayed = _replay(ctx, source, {p: o.store for p, o in opened.items()}, replays)
        for r in replays:
            store = opened[r.partition].store
            store.position, store.tick = wanted[r.partition]
            # Written at this task's end, whatever the interval: a partition that keeps changing
            # worker (a cluster's executors) would otherwise replay ever more, from a changelog
            # that never moves.
            store.flushed_at = float("-inf")
    for p, o in opened.items():
        if o.restored or o.seconds:
            _log.info(
                "state restored",
                partition=p,
                changelog_records=o.restored,
                keys=len(o.store),
                seconds=round(o.seconds, 3),
                rebuilt=o.rebuilt,
                worker_pid=os.getpid(),  # Spark runs a partition's tasks in whichever of its Python workers is free
            )
    stores = {p: o.store for p, o in opened.items()}
    tags = {r.partition: r.end for r in ranges}
    restored = {p: (o.restored, o.seconds) for p, o in opened.items()}
    return Stores(stores, tags, restored, idle, replayed, {r.partition for r in ranges if r.caught_up})


def _replay(ctx: TaskContext, source: SourceOptions, stores: dict[int, PartitionStore], ranges: list[PartitionRange]) -> dict[int, int]:
    """The records of `ranges` through the detector into the stores, their outputs dropped: they
    were written when the records were first read; only the state they made was not (it was
    waiting for the interval's flush in a worker that no longer runs the partition)."""
    began = time.monotonic()
    ends = {r.partition: r.end for r in ranges}
    read = Counter()
    for p, part in _by_partition(read_planned(source, ranges)):
        stamps = _stamps_ms(part).to_numpy()
        nowhere = partial(Source, source.topic, p, -1)  # never written: the outputs are dropped
        ctx.stage.run_keyed(part.column("value"), part.column("key"), stamps, ctx.config, nowhere, ctx.service, stores[p], ends[p], source.topic)
        read[p] += part.num_rows
    seconds = round(time.monotonic() - began, 3)
    for r in ranges:
        _log.info("state replayed", partition=r.partition, start=r.start, end=r.end, records=read[r.partition], seconds=seconds)
    return dict(read)


def _process(
    ctx: TaskContext,
    batches: Iterator[pa.RecordBatch],
    ends: dict[int, int],
    stores: Stores | None = None,
    txns: TaskTransactions | None = None,
    skipped: dict[int, int] | None = None,
    before_commit: Callable[[], None] | None = None,
) -> Iterator[pa.RecordBatch]:
    summaries: dict[int, PartitionSummary] = {}
    with sinks.for_worker(ctx.producer_conf, ctx.client_idle_seconds) if txns is None else nullcontext() as shared:
        sink_of = txns.of if txns is not None else lambda p: shared
        # The commit sequence's task steps (runtime.checkpoint): 1. the records.
        crash_points.reach("before-produce")
        if stores is None and txns is None:
            for batch in batches:
                process_batch(ctx, batch, shared, summaries)
                crash_points.reach("during-produce")
        else:
            # With state, a partition's records of the whole task go through the detector at once
            # (the reader hands them over in interleaved chunks of 20,000): a key the chunks share
            # is read, decoded, encoded and written once, not once a chunk. It holds the task's
            # records (MAX_RECORDS_PER_BATCH at most) in Arrow meanwhile. With exactly-once each
            # partition's records go to its own transaction, so they are split by partition too.
            for p, part in _by_partition(batches):
                _process_records(ctx, part, sink_of(p), summaries, stores, p)
                crash_points.reach("during-produce")
        if stores is not None:
            _fire_idle(ctx, stores, sink_of, summaries)  # 2. the timers of partitions with nothing to read
            for p in stores.stores:
                summaries.setdefault(p, PartitionSummary())
        failed: checkpoint.CommitsFailed | None = None
        if txns is None:
            checkpoint.finish_task(ctx, shared, stores, summaries)  # 3-5. flush, the state's changes, the stores kept
        else:
            try:
                checkpoint.finish_transactions(ctx, txns, stores, summaries, ends, before_commit)  # 3-7, a transaction per partition
            except checkpoint.CommitsFailed as exc:
                # The others committed: reported, they are counted once; raised, Spark would drop
                # them with the task, and no one would read their records again. No store is kept.
                failed = exc
                txns.abort_open()
    lost = failed.partitions if failed is not None else frozenset()
    for p in lost:
        summaries.pop(p, None)
    for p, end in [*ends.items(), *(skipped or {}).items()]:
        if p not in lost:
            s = summaries.setdefault(p, PartitionSummary())
            s.next_offset = max(s.next_offset, end)
    # Latency ends when the broker has acknowledged the detection: after the flush.
    if summaries or failed is not None:
        yield _summary_batch(summaries, time.time() * 1000, None if failed is None else str(failed))


def _summary_batch(summaries: dict[int, PartitionSummary], written_ms: float, error: str | None = None) -> pa.RecordBatch:
    # A task whose transactions all failed still reports why, in a row of no partition.
    items = sorted(summaries.items()) or [(NO_PARTITION, PartitionSummary())]
    results = []
    for i, (p, s) in enumerate(items):
        latencies = [(written_ms - ts) / 1000 for ts in s.detected_at]
        results.append(
            TaskResult(
                partition=p,
                next_offset=s.next_offset,
                records=s.records,
                detections=s.detections + s.timer_detections,
                dead_letters=dict(s.dead_letters),
                latency_counts=bucket_counts(latencies),
                latency_sum=float(sum(latencies)),
                processes=executors.report() if i == 0 else (),
                state=s.state or None,
                durable=s.durable,
                error=error if i == 0 else None,
            )
        )
    return task_result.to_batch(results)


def warm_worker(ctx: TaskContext, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A `mapInArrow` function that only starts a Python worker with what a task imports: this
    module (pandas, pyarrow, the Kafka clients), the stage's own modules (unpickling `ctx` imported
    them) and the job's logging; Spark reuses the worker for the job's tasks."""
    _setup_worker(ctx)
    yield from batches


def _setup_worker(ctx: TaskContext) -> None:
    """Once per Python worker, at its first task: the job's JSON logs, and the garbage collector
    set for batches (runtime.gc_tuning) once the imports are done."""
    logs.setup_once(ctx.log_level, **dict(ctx.log_context))
    gc_tuning.tune_once()


def process_in_driver(ctx: TaskContext, source: SourceOptions, frame) -> list[TaskResult]:
    """A batch of a stage that runs in the driver (`runs_in_driver`): the driver reads the planned
    ranges itself and runs the stage as a task would, its state's stores opened, written and kept
    as a task's (in the driver's process); then the stage's `after_flush` (deliveries) runs once
    the outputs are flushed and the state's changes written, before anything is committed. The
    summary rows are those the tasks would have given.

    The state is written before `after_flush` delivers, so a crash in between leaves the
    changelog holding changes (a notification marked as sent) for outputs never delivered. Nothing
    is lost: those changes are tagged with the batch's end, and the group's offsets stay at the
    batch's start until after `after_flush` (the commit sequence, runtime.checkpoint); whoever
    runs the batch again (this process, whose stores are then ahead of the start and read back, or
    the partition's next owner) reads the state as of the start, skipping them, and delivers again."""
    ranges = [r for row in frame.collect() for r in ranges_from_row(row.ranges)]
    if ctx.exactly_once:
        dead: dict[str, int] = {}
        summaries = list(_process_in_transactions(ctx, source, ranges, before_commit=lambda: dead.update(ctx.stage.after_flush(ctx))))
    else:
        ends = {r.partition: r.end for r in ranges}
        stores = _open_stores(ctx, ranges, source) if ctx.state is not None else None
        summaries = list(_process(ctx, read_planned(source, ranges) if ranges else iter(()), ends, stores))
        dead = ctx.stage.after_flush(ctx)
    results = task_result.rows_of(summaries)
    for result in results[:1]:  # dead letters of the delivery count with the batch, on any one row
        result.dead_letters = dict(Counter(result.dead_letters) + Counter(dead))
    return results
