"""How a job's workers reach Kafka, read once from the settings: what its tasks read with
(kafka.source_options), write with (runtime.task_context) and restore their state with
(state.changelog.StateContext) all hold this one object, pickled to the workers with them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from detectorkit.kafka import broker_kind as kinds
from detectorkit.kafka import clients


@dataclass(frozen=True)
class KafkaAccess:
    # librdkafka's settings every client starts from: the brokers, security, KAFKA_OPTIONS.
    client_conf: dict[str, Any]
    # The service's consumer group, which every consumer of its tasks names (a restore's too: the
    # Read right on it is one a user with only the service's rights has; they only assign).
    group: str
    timeout: float = 30.0
    # A worker's cached client is closed after this long unused (kafka.worker_clients).
    client_idle_seconds: float = 60.0
    # broker_kind.KAFKA or TANSU (AUTO: detected on first use); the job detects it once at start.
    broker_kind: str = kinds.AUTO

    @property
    def producer_conf(self) -> dict[str, Any]:
        return clients.producer(self.client_conf)
