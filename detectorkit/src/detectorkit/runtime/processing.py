"""A slice's task's work on what it read (runtime.slices): parse, detect, write detections and dead
letters, and sum up what was done.

It runs on the executors, in a Python worker that reads the task's Kafka partitions itself, so
records never pass through the driver. Here: which partitions a task takes (`take_claimed`), a chunk
of records through the stage (`process_chunk`), the timers of quiet partitions (`fire_quiet`), and
the summary per Kafka partition that the driver collects to commit offsets and count
(`summary_batch`, `take_counts`).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator
from functools import partial

import numpy as np
import pyarrow as pa
import structlog

from detectorkit import logs
from detectorkit.kafka import claims, transactions
from detectorkit.kafka import sink as sinks
from detectorkit.kafka.claims import Claim
from detectorkit.kafka.planning import PartitionRange
from detectorkit.kafka.source_options import SourceOptions
from detectorkit.metrics import executors
from detectorkit.metrics.registry import bucket_counts, merged_counts
from detectorkit.records import dead_letter_headers, detection_json
from detectorkit.runtime import crash_points, gc_tuning, task_result
from detectorkit.runtime.batches import by_partition, stamps_ms
from detectorkit.runtime.stage import KeyedBatch, Sources
from detectorkit.runtime.task_context import PartitionSummary, TaskContext
from detectorkit.runtime.task_result import NO_PARTITION, TaskResult
from detectorkit.runtime.task_stores import TaskStores
from detectorkit.runtime.writers import Writer
from detectorkit.state import cache

_log = structlog.get_logger("detectorkit.state")


def process_batch(ctx: TaskContext, batch: pa.RecordBatch, sink: sinks.Sink, summaries: dict[int, PartitionSummary]) -> None:
    """A stateless stage's records, as read (a stage with state goes by partition: `process_chunk`)."""
    if batch.num_rows == 0:
        return
    process_records(ctx, batch, sink, summaries, None, None)


def process_records(
    ctx: TaskContext,
    batch: pa.RecordBatch,
    sink: sinks.Sink,
    summaries: dict[int, PartitionSummary],
    stores: TaskStores | None,
    partition: int | None,
) -> None:
    partitions = batch.column("partition").to_numpy()
    offsets = batch.column("offset").to_numpy()
    topic = batch.column("topic")[0].as_py()
    # Only the rows that are written out are turned into Python objects.
    keys, values = batch.column("key"), batch.column("value")
    stamps = stamps_ms(batch).to_numpy()

    source = Sources(topic, partitions, offsets, stamps, keys)
    if stores is None:
        found, rejected = ctx.stage.run(values, ctx.config, source, ctx.service)
    else:
        keyed = KeyedBatch(values, keys, stamps, source, stores.stores[partition], stores.tags[partition], topic)
        found, rejected = ctx.stage.run_keyed(keyed, ctx.config, ctx.service)
    send_outputs(ctx, found, sink, summaries, keys, partitions, stamps, topic)
    _take_scores(ctx, summaries.setdefault(int(partitions[0]), PartitionSummary()))
    for r in rejected:
        i = r.position
        p = int(partitions[i])
        headers = dead_letter_headers(ctx.service, r.reason, r.message, topic, p, int(offsets[i]))
        sink.send(ctx.dlq_topic, keys[i].as_py(), values[i].as_py() or b"", headers)
        summaries.setdefault(p, PartitionSummary()).dead_letters[r.reason] += 1

    for p in np.unique(partitions).tolist():
        mask = partitions == p
        s = summaries.setdefault(p, PartitionSummary())
        s.records += int(mask.sum())
        s.next_offset = max(s.next_offset, int(offsets[mask].max()) + 1)


def _take_scores(ctx: TaskContext, summary: PartitionSummary) -> None:
    """A model detector's scores of the call, onto a summary of its partitions (they are summed)."""
    taken = ctx.stage.take_scores()
    if taken is None:
        return
    counts, total = taken
    summary.score_counts = merged_counts(summary.score_counts, counts)
    summary.score_sum += total


