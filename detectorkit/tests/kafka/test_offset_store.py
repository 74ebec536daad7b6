"""The one reader of a group's committed offsets, `offset_store.committed`, and its users: the group
member that owns partitions, and the offset store the dev tools and tests read positions with."""

from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, TopicPartition

from detectorkit.kafka import clients, offset_store
from detectorkit.kafka.membership import GroupMember
from detectorkit.kafka.offset_store import OffsetStore, committed

NOWHERE = clients.base("127.0.0.1:9")  # librdkafka connects lazily: nothing here reaches a broker


class Consumer:
    """Answers `committed` as confluent-kafka does: OFFSET_INVALID where the group has no offset."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.asked: list[list[tuple[str, int]]] = []

    def committed(self, partitions, timeout):
        self.asked.append([(tp.topic, tp.partition) for tp in partitions])
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return [TopicPartition(tp.topic, tp.partition, answer.get(tp.partition, OFFSET_INVALID)) for tp in partitions]


def test_none_where_the_group_has_no_offset():
    consumer = Consumer({0: 42, 2: 0})
    assert committed(consumer, "t", [0, 1, 2], timeout=5) == {0: 42, 1: None, 2: 0}
    assert consumer.asked == [[("t", 0), ("t", 1), ("t", 2)]]


def test_no_partitions_asks_nothing():
    consumer = Consumer()
    assert committed(consumer, "t", [], timeout=5) == {}
    assert consumer.asked == []


def test_a_coordinator_still_loading_is_asked_again():
    consumer = Consumer(KafkaException(KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS)), {1: 7})
    assert committed(consumer, "t", [1], timeout=5) == {1: 7}
    assert len(consumer.asked) == 2


class Owner:
    def release(self, partitions, lost):
        pass


def test_the_group_member_and_the_offset_store_both_read_through_it(monkeypatch):
    readers = []

    def spy(consumer, topic, partitions, timeout):
        readers.append(topic)
        return dict.fromkeys(partitions, 5)

    monkeypatch.setattr(offset_store, "committed", spy)
    store = OffsetStore(clients.consumer(NOWHERE, "g"), "by-store", timeout=1)
    member = GroupMember(NOWHERE, "g", "by-member", timeout=1)
    try:
        assert store.committed([0]) == {0: 5}
        assert member.committed([0, 1]) == {0: 5, 1: 5}
    finally:
        store.close()
        member.close()
    assert readers == ["by-store", "by-member"]
