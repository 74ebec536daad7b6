"""What a task tells the driver, one row per partition it wrote: its schema is declared once here,
and both Spark's (the source's) and Arrow's (the worker's) come from it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

# A partition of -1: the row of a task none of whose transactions committed, which only says why.
NO_PARTITION = -1

# (name, Arrow type, Spark SQL type); lists and maps travel as JSON text.
_COLUMNS = (
    ("partition", pa.int32(), "int"),
    ("next_offset", pa.int64(), "long"),
    ("records", pa.int64(), "long"),
    ("detections", pa.int64(), "long"),
    ("dead_letters", pa.string(), "string"),
    ("latency_counts", pa.string(), "string"),
    ("latency_sum", pa.float64(), "double"),
    # A model detector's scores: {"counts": bucket counts, "sum": their sum}.
    ("scores", pa.string(), "string"),
    # What the task's processes cost (metrics.executors), on its first row only.
    ("processes", pa.string(), "string"),
    # The partition's state store (keys, bytes, restore, changelog records), for a stage with state.
    ("state", pa.string(), "string"),
    # With a state flush interval: the input offset the partition's changelog reflects, once it was written.
    ("durable", pa.int64(), "long"),
    # A slice's reader took the partition back to its start (past its end: the topic created again).
    ("went_back", pa.bool_(), "boolean"),
    # Why some of the task's transactions did not commit (checkpoint.CommitsFailed), on its first
    # row only; the rows are the partitions that did. The driver fails the batch after counting them.
    ("error", pa.string(), "string"),
)
_JSON = {"dead_letters", "latency_counts", "processes", "state", "scores"}

SPARK_SCHEMA = ", ".join(f"{name} {sql}" for name, _, sql in _COLUMNS)
ARROW_SCHEMA = pa.schema([(name, arrow) for name, arrow, _ in _COLUMNS])


@dataclass
class TaskResult:
    partition: int
    next_offset: int = -1
    records: int = 0
    detections: int = 0
    dead_letters: Mapping[str, int] = field(default_factory=dict)
    latency_counts: Sequence[int] = ()
    latency_sum: float = 0.0
    scores: Mapping[str, Any] | None = None
    processes: Sequence[Mapping[str, Any]] = ()
    state: Mapping[str, float] | None = None
    durable: int | None = None
    went_back: bool = False
    error: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TaskResult:
        """From a collected row (`Row.asDict()`) or an Arrow batch's `to_pylist()` item."""
        values = {name: row[name] for name, _, _ in _COLUMNS}
        for name in _JSON:
            values[name] = json.loads(values[name]) if values[name] else None
        values["dead_letters"] = values["dead_letters"] or {}
        values["latency_counts"] = values["latency_counts"] or ()
        values["processes"] = values["processes"] or ()
        values["went_back"] = bool(values["went_back"])
        return cls(**values)


def to_batch(results: Sequence[TaskResult]) -> pa.RecordBatch:
    columns = {name: [] for name, _, _ in _COLUMNS}
    for result in results:
        for name in columns:
            value = getattr(result, name)
            if name in _JSON:
                value = json.dumps(value if not isinstance(value, tuple) else list(value)) if value is not None else None
            columns[name].append(value)
    return pa.RecordBatch.from_arrays([pa.array(columns[name], arrow) for name, arrow, _ in _COLUMNS], schema=ARROW_SCHEMA)


def rows_of(batches: Sequence[pa.RecordBatch]) -> list[TaskResult]:
    return [TaskResult.from_row(row) for batch in batches for row in batch.to_pylist()]
