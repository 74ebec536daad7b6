"""`detectorkit aggregate`: the shared metrics-aggregator job.

Keeps the table in memory, serves it on /metrics for Prometheus and writes it to the aggregated
topic every interval. The table also goes, as it changes, to a compacted changelog topic of its own
(`<metrics topic>.aggregator-changelog`), followed by the metrics topic's position it reflects. A
restart reads the changelog (a record per instance and service after compaction) and resumes the
metrics topic there: its cost follows the number of instances, not the topic's history, so the
metrics topic may have retention. Instances silent past the retirement horizon are folded into their
service's retired total, so the table stays small under churn.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence

import structlog
from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition
from prometheus_client import CollectorRegistry, start_http_server

from detectorkit import logs, manifests
from detectorkit.kafka import clients
from detectorkit.metrics.aggregator import AggregateCollector, Aggregator, to_json
from detectorkit.settings import kafka_options_from_env


def add_arguments(parser: argparse.ArgumentParser, environ) -> None:
    parser.add_argument(
        "--bootstrap-servers", default=environ.get("KAFKA_BOOTSTRAP_SERVERS"), help="Kafka bootstrap servers (env KAFKA_BOOTSTRAP_SERVERS)"
    )
    parser.add_argument("--metrics-topic", default="metrics", help="topic the jobs report to (default: metrics)")
    parser.add_argument("--aggregate-topic", default="metrics-agg", help="topic for the aggregated view (default: metrics-agg)")
    parser.add_argument(
        "--host",
        default=environ.get("AGGREGATOR_HOST", "127.0.0.1"),
        help="address the /metrics endpoint binds to; 0.0.0.0 in a container (env AGGREGATOR_HOST, default 127.0.0.1)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=int(environ.get("AGGREGATOR_PORT", "9108")),
        help="port of the /metrics endpoint, 0 for a free one (env AGGREGATOR_PORT, default 9108)",
    )
    parser.add_argument("--changelog-topic", default=None, help="compacted topic of the table (default: <metrics topic>.aggregator-changelog)")
    parser.add_argument(
        "--retire-after-seconds",
        type=float,
        default=7 * 24 * 3600.0,
        help="an instance silent this long is folded into its service's retired total (default: 7 days)",
    )
    parser.add_argument("--interval-seconds", type=float, default=10.0, help="the jobs' reporting interval (default: 10)")
    parser.add_argument(
        "--ttl-seconds", type=float, default=None, help="an instance silent this long leaves the gauges and the up count (default: 3 intervals)"
    )
    parser.add_argument("--connect-timeout-seconds", type=float, default=30.0)
    parser.add_argument(
        "--topics-as-code",
        action=argparse.BooleanOptionalAction,
        default=environ.get("TOPICS_AS_CODE", "").strip().lower() in ("1", "true", "yes", "on"),
        help="the topics are made elsewhere (its KafkaTopics): create none, stop at start if one is missing (env TOPICS_AS_CODE)",
    )


POSITION = "position"  # the changelog key of the metrics topic's position the table reflects
GROUP_PREFIX = "metrics-aggregator-"  # its consumers' groups: a new one each start
CHANGELOG_CONFIG = {"cleanup.policy": "compact", "segment.ms": "600000", "min.cleanable.dirty.ratio": "0.1"}


class AggregatorService:
    def __init__(
        self,
        bootstrap_servers: str,
        metrics_topic: str = "metrics",
        aggregate_topic: str = "metrics-agg",
        host: str = "127.0.0.1",
        port: int = 9108,
        interval: float = 10.0,
        ttl: float | None = None,
        connect_timeout: float = 30.0,
        changelog_topic: str | None = None,
        retire_after: float = 7 * 24 * 3600.0,
        kafka_options: Mapping[str, str] | None = None,
        topics_as_code: bool = False,
    ):
        # The jobs' own security settings (KAFKA_SECURITY_*, KAFKA_SASL_*, KAFKA_SSL_*): on a secured
        # cluster the aggregator reads the metrics topic with the same credentials, secrets wrapped.
        self.base = clients.base(bootstrap_servers, kafka_options)
        self.metrics_topic, self.aggregate_topic = metrics_topic, aggregate_topic
        self.changelog_topic = changelog_topic or f"{metrics_topic}.aggregator-changelog"
        self.interval = interval
        self.aggregator = Aggregator(ttl_seconds=ttl if ttl is not None else 3 * interval, retire_after_seconds=retire_after)
        self.registry = CollectorRegistry()
        self.registry.register(AggregateCollector(self.aggregator))
        self.host, self.port = host, port
        self.timeout = connect_timeout
        self.topics_as_code = topics_as_code
        self.stop_event = threading.Event()
        self._written: dict[int, int] = {}  # the last position written to the changelog
        self.log = structlog.get_logger("detectorkit.aggregator")

    def restore(self, consumer) -> dict[int, int]:
        """Read the changelog to its end into the table; returns the metrics topic's position."""
        began = time.monotonic()
        tp = TopicPartition(self.changelog_topic, 0, OFFSET_BEGINNING)
        # Created a moment ago, its partition's leader may still be settling (NOT_LEADER_FOR_PARTITION).
        _, end = clients.retrying(lambda: consumer.get_watermark_offsets(tp, timeout=self.timeout), self.timeout)
        position: dict[int, int] = {}
        records = 0
        if end > 0:
            consumer.assign([tp])
            # Nothing else writes the changelog: past the end (which Tansu's ListOffsets may put a
            # little low), a quiet fetch means everything is read.
            deadline = time.monotonic() + self.timeout * 10
            while time.monotonic() < deadline:
                messages = consumer.consume(10_000, timeout=0.5)
                for message in messages:
                    if message.error() is not None:
                        continue
                    records += 1
                    key = message.key().decode()
                    if key == POSITION:
                        position = {int(p): o for p, o in json.loads(message.value()).items()}
                    else:
                        self.aggregator.restore(key, message.value())
                if not messages and consumer.position([TopicPartition(self.changelog_topic, 0)])[0].offset >= end:
                    break
            consumer.unassign()
        self.aggregator.changes()  # what was restored is in the changelog already
        self.log.info(
            "table restored", changelog_records=records, instances=len(self.aggregator.instances), seconds=round(time.monotonic() - began, 3)
        )
        return position

    def kafka_manifests(self, cluster: str, authentication: str, replicas: int) -> list[dict]:
        """Its Strimzi resources: the topics it owns (the aggregated view, its changelog) and its
        KafkaUser with what it does: reads the metrics topic and its changelog, writes both of its
        own. Its consumers only assign, never join or commit: no group right."""
        labels = {manifests.CLUSTER_LABEL: cluster, "app.kubernetes.io/name": "metrics-aggregator"}
        rights = [
            manifests.rule("topic", self.metrics_topic, ["Read", "Describe"]),
            manifests.rule("topic", self.aggregate_topic, ["Write", "Describe"]),
            manifests.rule("topic", self.changelog_topic, ["Read", "Write", "Describe"]),
        ]
        return [
            manifests.topic(self.aggregate_topic, 1, replicas, {}, labels),
            manifests.topic(self.changelog_topic, 1, replicas, dict(CHANGELOG_CONFIG), labels),
            manifests.user("metrics-aggregator", authentication, labels, rights),
        ]

    def _topics(self) -> None:
        """Its topics: created where missing, or, with topics as code, LookupError naming the missing."""
        if not self.topics_as_code:
            clients.create_topics(self.base, {self.metrics_topic: 1, self.aggregate_topic: 1}, self.timeout)
            clients.create_topics(self.base, {self.changelog_topic: 1}, self.timeout, config=CHANGELOG_CONFIG)
            return
        topics = (self.metrics_topic, self.aggregate_topic, self.changelog_topic)
        missing = clients.missing_topics(clients.new_admin(self.base), topics, self.timeout, "the aggregator's KafkaTopics")
        if missing:
            raise LookupError(missing)

    def run(self) -> int:
        self._topics()
        # A group id of its own each start: the aggregator's position is in its changelog.
        consumer = clients.new_consumer(clients.consumer(self.base, f"{GROUP_PREFIX}{uuid.uuid4().hex[:8]}", **{"auto.offset.reset": "earliest"}))
        position = self.restore(consumer)
        self._written = dict(position)
        partitions = clients.topic_partitions(consumer, self.metrics_topic, self.timeout)
        # Where retention removed the position's records, from the oldest kept: snapshots are
        # cumulative, so the next one of each instance makes its counts whole again.
        consumer.assign([TopicPartition(self.metrics_topic, p, position.get(p, OFFSET_BEGINNING)) for p in partitions])
        replayed = 0
        producer = clients.new_producer(clients.producer(self.base))
        server, thread = start_http_server(self.port, addr=self.host, registry=self.registry)
        self.port = server.server_port
        self.log.info(
            "aggregator started",
            metrics_topic=self.metrics_topic,
            changelog_topic=self.changelog_topic,
            resumed_at={str(p): o for p, o in position.items()},
            endpoint=f"http://{self.host}:{self.port}/metrics",
        )
        next_publish = time.monotonic() + self.interval
        try:
            while not self.stop_event.is_set():
                for message in consumer.consume(1000, timeout=0.2):
                    error = message.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            self.log.warning("metrics topic error", error=error.str())
                        continue
                    replayed += 1
                    position[message.partition()] = message.offset() + 1
                    if not self.aggregator.apply(message.key(), message.value()):
                        self.log.warning("malformed snapshot skipped", offset=message.offset())
                if time.monotonic() >= next_publish:
                    next_publish += self.interval
                    self.checkpoint(producer, position)
                    for service, value in to_json(self.aggregator).items():
                        producer.produce(self.aggregate_topic, key=service.encode(), value=value)
                    producer.poll(0)
        finally:
            server.shutdown()
            self.checkpoint(producer, position)
            producer.flush(5)
            consumer.close()
        return 0

    def checkpoint(self, producer, position: dict[int, int]) -> None:
        """The table's changes, then the position they reflect (one partition: in that order)."""
        retired = self.aggregator.retire()
        if retired:
            self.log.info("instances retired", instances=len(retired))
        changes = self.aggregator.changes()
        for key, value in changes.items():
            producer.produce(self.changelog_topic, key=key.encode(), value=value)
        if changes or position != self._written:
            producer.produce(self.changelog_topic, key=POSITION.encode(), value=json.dumps(position).encode())
            self._written = dict(position)
        producer.poll(0)


