"""A slice's reader: each poll's records as one Arrow batch, and where each partition has got to."""

from confluent_kafka import KafkaError

from detectorkit.kafka.position_reader import PositionReader


class Message:
    """What confluent-kafka's consumer returns, as far as the reader asks."""

    def __init__(self, partition: int, offset: int, error: KafkaError | None = None):
        self._partition, self._offset, self._error = partition, offset, error

    def partition(self):
        return self._partition

    def offset(self):
        return self._offset

    def error(self):
        return self._error

    def key(self):
        return f"k{self._partition}".encode()

    def value(self):
        return b'{"n": %d}' % self._offset

    def timestamp(self):
        return (1, 1_700_000_000_000 + self._offset)


class Consumer:
    def __init__(self, *polls: list[Message]):
        self.polls = list(polls)

    def assign(self, partitions) -> None:
        pass

    def consume(self, n: int, timeout: float) -> list[Message]:
        return self.polls.pop(0) if self.polls else []


def read(messages: list[Message], positions: dict[int, int], one_by_one: bool = False):
    reader = PositionReader(Consumer(messages), "t", positions, fail_on_data_loss=False, timeout=10)
    if one_by_one:
        reader._all_at_once = lambda messages: None
    batch = reader.poll(0)
    return (None if batch is None else batch.to_pylist()), reader.position, reader.at_end


def test_a_poll_of_records_is_taken_at_once_as_message_by_message():
    messages = [Message(p, o) for o in range(5, 8) for p in (0, 1)] + [Message(2, 0)]
    positions = {0: 5, 1: 5, 2: 0, 3: 9}
    at_once = read(messages, positions)
    assert at_once == read(messages, positions, one_by_one=True)
    rows, position, _ = at_once
    assert [(r["partition"], r["offset"]) for r in rows] == [(m.partition(), m.offset()) for m in messages]
    assert position == {0: 8, 1: 8, 2: 1, 3: 9}


def test_records_read_before_or_an_event_in_a_poll_go_message_by_message():
    # After a rewind, the consumer hands back records the reader has passed: they are dropped.
    rows, position, _ = read([Message(0, 3), Message(0, 4), Message(0, 5), Message(1, 2)], {0: 5, 1: 0})
    assert [(r["partition"], r["offset"]) for r in rows] == [(0, 5), (1, 2)]
    assert position == {0: 6, 1: 3}
    # A partition's end, then nothing: that partition is read to its end.
    end = Message(1, 3, KafkaError(KafkaError._PARTITION_EOF))
    rows, position, at_end = read([Message(0, 6), end], {0: 6, 1: 3})
    assert [(r["partition"], r["offset"]) for r in rows] == [(0, 6)]
    assert position == {0: 7, 1: 3} and at_end == {1}
