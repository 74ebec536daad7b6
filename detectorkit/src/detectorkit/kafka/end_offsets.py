"""Exact end offsets of a topic's partitions, cheaply: one strategy per broker kind.

On Apache Kafka, ListOffsets is exact: `ListOffsetsEnds` asks it for every partition in one request,
with the job's isolation level, so under read_committed the end is the last stable offset and a
batch never plans into an open transaction.

ListOffsets(latest) is wrong on the embedded broker (it answers the base offset of the last stored
batch + 1), so planning up to it would leave the newest batch unread until another one arrives.
The high watermark in Fetch responses is exact everywhere. The probe is a consumer parked at the end
of every partition: its long-polling fetches come back as soon as new records arrive, carrying the
exact high watermark, and librdkafka caches it. Each call reads those cached values and moves the
probe to the new end, so it downloads at most one fetch per partition per call instead of the whole
stream, and sends no request of its own (on real Kafka as on Tansu).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

from detectorkit.kafka import broker_kind, clients

# librdkafka reports an unknown offset as -1001.
_UNKNOWN = -1001


def start_positions(
    ends: ListOffsetsEnds | EndOffsetProbe, committed: Mapping[int, int | None], policy: str, topic: str, group: str
) -> dict[int, int]:
    """Where each partition starts: its committed offset, else where `policy` says (see
    planning.resolve_start), asking the broker only for the ends the policy needs."""
    from detectorkit.kafka.planning import resolve_start

    partitions = list(committed)
    # Where "latest" starts must be the true end: a low answer here would replay old records.
    latest = ends.end_offsets(partitions, confirmed=True)
    need_earliest = policy == "earliest" and any(o is None for o in committed.values())
    earliest = ends.earliest(partitions) if need_earliest else {}
    return resolve_start(committed, earliest, latest, policy, topic, group)


def open_end_offsets(kind: str, base_conf: Mapping[str, Any], group: str, topic: str, timeout: float) -> ListOffsetsEnds | EndOffsetProbe:
    """The end-offset strategy for a resolved broker kind."""
    broker = broker_kind.profile(kind)
    isolation = broker.isolation_level
    if not broker.lists_latest:
        return EndOffsetProbe(clients.consumer(base_conf, group, **{"isolation.level": isolation}), topic, timeout)
    return ListOffsetsEnds(base_conf, topic, timeout, isolation)


class ListOffsetsEnds:
    """End and start offsets from ListOffsets, for brokers where it is exact (Apache Kafka)."""

    def __init__(self, base_conf: Mapping[str, Any], topic: str, timeout: float = 30.0, isolation: str = "read_committed"):
        self.topic = topic
        self.timeout = timeout
        self._isolation = IsolationLevel.READ_COMMITTED if isolation == "read_committed" else IsolationLevel.READ_UNCOMMITTED
        self._admin = clients.new_admin(base_conf)

    def topic_partitions(self) -> list[int]:
        return clients.topic_partitions(self._admin, self.topic, self.timeout)

    def _list(self, partitions: Iterable[int], spec: OffsetSpec) -> dict[int, int]:
        partitions = list(partitions)
        deadline = time.monotonic() + self.timeout
        for attempt in itertools.count():
            try:
                return self._list_once(partitions, spec)
            except LookupError:
                if attempt:
                    raise  # looked again already: believe the answer
            except KafkaException as exc:
                # _NOENT: no leader known yet (measured right after a broker restart).
                if not (clients.is_transient(exc) or exc.args[0].code() == KafkaError._NOENT) or time.monotonic() > deadline:
                    raise
                time.sleep(min(0.05 * 2**attempt, 1.0))
            # The admin client answers from the leaders (and leader epochs) it last saw, every
            # 5 min, and ListOffsets never refreshes them: after a broker restart it gets
            # FENCED_LEADER_EPOCH until the next refresh (measured), and partitions added since
            # look missing. A fresh look at the metadata cures both.
            self.topic_partitions()
        raise AssertionError("unreachable")

    def _list_once(self, partitions: list[int], spec: OffsetSpec) -> dict[int, int]:
        request = {TopicPartition(self.topic, p): spec for p in partitions}
        if not request:
            return {}
        answers = self._admin.list_offsets(request, isolation_level=self._isolation, request_timeout=self.timeout)
        offsets = {}
        for tp, future in answers.items():
            try:
                offsets[tp.partition] = future.result().offset
            except KafkaException as exc:
                if clients.is_not_there(exc):
                    raise LookupError(f"partition {self.topic}-{tp.partition} does not exist") from None
                raise
        return offsets

    def end_offsets(self, partitions: Iterable[int], confirmed: bool = False) -> dict[int, int]:
        """Exact already: `confirmed` changes nothing here."""
        return self._list(partitions, OffsetSpec.latest())

    def earliest(self, partitions: Iterable[int]) -> dict[int, int]:
        return self._list(partitions, OffsetSpec.earliest())

    def for_time(self, partitions: Iterable[int], ms: int) -> dict[int, int]:
        """Kafka's offsets-for-times: each partition's first offset stamped at or after `ms` (-1: none)."""
        return self._list(partitions, OffsetSpec.for_timestamp(ms))

    def forget(self, partitions: Iterable[int]) -> None:
        """Nothing is held per partition."""

    def close(self) -> None:
        self._admin = None


class EndOffsetProbe:
    def __init__(self, consumer_conf: Mapping[str, Any], topic: str, timeout: float = 30.0):
        self.topic = topic
        self.timeout = timeout
        self._consumer = clients.new_consumer(
            {
                **consumer_conf,
                # A fetch that carries data only needs to bring one batch to update the watermark.
                "max.partition.fetch.bytes": 64 * 1024,
                "queued.min.messages": 1,
                "queued.max.messages.kbytes": 1024,
                "enable.partition.eof": False,
            }
        )
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
