"""What a Spark task is handed and what it hands on: its context, its partitions' state stores and
each partition's summary.

They are a module of their own because both halves of a task take them: the processing
(runtime.processing) and the commit sequence it ends with (runtime.checkpoint), which
runtime.processing calls and so cannot import.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from detectorkit.runtime.stage import Stage
from detectorkit.state.changelog import StateContext
from detectorkit.state.store import PartitionStore


@dataclass(frozen=True)
class TaskContext:
    """Everything a task needs; pickled to the workers once per batch."""

    service: str
    stage: Stage
    config: Any
    producer_conf: dict[str, Any]
    output_topic: str
    dlq_topic: str
    flush_timeout: float = 60.0
    # A worker's cached producer is closed after this long unused (see worker_clients).
    client_idle_seconds: float = 60.0
    # The job's log level and context (service, instance), for the JSON logs of its Python workers.
    log_level: str = "INFO"
    log_context: tuple[tuple[str, str], ...] = ()
    # Where a stage with keyed state finds it (None: the stage keeps none).
    state: StateContext | None = None
    # PROCESSING_GUARANTEE=exactly-once: each partition's writes and next offset in one transaction.
    exactly_once: bool = False
    transaction_timeout_ms: int = 30_000


@dataclass
class PartitionSummary:
    next_offset: int = -1
    records: int = 0
    detections: int = 0
    dead_letters: Counter = field(default_factory=Counter)
    # Kafka timestamps (ms) of the records whose detections were written, for the latency histogram.
    detected_at: list[int] = field(default_factory=list)
    timer_detections: int = 0  # detections of timers: no input record, no latency
    state: dict[str, float] = field(default_factory=dict)
    # With a state flush interval: the input offset the changelog reflects, once this task wrote it.
    durable: int | None = None


@dataclass
class Stores:
    """The state stores of a task's partitions, opened at its start, and each partition's tag: the
    end of its range, the input offset its changes reflect."""

    stores: dict[int, PartitionStore]
    tags: dict[int, int]
    restored: dict[int, tuple[int, float]]  # changelog records read to open it, and the seconds it took
    idle: set[int]  # partitions planned with nothing to read: a tick, for their timers
    replayed: dict[int, int] = field(default_factory=dict)  # input records replayed into the store to open it
    caught_up: set[int] = field(default_factory=set)  # partitions read to their end: nothing waits behind them
    # The changelog record each partition's changes ended with, (key, value, tag): where the store
    # expects it is checked by its next catch-up (runtime.checkpoint._keep, state.cache).
    last_written: dict[int, tuple[str, bytes | None, int | None]] = field(default_factory=dict)
