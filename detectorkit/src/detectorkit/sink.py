"""The Kafka sink: one idempotent producer per worker process, flushed at the end of every task.

Any delivery error fails the task, and with it the batch, so the batch's offsets are never
committed and its records are read again on restart (at-least-once).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaException, Producer


class DeliveryError(RuntimeError):
    """Records could not be written to Kafka."""


class Sink:
    def __init__(self, producer_conf: Mapping[str, Any]):
        self._errors: list[str] = []
        self.producer = Producer({
            **producer_conf,
            # Only failures call back into Python: a callback per record would cost more than the write.
            "delivery.report.only.error": True,
            "on_delivery": self._on_delivery,
        })

    def _on_delivery(self, error, message) -> None:
        if error is not None:
            self._errors.append(f"{message.topic()}: {error.str()}")

    def send(self, topic: str, key: bytes | None, value: bytes, headers: Sequence[tuple[str, bytes]] | None = None) -> None:
        while True:
            try:
                self.producer.produce(topic, value=value, key=key, headers=headers)
                return
            except BufferError:
                self.producer.poll(0.05)  # local queue full: let deliveries drain

    def flush(self, timeout: float) -> None:
        """Wait for every record sent so far; DeliveryError if any could not be written."""
        try:
            remaining = self.producer.flush(timeout)
        except KafkaException as exc:
            raise DeliveryError(f"flushing the producer failed: {exc}") from exc
        errors, self._errors = self._errors, []
        if remaining:
            errors.append(f"{remaining} record(s) not delivered within {timeout:.0f} s")
        if errors:
            raise DeliveryError(f"{len(errors)} delivery error(s), first: {errors[0]}")


_sinks: dict[str, Sink] = {}


def for_worker(producer_conf: Mapping[str, Any]) -> Sink:
    key = json.dumps(producer_conf, sort_keys=True, default=str)
    sink = _sinks.get(key)
    if sink is None:
        sink = _sinks[key] = Sink(producer_conf)
    return sink


def discard(producer_conf: Mapping[str, Any]) -> None:
    """Forget a worker's producer after a failure: an idempotent producer may be left fenced."""
    _sinks.pop(json.dumps(producer_conf, sort_keys=True, default=str), None)
