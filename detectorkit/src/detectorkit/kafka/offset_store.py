"""The offset store: the job's position lives in Kafka as consumer-group commits.

No Spark checkpoint is needed to resume: a job started with an empty checkpoint directory reads its
position here. The group never subscribes; it is only a place to keep offsets, so committing needs
no group membership and no rebalance ever happens.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from detectorkit.kafka import clients
from detectorkit.kafka.clients import retrying


class OffsetStore:
    def __init__(self, consumer_conf: Mapping[str, Any], topic: str, timeout: float = 30.0):
        self.topic = topic
        self.group = consumer_conf["group.id"]
        self.timeout = timeout
        self._consumer = clients.new_consumer(consumer_conf)

    def committed(self, partitions: Iterable[int]) -> dict[int, int | None]:
        """The committed offset of each partition, None where the group has none."""
        tps = [TopicPartition(self.topic, p) for p in partitions]
        if not tps:
            return {}
        result = retrying(lambda: self._consumer.committed(tps, timeout=self.timeout), self.timeout)
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in result}

    def commit(self, offsets: Mapping[int, int]) -> None:
        """Commit synchronously; raises KafkaException if any partition's commit failed."""
        if not offsets:
            return
        tps = [TopicPartition(self.topic, p, o) for p, o in sorted(offsets.items())]

        def commit():
            result = self._consumer.commit(offsets=tps, asynchronous=False)
            failed = [tp for tp in result or [] if tp.error]
            if failed:
                raise KafkaException(failed[0].error)

        retrying(commit, self.timeout)

    def close(self) -> None:
        self._consumer.close()