def send_outputs(ctx: TaskContext, found, sink: sinks.Sink, summaries: dict[int, PartitionSummary], keys, partitions, stamps, topic: str) -> None:
    # The input records' keys, taken from the column at once, in the order of the outputs that cite one.
    cited = [out.position for out in found if out.position >= 0]
    record_keys = iter(keys.take(pa.array(cited, pa.int64())).to_pylist() if cited else ())
    send, output_topic = sink.send, ctx.output_topic
    for out in found:
        if out.position < 0:  # a timer's: it names no input record
            if out.dead_letter is not None:
                reason, message, value = out.dead_letter
                sink.send(ctx.dlq_topic, out.key.encode(), value, dead_letter_headers(ctx.service, reason, message, topic, out.partition, -1))
                summaries.setdefault(out.partition, PartitionSummary()).dead_letters[reason] += 1
                continue
            sink.send(ctx.output_topic, out.key.encode(), detection_json(out.value), timestamp_ms=out.timestamp_ms)
            if ctx.stage.counts_as_detection:
                summaries.setdefault(out.partition, PartitionSummary()).timer_detections += 1
            continue
        record_key = next(record_keys)
        key = record_key if out.key is None else out.key.encode()
        value = out.raw if out.raw is not None else detection_json(out.value)
        send(output_topic, key, value, timestamp_ms=out.timestamp_ms)
    if cited:
        # Each partition's detections of records, counted, and their records' timestamps (for the
        # latency histogram), at once.
        at = np.asarray(cited, dtype=np.int64)
        of = partitions[at]
        for p in np.unique(of).tolist():
            mine = at[of == p]
            s = summaries.setdefault(p, PartitionSummary())
            s.detected_at.extend(stamps[mine].tolist())
            if ctx.stage.counts_as_detection:
                s.detections += len(mine)


def take_claimed(ctx: TaskContext, source: SourceOptions, claim: Claim, ranges: list[PartitionRange]) -> list[PartitionRange]:
    """The share of `ranges` a task's `claim` takes (kafka.claims): first the partitions whose
    stores, or whose open transactions, this worker holds."""
    held = cache.held(ctx.state, ctx.stage.state) if ctx.state is not None else set()
    current = cache.current(ctx.state, ctx.stage.state, {r.partition: (r.start, r.tick) for r in ranges}) if ctx.state is not None else None
    if ctx.exactly_once and source.group_metadata is not None:
        held |= transactions.held(source.group, source.topic, bytes.fromhex(source.group_metadata))
    return claims.take(claim, ranges, held, current)


def process_chunk(
    ctx: TaskContext,
    batches: Iterable[pa.RecordBatch],
    writer: Writer,
    stores: TaskStores | None,
    summaries: dict[int, PartitionSummary],
    tags: dict[int, int] | None = None,
) -> None:
    """Step 1: records through the stage, their detections and dead letters sent. A stateless
    stage's go as read; with state each partition's records of `batches` go at once, so a key they
    share is read, decoded, encoded and written once. `tags`: each partition's position after
    them, which its state's changes stand for."""
    crash_points.reach("before-produce")
    if stores is None:
        for batch in batches:
            process_batch(ctx, batch, writer.sink_of(-1), summaries)
            crash_points.reach("during-produce")
        return
    for p, part in by_partition(batches):
        if stores is not None and tags is not None:
            stores.tags[p] = tags[p]
        process_records(ctx, part, writer.sink_of(p), summaries, stores, p)
        crash_points.reach("during-produce")


def fire_quiet(ctx: TaskContext, stores: TaskStores, writer: Writer, summaries: dict[int, PartitionSummary]) -> None:
    """Step 2: the timers of the partitions with nothing to read (`stores.idle`), their detections sent."""
    for p, found in stores.fire_idle(ctx):
        send_outputs(ctx, found, writer.sink_of(p), summaries, None, None, None, ctx.state.input_topic)


