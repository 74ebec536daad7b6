"""Read a whole topic, from the first record to the current end: for `tail`, tests and benchmarks.

The end is where each partition reports EOF after a fetch (exact on every broker), not
ListOffsets, which is wrong on the embedded broker.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from detectorkit.kafka import clients


def read_topic(
    base_conf: Mapping[str, Any], topic: str, timeout: float = 30.0, limit: int | None = None, committed_only: bool = False
) -> Iterator[dict]:
    """Every record as a dict (key, value, partition, offset, timestamp_ms, headers), decoded as
    text; with `committed_only`, as a read_committed consumer downstream sees them."""
    for message in read_messages(base_conf, topic, timeout, limit, committed_only=committed_only):
        yield {
            "key": _text(message.key()),
            "value": _text(message.value()),
            "partition": message.partition(),
            "offset": message.offset(),
            "timestamp_ms": message.timestamp()[1],
            "headers": {k: _text(v) for k, v in (message.headers() or [])},
        }


def read_messages(
    base_conf: Mapping[str, Any],
    topic: str,
    timeout: float = 30.0,
    limit: int | None = None,
    partitions: list[int] | None = None,
    committed_only: bool = False,
) -> Iterator:
    isolation = "read_committed" if committed_only else "read_uncommitted"
    conf = clients.consumer(base_conf, f"detectorkit-reader-{uuid.uuid4()}", **{"enable.partition.eof": True, "isolation.level": isolation})
    consumer = clients.new_consumer(conf)
    try:
        partitions = clients.topic_partitions(consumer, topic, timeout) if partitions is None else partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        open_partitions = set(partitions)
        seen = 0
        deadline = time.monotonic() + timeout
        while open_partitions:
            if time.monotonic() > deadline:
                raise TimeoutError(f"did not reach the end of {topic} within {timeout:g} s")
            for message in consumer.consume(10_000, timeout=0.2):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        open_partitions.discard(message.partition())
                        continue
                    if error.fatal() or not error.retriable():
                        raise KafkaException(error)
                    continue
                yield message
                seen += 1
                if limit is not None and seen >= limit:
                    return
    finally:
        consumer.close()


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="replace")
