"""Test helpers: what a service's tests import, and a notebook too.

`DetectorHarness` runs a detector over a sequence of batches, with restarts, without Kafka or Spark
(`detectorkit.testing.harness`); importing this module imports neither pytest nor the Kafka
client, which only the helpers that talk to a broker load, when called. The fixtures that start a
broker (`kafka_bootstrap_servers`, `kafka_broker_kind`) are `detectorkit.pytest_plugin`'s, which
pytest loads by itself where detectorkit is installed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from detectorkit.samples import Sample, samples
from detectorkit.settings import SettingsError
from detectorkit.testing.harness import DetectorError, DetectorHarness, event_times

# Sample, samples and SettingsError too: a service's tests import this face alone, not the modules behind it.
__all__ = [
    "DetectorError",
    "DetectorHarness",
    "event_times",
    "create_test_topics",
    "produce",
    "read_all",
    "Sample",
    "samples",
    "SettingsError",
    "wait_for",
]


def wait_for(condition, timeout: float = 120.0, what: str = "condition") -> None:
    """Poll `condition` every 0.1 s until it holds; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


EXTERNAL, KAFKA, CONTAINER, TANSU = "external", "kafka", "container", "tansu"


@dataclass(frozen=True)
class Topics:
    input: str
    output: str
    dlq: str
    group: str


@dataclass(frozen=True)
class Sent:
    sample: Sample
    partition: int
    offset: int


def create_test_topics(bootstrap_servers: str, prefix: str, partitions: int = 4) -> Topics:
    """Fresh input/output/dead-letter topics and group, so tests never see each other's records."""
    suffix = uuid.uuid4().hex[:8]
    topics = Topics(f"{prefix}.in.{suffix}", f"{prefix}.out.{suffix}", f"{prefix}.dlq.{suffix}", f"{prefix}.{suffix}")
    from detectorkit.kafka import clients

    clients.create_topics(clients.base(bootstrap_servers), {topics.input: partitions, topics.output: 1, topics.dlq: 1})
    return topics


def produce(bootstrap_servers: str, topic: str, samples: Iterable[Sample]) -> list[Sent]:
    """Write samples; returns where each landed, in the order given."""
    from detectorkit.kafka import clients

    producer = clients.new_producer(clients.producer(clients.base(bootstrap_servers)))
    sent: list[Sent | None] = []
    errors: list[str] = []

    def delivered(index: int, sample: Sample):
        def callback(error, message):
            if error is not None:
                errors.append(error.str())
            else:
                sent[index] = Sent(sample, message.partition(), message.offset())

        return callback

    for index, sample in enumerate(samples):
        sent.append(None)
        while True:
            try:
                stamp = {} if getattr(sample, "timestamp_ms", None) is None else {"timestamp": sample.timestamp_ms}
                producer.produce(topic, key=sample.key, value=sample.value, on_delivery=delivered(index, sample), **stamp)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    remaining = producer.flush(60)
    if remaining or errors or any(s is None for s in sent):
        raise RuntimeError(f"producing test records failed: {remaining} undelivered, errors {errors[:3]}")
    return sent  # type: ignore[return-value]


def read_all(bootstrap_servers: str, topic: str, timeout: float = 60.0, committed_only: bool = False) -> list[dict]:
    """Every record on `topic` now, as dicts (a service's detections, in its integration test);
    `committed_only`: what committed transactions wrote (exactly-once), as a downstream job reads it."""
    from detectorkit.kafka import clients
    from detectorkit.kafka.topic_reader import read_topic

    return list(read_topic(clients.base(bootstrap_servers), topic, timeout=timeout, committed_only=committed_only))