def summary_batch(summaries: dict[int, PartitionSummary], written_ms: float, error: str | None = None) -> pa.RecordBatch:
    # A task whose transactions all failed still reports why, in a row of no partition.
    items = sorted(summaries.items()) or [(NO_PARTITION, PartitionSummary())]
    results = []
    for i, (p, s) in enumerate(items):
        latencies = s.latencies + [(written_ms - ts) / 1000 for ts in s.detected_at]
        results.append(
            TaskResult(
                partition=p,
                next_offset=s.next_offset,
                records=s.records,
                detections=s.detections + s.timer_detections,
                dead_letters=dict(s.dead_letters),
                latency_counts=bucket_counts(latencies),
                latency_sum=float(sum(latencies)),
                scores={"counts": s.score_counts, "sum": s.score_sum} if s.score_counts else None,
                processes=executors.report() if i == 0 else (),
                state=s.state or None,
                durable=s.durable,
                went_back=s.went_back,
                error=error if i == 0 else None,
            )
        )
    return task_result.to_batch(results)


def take_counts(summaries: dict[int, PartitionSummary]) -> dict:
    """What the summaries counted since this was last called, taken out of them: a slice's task
    reports it at each checkpoint (its detections' latencies are then written), and its end
    summary (summary_batch) carries only the rest."""
    latencies = [x for s in summaries.values() for x in s.latencies]
    dead = Counter()
    for s in summaries.values():
        dead.update(s.dead_letters)
    counts = {
        "records": sum(s.records for s in summaries.values()),
        "detections": sum(s.detections + s.timer_detections for s in summaries.values()),
        "dead_letters": dict(dead),
        "latency_counts": bucket_counts(latencies),
        "latency_sum": float(sum(latencies)),
        # Each partition's store as its last checkpoint left it (keys, bytes, what it wrote).
        "state": {str(p): s.state for p, s in summaries.items() if s.state},
    }
    counts["score_counts"] = merged_counts(*(s.score_counts for s in summaries.values()))
    counts["score_sum"] = float(sum(s.score_sum for s in summaries.values()))
    for s in summaries.values():
        s.records = s.detections = s.timer_detections = 0
        s.dead_letters.clear()
        s.latencies.clear()
        s.state = {}
        s.score_counts, s.score_sum = [], 0.0
    return counts


def warm_workers(spark, ctx: TaskContext) -> list[int]:
    """Start the session's Python workers with what a task imports: this module (pandas, pyarrow,
    the Kafka clients), the stage's own modules (unpickling `ctx` imports them) and the job's
    logging. Returns the process ids of the daemons that forked them.

    An RDD job, not a DataFrame one: it reaches the workers without the planning that a session's
    first DataFrame job pays, so the daemon's imports start that much sooner, beside the first
    slice's planning instead of before it. Spark gives the slices' SQL jobs the same workers only
    when both kinds of job hand their workers the same environment (runtime.spark)."""
    sc = spark.sparkContext
    n = max(1, sc.defaultParallelism)
    return sorted(set(sc.parallelize(range(n), n).mapPartitions(partial(warm_worker, ctx)).collect()))


def warm_worker(ctx: TaskContext, _rows: Iterable[int]) -> Iterator[int]:
    """A warm-up task: the worker set up for the job; yields the daemon that forked it."""
    setup_worker(ctx)
    yield os.getppid()


def setup_worker(ctx: TaskContext) -> None:
    """Once per Python worker, at its first task: the job's JSON logs, the stage warmed (what its
    calls load once), and the garbage collector set for batches (runtime.gc_tuning) once the
    imports are done."""
    logs.setup_once(ctx.log_level, **dict(ctx.log_context))
    if ctx.stage.name not in _WARMED:
        _WARMED.add(ctx.stage.name)
        try:
            ctx.stage.warm()
        except Exception:  # noqa: BLE001, S110 - only an optimisation: the first batch loads it and says what fails
            pass
    gc_tuning.tune_once()


# The stages this process has warmed (a worker runs one job's stage, its tasks many times).
_WARMED: set[str] = set()
