"""Where a task's CPU goes (`python bench/model.py --parts`): the model benchmark's contenders run in
this process through a Spark task's work on its records (runtime.processing.process_chunk), without
Kafka, Spark or the JVM, one task's partitions in polls of the job's size, the state's changes sent
to a sink that keeps nothing once a flush interval's worth of records. Each part's CPU per record
is taken from a profile of the same run (cProfile: it adds to every Python call, so the parts add
up to more than a run without it, which is given too).

What it tells apart is what the job's figures cannot: how much of a windowed model's CPU is the
model, the JSON, the window's aggregates, the store, the changelog and the detections.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import time
import zlib
from types import SimpleNamespace

import common
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from detectorkit import Detector
from detectorkit.kafka.access import KafkaAccess
from detectorkit.kafka.range_reader import arrow_schema
from detectorkit.runtime import gc_tuning
from detectorkit.runtime.processing import process_chunk
from detectorkit.runtime.slices import STATEFUL_POLL_RECORDS
from detectorkit.runtime.stage import as_stage
from detectorkit.runtime.task_context import PartitionSummary, TaskContext
from detectorkit.runtime.task_stores import TaskStores
from detectorkit.state.store import PartitionStore

# A task's share of the benchmark's partitions on its cores, and the records a flush interval (5 s)
# takes at the windowed model's pace in the job.
TASK_PARTITIONS = common.PARTITIONS // common.CORES
FLUSH_RECORDS = 320_000
_PARSE = ("records.py", "parse_arrow")
_SCORE = ("models/scoring.py", "score")
# The window's aggregates: the arrays over a batch, or the compiled loop on the store's columns.
_WINDOW = (("windows/vectorised.py", "detect"), ("windows/compiled.py", "sliding_every_of"))
_STORE = (("state/store.py", "read"), ("state/store.py", "write"), ("state/slots.py", "lists_of"), ("state/store.py", "write_lists"))
_DETECTIONS = ("records.py", "detections_of")
# (part, the functions whose time it is, each with what it calls, less those of the second tuple).
PARTS = (
    ("parsing the JSON", (_PARSE,), ()),
    ("scoring with the model", (_SCORE,), ()),
    ("the window's aggregates", _WINDOW, ()),
    ("the store's reads and writes", _STORE, ()),
    ("the stateful run's own work (keys, frames, checks)", (("state/runner.py", "run_stateful"),), (_SCORE, *_WINDOW, *_STORE, _DETECTIONS)),
    ("the changelog's records", (("runtime/task_stores.py", "send_changes"),), ()),
    ("the detections as JSON", (_DETECTIONS, ("runtime/stage.py", "_outputs"), ("runtime/processing.py", "send_outputs")), ()),
)


def threshold(records: pd.DataFrame, _config) -> pd.DataFrame:
    """The template's default rule: an order above 1,000."""
    return records[records["amount"] > 1000]


THRESHOLD = Detector(name="threshold", detect=threshold, required_fields=("amount",))


class _Sink:
    """A producer that keeps nothing: what is sent is counted."""

    def __init__(self) -> None:
        self.sent = 0

    def send(self, topic, key, value, headers=None, partition=None, timestamp_ms=None) -> None:
        self.sent += 1

    def send_batch(self, topic, partition, items) -> None:
        self.sent += len(items)

    def send_all(self, topic, partition, items, headers) -> None:
        self.sent += len(items)

    def sink_of(self, _partition: int) -> _Sink:
        return self


def polls(values: list, times: list[int]) -> list[pa.RecordBatch]:
    """One task's records (its share of the partitions) as the polls a slice's task reads."""
    partition = np.array([zlib.crc32(key) % common.PARTITIONS for key, _, _ in values])
    mine = np.flatnonzero(partition < TASK_PARTITIONS)
    next_offset = [0] * TASK_PARTITIONS
    batches = []
    for lo in range(0, len(mine), STATEFUL_POLL_RECORDS):
        at = mine[lo : lo + STATEFUL_POLL_RECORDS].tolist()
        offsets = []
        for p in partition[at].tolist():
            offsets.append(next_offset[p])
            next_offset[p] += 1
        n = len(at)
        columns = [
            pa.array([values[i][0] for i in at], pa.binary()),
            pa.array([values[i][1] for i in at], pa.binary()),
            pa.array(["in"] * n),
            pa.array(partition[at], pa.int32()),
            pa.array(offsets, pa.int64()),
            pc.multiply(pa.array([times[i] for i in at], pa.int64()), 1000).cast(pa.timestamp("us", tz="UTC")),
        ]
        batches.append(pa.RecordBatch.from_arrays(columns, schema=arrow_schema()))
    return batches


