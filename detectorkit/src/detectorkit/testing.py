"""Test helpers and a pytest plugin (loaded automatically where detectorkit is installed).

The `kafka_bootstrap_servers` fixture picks the broker: KAFKA_BOOTSTRAP_SERVERS if set; else
Apache Kafka started by `kafka_broker.KafkaBroker` where Java and Maven (or its cached jars) are
there; else a Kafka container where a Docker engine answers; else the embedded broker (Tansu).
DETECTORKIT_TEST_BROKER=kafka|container|tansu insists on one. `kafka_broker_kind` tells which, so a
test that needs what Tansu lacks can skip with a reason.

`DetectorHarness` runs a detector over a sequence of batches, with restarts, without Kafka or Spark
(see `detectorkit.state.harness`).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pytest

from detectorkit.kafka import clients
from detectorkit.kafka.topic_reader import read_topic
from detectorkit.samples import Sample, samples
from detectorkit.settings import SettingsError
from detectorkit.state.harness import DetectorError, DetectorHarness, event_times

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
    clients.create_topics(clients.base(bootstrap_servers), {topics.input: partitions, topics.output: 1, topics.dlq: 1})
    return topics


def produce(bootstrap_servers: str, topic: str, samples: Iterable[Sample]) -> list[Sent]:
    """Write samples; returns where each landed, in the order given."""
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
    return list(read_topic(clients.base(bootstrap_servers), topic, timeout=timeout, committed_only=committed_only))


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:  # noqa: BLE001 - no client, no socket, no engine: all mean "no Docker"
        return False


def _kafka_can_start() -> bool:
    from detectorkit.devtools.kafka_broker import KAFKA_VERSION, cache_dir

    cached = (cache_dir() / f"kafka-{KAFKA_VERSION}" / ".complete").exists()
    return shutil.which("java") is not None and (cached or shutil.which("mvn") is not None)


def choose_broker() -> str:
    """The kind of broker the tests will use, in the order the module's docstring gives."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        return EXTERNAL
    wanted = os.environ.get("DETECTORKIT_TEST_BROKER", "").lower()
    if wanted:
        if wanted not in (KAFKA, CONTAINER, TANSU):
            raise pytest.UsageError(f"DETECTORKIT_TEST_BROKER={wanted!r}: use kafka, container or tansu")
        return wanted
    if _kafka_can_start():
        return KAFKA
    return CONTAINER if _docker_answers() else TANSU


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[tuple[str, str]]:
    """(bootstrap servers, kind) of the broker the tests use."""
    kind = choose_broker()
    if kind == EXTERNAL:
        yield os.environ["KAFKA_BOOTSTRAP_SERVERS"], EXTERNAL
    elif kind == KAFKA:
        from detectorkit.devtools.kafka_broker import KafkaBroker

        with KafkaBroker() as broker:
            # As on a deployed cluster: without it every job waits out its last metrics report.
            clients.create_topics(clients.base(broker.bootstrap_servers), {"metrics": 1})
            yield broker.bootstrap_servers, KAFKA
    elif kind == CONTAINER:
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer() as kafka:
            yield kafka.get_bootstrap_server(), CONTAINER
    else:
        from detectorkit.devtools.embedded_broker import EmbeddedBroker

        with EmbeddedBroker() as broker:
            yield broker.bootstrap_servers, TANSU


@pytest.fixture(scope="session")
def kafka_bootstrap_servers(kafka_broker) -> str:
    return kafka_broker[0]


@pytest.fixture(scope="session")
def kafka_broker_kind(kafka_broker) -> str:
    return kafka_broker[1]
