"""Exact end offsets of a topic's partitions, cheaply.

ListOffsets(latest) is wrong on the embedded broker (it answers the base offset of the last stored
batch + 1), so planning up to it would leave the newest batch unread until another one arrives.
The high watermark in Fetch responses is exact everywhere. The probe is a consumer parked at the end
of every partition: its long-polling fetches come back as soon as new records arrive, carrying the
exact high watermark, and librdkafka caches it. Each call reads those cached values and moves the
probe to the new end, so it downloads at most one fetch per partition per call instead of the whole
stream, and sends no request of its own (on real Kafka as on Tansu).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from . import clients

# librdkafka reports an unknown offset as -1001.
_UNKNOWN = -1001


class EndOffsetProbe:
    def __init__(self, consumer_conf: Mapping[str, Any], topic: str, timeout: float = 30.0):
        self.topic = topic
        self.timeout = timeout
        self._consumer = Consumer({
            **consumer_conf,
            # A fetch that carries data only needs to bring one batch to update the watermark.
            "max.partition.fetch.bytes": 64 * 1024,
            "queued.min.messages": 1,
            "queued.max.messages.kbytes": 1024,
            "enable.partition.eof": False,
        })
        self._parked: dict[int, int] = {}
        self._known: dict[int, int] = {}
        self._confirmed: set[int] = set()

    def _list_offsets(self, partition: int) -> tuple[int, int]:
        return self._consumer.get_watermark_offsets(TopicPartition(self.topic, partition), timeout=self.timeout, cached=False)

    def topic_partitions(self) -> list[int]:
        """The topic's partitions now (LookupError if it does not exist)."""
        return clients.topic_partitions(self._consumer, self.topic, self.timeout)

    def earliest(self, partitions: Iterable[int]) -> dict[int, int]:
        return {p: self._list_offsets(p)[0] for p in partitions}

    def end_offsets(self, partitions: Iterable[int], confirmed: bool = False) -> dict[int, int]:
        """The end offset of each partition, never beyond the true end.

        With `confirmed`, waits (up to the timeout) until every answer comes from a Fetch response:
        needed where a low answer is not merely late but wrong, as for where "latest" starts.
        """
        partitions = list(partitions)
        self._park_new(partitions)
        deadline = time.monotonic() + self.timeout
        while True:
            # Serve fetch responses and drop whatever records they brought.
            self._consumer.consume(10_000, timeout=0)
            ends = {p: self._refresh(p) for p in partitions}
            if not confirmed or self._confirmed.issuperset(partitions):
                return ends
            if time.monotonic() > deadline:
                raise TimeoutError(f"no fetch answered for {self.topic} within {self.timeout:g} s")
            self._consumer.consume(10_000, timeout=0.02)

    def _park_new(self, partitions: list[int]) -> None:
        new = [p for p in partitions if p not in self._parked]
        if not new:
            return
        # The first answer comes from ListOffsets, which may be low on Tansu; it is never beyond
        # the true end, and the probe's first fetch corrects it within a poll.
        tps = []
        for p in new:
            end = self._list_offsets(p)[1]
            self._known[p] = self._parked[p] = end
            tps.append(TopicPartition(self.topic, p, end))
        self._consumer.incremental_assign(tps)

    def _refresh(self, p: int) -> int:
        _, high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)
        if high != _UNKNOWN:
            self._confirmed.add(p)
            if high > self._known[p]:
                self._known[p] = high
        if self._known[p] > self._parked[p]:
            try:
                self._consumer.seek(TopicPartition(self.topic, p, self._known[p]))
                self._parked[p] = self._known[p]
            except KafkaException:
                pass  # the partition's fetcher is not started yet; park it on a later call
        return self._known[p]

    def forget(self, partitions: Iterable[int]) -> None:
        """Stop probing partitions that went away."""
        gone = [p for p in partitions if p in self._parked]
        if gone:
            self._consumer.incremental_unassign([TopicPartition(self.topic, p) for p in gone])
            for p in gone:
                del self._parked[p], self._known[p]
                self._confirmed.discard(p)

    def close(self) -> None:
        self._consumer.close()