def run(detector: Detector, batches: list[pa.RecordBatch], profile: cProfile.Profile | None = None) -> tuple[float, int]:
    """CPU seconds of the task's work on `batches`, and the records it sent (detections and changes)."""
    config = detector.load_config()
    detector = detector.configured(config)
    stateful = detector.state is not None
    state = SimpleNamespace(topic="parts.state", input_topic="in") if stateful else None
    ctx = TaskContext("parts", as_stage(detector), config, KafkaAccess({}, "parts"), "parts.out", "parts.dlq", state=state)
    parts = range(TASK_PARTITIONS)
    stores = None
    if stateful:
        stores = TaskStores({p: PartitionStore(detector.state, p) for p in parts}, dict.fromkeys(parts, 0), dict.fromkeys(parts, (0, 0.0)), set())
    summaries = {p: PartitionSummary() for p in parts}
    sink = _Sink()
    gc_tuning.tune_once()
    cpu = time.process_time()
    if profile is not None:
        profile.enable()
    since_flush = 0
    for n, batch in enumerate(batches, 1):
        partition, offset = batch.column("partition").to_numpy(), batch.column("offset").to_numpy()
        tags = {p: int(offset[partition == p].max()) + 1 for p in np.unique(partition).tolist()}
        process_chunk(ctx, [batch], sink, stores, summaries, tags)
        since_flush += batch.num_rows
        # Once a flush interval's worth of records, and at the last checkpoint.
        if stateful and (since_flush >= FLUSH_RECORDS or n == len(batches)):
            since_flush = 0
            for p in parts:
                stores.send_changes(ctx, sink, p, summaries)
    if profile is not None:
        profile.disable()
    return time.process_time() - cpu, sink.sent


def parts_of(detector: Detector, batches: list[pa.RecordBatch]) -> dict:
    """The task's CPU per record, in µs: by part, profiled (the profiler adds to each Python call),
    and in all, profiled and not."""
    records = sum(b.num_rows for b in batches)
    total, sent = run(detector, batches)
    # On the CPU's clock, as the totals are: on the wall's, a part that waited for a core (the
    # machine busy with something else) counted more than the run's whole CPU time.
    profile = cProfile.Profile(time.process_time)
    profiled, _ = run(detector, batches, profile)
    stats = pstats.Stats(profile).stats  # {(file, line, function): (calls, ..., total, cumulative, callers)}

    def seconds(functions) -> float:
        return sum(v[3] for (file, _, name), v in stats.items() if any(file.endswith(f) and name == fn for f, fn in functions))

    us = 1e6 / records
    by_part = {name: max(0.0, seconds(plus) - seconds(minus)) * us for name, plus, minus in PARTS}
    by_part["the rest (the poll's columns, the summaries)"] = profiled * us - sum(by_part.values())
    return {"records": records, "sent": sent, "us_per_record": total * us, "profiled_us_per_record": profiled * us, "parts": by_part}


def table(results: dict[str, dict]) -> str:
    names = list(results)
    lines = [
        "| part (µs per record) | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for part in next(iter(results.values()))["parts"]:
        lines.append(f"| {part} | " + " | ".join(f"{r['parts'][part]:.2f}" for r in results.values()) + " |")
    lines.append("| a task's work in all, profiled | " + " | ".join(f"{r['profiled_us_per_record']:.2f}" for r in results.values()) + " |")
    lines.append("| **a task's work in all, without the profiler** | " + " | ".join(f"**{r['us_per_record']:.2f}**" for r in results.values()) + " |")
    return "\n".join(lines)


def main(values: list, times: list[int], uris: dict[str, str]) -> str:
    """The table for the model benchmark's contenders (`uris`: each model's ONNX file)."""
    import scoring  # bench/contenders, on the path model.py sets, with the window BENCH_WINDOW_SECONDS says

    batches = polls(values, times)
    contenders = {
        "windowed model": (scoring.WINDOWED, uris["windowed"]),
        "one-field model": (scoring.WINDOWED_ONE_FIELD, uris["one_field"]),
        "fields-only model": (scoring.FIELDS_ONLY, uris["fields"]),
        "threshold": (THRESHOLD, None),
    }
    results = {}
    for name, (detector, uri) in contenders.items():
        if uri is not None:
            os.environ["DETECTOR_MODEL_URI"] = uri
        results[name] = parts_of(detector, batches)
        print(f"{name}: {results[name]['us_per_record']:.2f} µs per record, {results[name]['sent']:,} sent", flush=True)
    return table(results)
