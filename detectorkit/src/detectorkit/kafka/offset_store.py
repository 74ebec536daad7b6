"""A consumer group's committed offsets: the only record of a job's position (no Spark checkpoint
is kept to resume from).

`committed` is the one reader of them, used by the group member that owns the partitions and
commits as it reads them (`membership`), and by `OffsetStore`, a client outside the group for the
dev tools and the tests: it reads a group's position, and sets one (which Kafka accepts only while
the group has no members).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from confluent_kafka import Consumer, KafkaException, TopicPartition

from detectorkit.kafka import clients
from detectorkit.kafka.clients import retrying

# A committed offset's metadata: how far the state's changelog reflects the input when a job writes
# its state changes once an interval (state.changelog.StateContext). It goes with the offset in one
# commit, so the two never disagree.
_DURABLE = "detectorkit.state_offset="


def durable_metadata(offset: int) -> str:
    return f"{_DURABLE}{offset}"


def durable_of(metadata: str | None) -> int | None:
    """The offset `durable_metadata` wrote; None for other (or no) metadata."""
    if metadata and metadata.startswith(_DURABLE):
        try:
            return int(metadata[len(_DURABLE) :])
        except ValueError:
            return None
    return None


class Commit(NamedTuple):
    """A partition's commit: its offset (None: none) and the changelog position its metadata
    carries (`durable_of`)."""

    offset: int | None
    durable: int | None


def committed_durable(client_conf: Mapping[str, Any], group: str, topic: str, partitions: Iterable[int], timeout: float) -> dict[int, int | None]:
    """For a task outside the group: each partition's `durable_of` its committed offset's metadata
    (one request to the group coordinator; no member joins)."""
    consumer = clients.new_consumer(clients.consumer(client_conf, group))
    try:
        return {p: c.durable for p, c in commits(consumer, topic, partitions, timeout).items()}
    finally:
        consumer.close()


def committed_partitions(consumer: Consumer, topic: str, partitions: Iterable[int], timeout: float) -> list[TopicPartition]:
    """The group's commits of `topic`'s `partitions` (offset and metadata); asked again while the
    broker answers with a transient error (a coordinator moving or loading)."""
    tps = [TopicPartition(topic, p) for p in partitions]
    return retrying(lambda: consumer.committed(tps, timeout=timeout), timeout) if tps else []


def commits(consumer: Consumer, topic: str, partitions: Iterable[int], timeout: float) -> dict[int, Commit]:
    """The group's commit of each of `topic`'s `partitions`: offset and changelog position, in one request."""
    tps = committed_partitions(consumer, topic, partitions, timeout)
    return {tp.partition: Commit(tp.offset if tp.offset >= 0 else None, durable_of(tp.metadata)) for tp in tps}


def committed(consumer: Consumer, topic: str, partitions: Iterable[int], timeout: float) -> dict[int, int | None]:
    """The group's committed offset of each of `topic`'s `partitions`, None where it has none."""
    return {p: c.offset for p, c in commits(consumer, topic, partitions, timeout).items()}


class OffsetStore:
    def __init__(self, consumer_conf: Mapping[str, Any], topic: str, timeout: float = 30.0):
        self.topic = topic
        self.group = consumer_conf["group.id"]
        self.timeout = timeout
        self._consumer = clients.new_consumer(consumer_conf)

    def committed(self, partitions: Iterable[int]) -> dict[int, int | None]:
        """The committed offset of each partition, None where the group has none."""
        return committed(self._consumer, self.topic, partitions, self.timeout)

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
