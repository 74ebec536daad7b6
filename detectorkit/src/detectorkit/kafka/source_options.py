"""What a slice's tasks read (runtime.slices): the input topic, how to reach it, and what the job
resolved at the query's start (the partitions it owns, where each starts, the group's metadata)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from detectorkit.kafka.access import KafkaAccess


@dataclass(frozen=True)
class SourceOptions:
    topic: str
    access: KafkaAccess
    max_records_per_batch: int | None = None
    fail_on_data_loss: bool = True
    # The partitions this instance owns.
    partitions: list[int] | None = None
    # Where to start each partition, resolved by the group's member (the job).
    start_offsets: dict[int, int] | None = None
    # Where a slice's tasks claim their partitions when they all run on this machine (kafka.claims):
    # set for a stateful stage in local mode, so a worker keeps the partitions whose stores it holds.
    claims_dir: str | None = None
    # With exactly-once: the driver's consumer group metadata (hex) at the query's start, with which
    # the tasks commit their offsets inside their transactions (kafka.transactions).
    group_metadata: str | None = None

    @property
    def client_conf(self) -> dict[str, Any]:
        return self.access.client_conf

    @property
    def group(self) -> str:
        return self.access.group

    @property
    def timeout(self) -> float:
        return self.access.timeout

    @property
    def client_idle_seconds(self) -> float:
        return self.access.client_idle_seconds

    @property
    def broker_kind(self) -> str:
        return self.access.broker_kind
