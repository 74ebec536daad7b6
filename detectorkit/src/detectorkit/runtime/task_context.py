"""What a Spark task is handed and what it gathers: its context, and each partition's summary.

Every part of a task takes them: the processing (runtime.processing), its stores
(runtime.task_stores), its writer (runtime.writers) and its checkpoint (runtime.checkpoint).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from detectorkit.kafka.access import KafkaAccess
from detectorkit.runtime.stage import Stage
from detectorkit.state.changelog import StateContext


@dataclass(frozen=True)
class TaskContext:
    """Everything a task needs; pickled to the workers once per batch."""

    service: str
    stage: Stage
    config: Any
    access: KafkaAccess
    output_topic: str
    dlq_topic: str
    flush_timeout: float = 60.0
    # The job's log level and context (service, instance), for the JSON logs of its Python workers.
    log_level: str = "INFO"
    log_context: tuple[tuple[str, str], ...] = ()
    # Where a stage with keyed state finds it (None: the stage keeps none).
    state: StateContext | None = None
    # PROCESSING_GUARANTEE=exactly-once: each partition's writes and next offset in one transaction.
    exactly_once: bool = False
    transaction_timeout_ms: int = 30_000

    @property
    def producer_conf(self) -> dict[str, Any]:
        return self.access.producer_conf

    @property
    def client_idle_seconds(self) -> float:
        return self.access.client_idle_seconds


@dataclass
class PartitionSummary:
    next_offset: int = -1
    records: int = 0
    detections: int = 0
    dead_letters: Counter = field(default_factory=Counter)
    # Kafka timestamps (ms) of the records whose detections were written, for the latency histogram.
    detected_at: list[int] = field(default_factory=list)
    # Seconds from record to written, of detections already flushed (a slice's earlier checkpoints).
    latencies: list[float] = field(default_factory=list)
    timer_detections: int = 0  # detections of timers: no input record, no latency
    # A model detector's scores: bucket counts (metrics.registry.SCORE_BUCKETS) and their sum.
    score_counts: list[int] = field(default_factory=list)
    score_sum: float = 0.0
    state: dict[str, float] = field(default_factory=dict)
    # With a state flush interval: the input offset the changelog reflects, once this task wrote it.
    durable: int | None = None
    went_back: bool = False  # a slice's reader took it back to its start (kafka.position_reader)
