"""One Spark task's work: parse, detect, write detections and dead letters, report what was done.

It runs in `mapInArrow` on the executors, over the Arrow batches of one Kafka partition range, so
records never pass through the driver. What it yields is a summary per Kafka partition, which the
driver collects to commit offsets and count.
"""

from __future__ import annotations

import json
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from detectorkit.detector import Detector
from detectorkit.kafka import sink as sinks
from detectorkit.kafka.source import SourceOptions, ranges_from_row, read_planned
from detectorkit.metrics.registry import bucket_counts
from detectorkit.runtime import records as rec

SUMMARY_SCHEMA = (
    "partition int, next_offset long, records long, detections long, dead_letters string, latency_counts string, latency_sum double"
)
_SUMMARY_ARROW = pa.schema([
    ("partition", pa.int32()),
    ("next_offset", pa.int64()),
    ("records", pa.int64()),
    ("detections", pa.int64()),
    ("dead_letters", pa.string()),
    ("latency_counts", pa.string()),
    ("latency_sum", pa.float64()),
])


@dataclass(frozen=True)
class TaskContext:
    """Everything a task needs; pickled to the workers once per batch."""

    service: str
    detector: Detector
    config: Any
    producer_conf: dict[str, Any]
    output_topic: str
    dlq_topic: str
    flush_timeout: float = 60.0
    # A worker's cached producer is closed after this long unused (see worker_clients).
    client_idle_seconds: float = 60.0


@dataclass
class PartitionSummary:
    next_offset: int = -1
    records: int = 0
    detections: int = 0
    dead_letters: Counter = field(default_factory=Counter)
    # Kafka timestamps (ms) of the records whose detections were written, for the latency histogram.
    detected_at: list[int] = field(default_factory=list)


def run_detector(ctx: TaskContext, frame: pd.DataFrame) -> tuple[list[tuple[int, dict]], list[rec.Rejected]]:
    """Detections as (record position, fields); records on which the detector raises are rejected.

    The detector runs on the whole batch; if it raises, the batch is split in halves and each half
    retried, down to single records, so only the records that make it fail go to the dead-letter
    topic. Splitting finds k bad records among n in about k*log2(n) calls instead of n.
    """
    if frame.empty:
        return [], []
    try:
        return _detections(ctx.detector.detect(frame, ctx.config), frame.index, single=len(frame) == 1), []
    except Exception as exc:  # noqa: BLE001 - any failure of user code is a dead letter, not a crash
        if len(frame) == 1:
            message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            return [], [rec.Rejected(int(frame.index[0]), rec.DETECTOR_ERROR, message[:2000])]
    middle = len(frame) // 2
    found_a, failed_a = run_detector(ctx, frame.iloc[:middle])
    found_b, failed_b = run_detector(ctx, frame.iloc[middle:])
    return found_a + found_b, failed_a + failed_b


def _detections(out: Any, index: pd.Index, single: bool = False) -> list[tuple[int, dict]]:
    if not isinstance(out, pd.DataFrame):
        raise TypeError(f"detect() must return a pandas DataFrame, not {type(out).__name__}")
    if out.empty:
        return []
    if not single and not out.index.isin(index).all():
        raise ValueError("detect() returned rows whose index is not the index of an input record")
    positions = [int(index[0])] * len(out) if single else [int(i) for i in out.index]
    return list(zip(positions, out.to_dict(orient="records"), strict=True))


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
    if batch.num_rows == 0:
        return
    frame, rejected = rec.parse_arrow(batch.column("value"), ctx.detector.required_fields)
    found, failed = run_detector(ctx, frame)
    partitions = batch.column("partition").to_numpy()
    offsets = batch.column("offset").to_numpy()
    topic = batch.column("topic")[0].as_py()
    # Only the rows that are written out are turned into Python objects.
    keys, values = batch.column("key"), batch.column("value")
    stamps = pc.divide(batch.column("timestamp").cast(pa.int64()), 1000)  # ms, as Kafka has them
    for position, fields in found:
        p = int(partitions[position])
        stamp = stamps[position].as_py()
        value = {
            "service": ctx.service,
            "detection": fields,
            "source": {"topic": topic, "partition": p, "offset": int(offsets[position]), "timestamp_ms": stamp},
        }
        sink.send(ctx.output_topic, keys[position].as_py(), json.dumps(value, default=str).encode())
        summaries.setdefault(p, PartitionSummary()).detected_at.append(stamp)
    for r in rejected + failed:
        i = r.position
        p = int(partitions[i])
        headers = _headers(ctx, r.reason, r.message, topic, p, int(offsets[i]))
        sink.send(ctx.dlq_topic, keys[i].as_py(), values[i].as_py() or b"", headers)
        summaries.setdefault(p, PartitionSummary()).dead_letters[r.reason] += 1

    detections_in = Counter(int(partitions[p]) for p, _ in found)
    for p in np.unique(partitions).tolist():
        mask = partitions == p
        s = summaries.setdefault(p, PartitionSummary())
        s.records += int(mask.sum())
        s.detections += detections_in.get(p, 0)
        s.next_offset = max(s.next_offset, int(offsets[mask].max()) + 1)


def process_partition(ctx: TaskContext, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The `mapInArrow` function over record batches: all batches of one task, then one summary
    row per Kafka partition. The position it reports is the last record read + 1."""
    return _process(ctx, batches, {})


def process_ranges(ctx: TaskContext, source: SourceOptions, tasks: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The `mapInArrow` function over the source's planned ranges: reads them here, in the same
    worker, and processes them as `process_partition` does, so records never cross the JVM.

    The position it reports is each range's planned end, not its last record + 1: the offsets
    after the last record may hold transaction markers or aborted records, and a position short
    of them would leave lag that never reaches 0."""
    ends: dict[int, int] = {}

    def batches():
        for task in tasks:
            for text in task.column("ranges").to_pylist():
                ranges = ranges_from_row(text)
                yield from read_planned(source, ranges)
                for r in ranges:  # read in full: only now may the position move to its end
                    ends[r.partition] = max(ends.get(r.partition, -1), r.end)

    return _process(ctx, batches(), ends)


def _process(ctx: TaskContext, batches: Iterator[pa.RecordBatch], ends: dict[int, int]) -> Iterator[pa.RecordBatch]:
    summaries: dict[int, PartitionSummary] = {}
    with sinks.for_worker(ctx.producer_conf, ctx.client_idle_seconds) as sink:
        for batch in batches:
            process_batch(ctx, batch, sink, summaries)
        sink.flush(ctx.flush_timeout)
    for p, end in ends.items():
        s = summaries.setdefault(p, PartitionSummary())
        s.next_offset = max(s.next_offset, end)
    # Latency ends when the broker has acknowledged the detection: after the flush.
    written_ms = time.time() * 1000
    if summaries:
        items = sorted(summaries.items())
        latencies = [[(written_ms - ts) / 1000 for ts in s.detected_at] for _, s in items]
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([p for p, _ in items], pa.int32()),
                pa.array([s.next_offset for _, s in items], pa.int64()),
                pa.array([s.records for _, s in items], pa.int64()),
                pa.array([s.detections for _, s in items], pa.int64()),
                pa.array([json.dumps(dict(s.dead_letters)) for _, s in items], pa.string()),
                pa.array([json.dumps(bucket_counts(values)) for values in latencies], pa.string()),
                pa.array([float(sum(values)) for values in latencies], pa.float64()),
            ],
            schema=_SUMMARY_ARROW,
        )
