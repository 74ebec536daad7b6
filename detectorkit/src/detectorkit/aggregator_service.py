"""`detectorkit aggregate`: the shared metrics-aggregator job.

Reads the metrics topic from the beginning, keeps the table in memory, serves it on /metrics for
Prometheus and writes it to the aggregated topic every interval.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
import uuid
from collections.abc import Sequence

import structlog
from confluent_kafka import KafkaError, TopicPartition
from prometheus_client import CollectorRegistry, start_http_server

from . import clients, logs
from .aggregator import AggregateCollector, Aggregator, to_json


def add_arguments(parser: argparse.ArgumentParser, environ) -> None:
    parser.add_argument("--bootstrap-servers", default=environ.get("KAFKA_BOOTSTRAP_SERVERS"),
                        help="Kafka bootstrap servers (env KAFKA_BOOTSTRAP_SERVERS)")
    parser.add_argument("--metrics-topic", default="metrics", help="topic the jobs report to (default: metrics)")
    parser.add_argument("--aggregate-topic", default="metrics-agg", help="topic for the aggregated view (default: metrics-agg)")
    parser.add_argument("--host", default="127.0.0.1", help="address of the /metrics endpoint (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=9108, help="port of the /metrics endpoint (default: 9108)")
    parser.add_argument("--interval-seconds", type=float, default=10.0, help="the jobs' reporting interval (default: 10)")
    parser.add_argument("--ttl-seconds", type=float, default=None,
                        help="an instance silent this long leaves the gauges and the up count (default: 3 intervals)")
    parser.add_argument("--connect-timeout-seconds", type=float, default=30.0)


class AggregatorService:
    def __init__(self, bootstrap_servers: str, metrics_topic: str = "metrics", aggregate_topic: str = "metrics-agg",
                 host: str = "127.0.0.1", port: int = 9108, interval: float = 10.0, ttl: float | None = None,
                 connect_timeout: float = 30.0):
        self.base = clients.base(bootstrap_servers)
        self.metrics_topic, self.aggregate_topic = metrics_topic, aggregate_topic
        self.interval = interval
        self.aggregator = Aggregator(ttl_seconds=ttl if ttl is not None else 3 * interval)
        self.registry = CollectorRegistry()
        self.registry.register(AggregateCollector(self.aggregator))
        self.host, self.port = host, port
        self.timeout = connect_timeout
        self.stop_event = threading.Event()
        self.log = structlog.get_logger("detectorkit.aggregator")

    def run(self) -> int:
        clients.create_topics(self.base, {self.metrics_topic: 1, self.aggregate_topic: 1}, self.timeout)
        # A group id of its own each start: the aggregator keeps no position, it replays the topic.
        consumer = clients.new_consumer(clients.consumer(self.base, f"metrics-aggregator-{uuid.uuid4().hex[:8]}"))
        partitions = clients.topic_partitions(consumer, self.metrics_topic, self.timeout)
        consumer.assign([TopicPartition(self.metrics_topic, p, 0) for p in partitions])
        producer = clients.new_producer(clients.producer(self.base))
        server, thread = start_http_server(self.port, addr=self.host, registry=self.registry)
        self.port = server.server_port
        self.log.info("aggregator started", metrics_topic=self.metrics_topic, endpoint=f"http://{self.host}:{self.port}/metrics")
        next_publish = time.monotonic() + self.interval
        try:
            while not self.stop_event.is_set():
                for message in consumer.consume(1000, timeout=0.2):
                    error = message.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            self.log.warning("metrics topic error", error=error.str())
                        continue
                    if not self.aggregator.apply(message.key(), message.value()):
                        self.log.warning("malformed snapshot skipped", offset=message.offset())
                if time.monotonic() >= next_publish:
                    next_publish += self.interval
                    for service, value in to_json(self.aggregator).items():
                        producer.produce(self.aggregate_topic, key=service.encode(), value=value)
                    producer.poll(0)
        finally:
            server.shutdown()
            producer.flush(5)
            consumer.close()
        return 0


def main(argv: Sequence[str] | None = None, environ=None) -> int:
    import os

    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog="detectorkit aggregate", description="Run the shared metrics-aggregator.")
    add_arguments(parser, environ)
    args = parser.parse_args(argv)
    if not args.bootstrap_servers:
        parser.error("set --bootstrap-servers or KAFKA_BOOTSTRAP_SERVERS")
    logs.setup("INFO", service="metrics-aggregator")
    service = AggregatorService(args.bootstrap_servers, args.metrics_topic, args.aggregate_topic, args.host, args.port,
                                args.interval_seconds, args.ttl_seconds, args.connect_timeout_seconds)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: service.stop_event.set())
    return service.run()
