"""What a slice's tasks read (runtime.slices): the input topic, how to reach it, and what the job
resolved at the query's start (the partitions it owns, where each starts, the group's metadata)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from detectorkit.kafka import broker_kind as kinds


@dataclass(frozen=True)
class SourceOptions:
    topic: str
    client_conf: dict[str, Any]
    group: str
    max_records_per_batch: int | None = None
    fail_on_data_loss: bool = True
    timeout: float = 30.0
    # The partitions this instance owns.
    partitions: list[int] | None = None
    # Where to start each partition, resolved by the group's member (the job).
    start_offsets: dict[int, int] | None = None
    # broker_kind.KAFKA or TANSU (AUTO: detected on first use); the job detects it once at start.
    broker_kind: str = kinds.AUTO
    # A worker's cached reading consumer is closed after this long unused (see worker_clients).
    client_idle_seconds: float = 60.0
    # Where a slice's tasks claim their partitions when they all run on this machine (kafka.claims):
    # set for a stateful stage in local mode, so a worker keeps the partitions whose stores it holds.
    claims_dir: str | None = None
    # With exactly-once: the driver's consumer group metadata (hex) at the query's start, with which
    # the tasks commit their offsets inside their transactions (kafka.transactions).
    group_metadata: str | None = None