def main(argv: Sequence[str] | None = None, environ=None) -> int:
    import os

    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog="detectorkit aggregate", description="Run the shared metrics-aggregator.")
    add_arguments(parser, environ)
    if argv[:1] == ["kafka-manifests"]:
        return _manifests_main(argv[1:], environ)
    args = parser.parse_args(argv)
    if not args.bootstrap_servers:
        parser.error("set --bootstrap-servers or KAFKA_BOOTSTRAP_SERVERS")
    logs.setup("INFO", service="metrics-aggregator")
    service = AggregatorService(
        args.bootstrap_servers,
        args.metrics_topic,
        args.aggregate_topic,
        args.host,
        args.port,
        args.interval_seconds,
        args.ttl_seconds,
        args.connect_timeout_seconds,
        args.changelog_topic,
        args.retire_after_seconds,
        kafka_options=kafka_options_from_env(environ),
        topics_as_code=args.topics_as_code,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: service.stop_event.set())
    try:
        return service.run()
    except LookupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _manifests_main(argv: Sequence[str], environ) -> int:
    prog = "detectorkit aggregate kafka-manifests"
    parser = argparse.ArgumentParser(
        prog=prog, description="Print the aggregator's Strimzi KafkaTopics and its KafkaUser, for a deployment with TOPICS_AS_CODE=true."
    )
    manifests.add_arguments(parser)
    add_arguments(parser, environ)
    args = parser.parse_args(argv)
    service = AggregatorService(args.bootstrap_servers or "unused", args.metrics_topic, args.aggregate_topic, changelog_topic=args.changelog_topic)
    try:
        text = manifests.as_yaml(service.kafka_manifests(args.cluster, args.authentication, args.replicas), f"{prog} --cluster {args.cluster}")
    except ImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0
