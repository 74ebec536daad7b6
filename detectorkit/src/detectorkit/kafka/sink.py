"""The Kafka sink: one idempotent producer per worker process, flushed at the end of every task.

Any delivery error fails the task, and with it the batch, so the batch's offsets are never
committed and its records are read again on restart (at-least-once). A producer unused for a while
is closed (see `worker_clients`); after a failure it is dropped, since it may be left fenced.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from detectorkit.kafka import clients
from detectorkit.kafka.worker_clients import WorkerClients


class DeliveryError(RuntimeError):
    """Records could not be written to Kafka."""


class Sink:
    def __init__(self, producer_conf: Mapping[str, Any]):
        self._errors: list[str] = []
        self.producer = clients.new_producer(
            {
                **producer_conf,
                # Only failures call back into Python: a callback per record would cost more than the write.
                "delivery.report.only.error": True,
                "on_delivery": self._on_delivery,
            }
        )

    def _on_delivery(self, error, message) -> None:
        if error is not None:
            self._errors.append(f"{message.topic()}: {error.str()}")

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        where = {} if partition is None else {"partition": partition}
        if timestamp_ms is not None:
            where["timestamp"] = timestamp_ms
        while True:
            try:
                self.producer.produce(topic, value=value, key=key, headers=headers, **where)
                return
            except BufferError:
                self.producer.poll(0.05)  # local queue full: let deliveries drain

    def send_all(self, topic: str, partition: int, records: Iterable[tuple[str, bytes | None]], headers: Sequence[tuple[str, bytes]]) -> None:
        """`send` of many records with the same headers to one partition, in one loop: a task
        writes a changelog record per key it touched."""
        produce = self.producer.produce
        for key, value in records:
            while True:
                try:
                    produce(topic, value, key, partition=partition, headers=headers)
                    break
                except BufferError:
                    self.producer.poll(0.05)  # local queue full: let deliveries drain

    def send_batch(self, topic: str, partition: int, records: Iterable[tuple[str, bytes]]) -> None:
        """`send` of many records without headers to one partition, queued in one call (librdkafka's
        produce_batch): a task writes a changelog record per key it touched, and a produce() each
        cost 1.6-1.7 µs a record with headers, 1.0 without, a batch 0.6-0.8 (measured, 80,000 records).
        Their order among themselves is not kept when the local queue fills (each key is in one)."""
        messages = [{"key": key, "value": value} for key, value in records]
        while messages:
            if self.producer.produce_batch(topic, messages, partition=partition) == len(messages):
                return
            failed = [m for m in messages if "_error" in m]
            for message in failed:
                error = message.pop("_error")
                if error.code() != KafkaError._QUEUE_FULL:
                    raise KafkaException(error)
            messages = failed
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

    def close(self, timeout: float = 5.0) -> None:
        self.producer.close(timeout)


_sinks = WorkerClients(close=Sink.close)


@contextmanager
def for_worker(producer_conf: Mapping[str, Any], idle_seconds: float | None = None) -> Iterator[Sink]:
    """This worker process's sink for `producer_conf`, held for one task."""
    with _sinks.use(clients.conf_key(producer_conf), lambda: Sink(producer_conf), idle_seconds) as sink:
        yield sink
