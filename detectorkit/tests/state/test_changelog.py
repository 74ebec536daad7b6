"""Creating the changelog topic at start, and checking it at each assignment, without a broker: the
metadata of a topic created a moment ago (by this job or another instance) may not show it yet, and
an input that gained partitions is refused in one line."""

import contextlib
import types

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException

from detectorkit.kafka.access import KafkaAccess
from detectorkit.settings import SettingsError
from detectorkit.state import changelog


@pytest.fixture
def broker(monkeypatch):
    """A broker whose metadata shows the changelog only after `late` asks."""
    state = {"exists": False, "late": 2, "partitions": 4}

    def topic_partitions(admin, topic, timeout):
        if topic == "in":
            return [0, 1, 2, 3]
        if state["late"] > 0:
            state["late"] -= 1
            raise LookupError(f"topic {topic!r} does not exist")
        return list(range(state["partitions"]))

    monkeypatch.setattr(changelog.clients, "new_admin", lambda conf: object())
    monkeypatch.setattr(changelog.clients, "topic_partitions", topic_partitions)
    monkeypatch.setattr(changelog.clients, "create_topics", lambda conf, topics, timeout, config=None: [] if state["exists"] else list(topics))
    return state


def test_a_changelog_created_now_is_not_looked_up_before_its_metadata_arrives(broker):
    changelog.create({}, "svc.state", "in", "kafka", timeout=1)  # seen failing the diamond's burst detector at start


def test_one_another_instance_created_is_awaited_and_checked(broker):
    broker["exists"] = True
    changelog.create({}, "svc.state", "in", "kafka", timeout=5)
    broker.update(late=0, partitions=2)
    with pytest.raises(SettingsError, match="input topic 'in' now has 4 partitions but state changelog 'svc.state' has 2") as refused:
        changelog.create({}, "svc.state", "in", "kafka", timeout=5)
    assert_says_what_to_do(str(refused.value))


def assert_says_what_to_do(message):
    """One line: a new State name or the README's reset; never more changelog partitions, which
    would leave every key's state where its records no longer go."""
    assert "\n" not in message
    assert "State(name=...)" in message and "Changing the input's partition count" in message
    assert "add partitions" not in message


class Metadata:
    """An admin client's answer to a metadata request: every topic with its partitions."""

    def __init__(self, partitions):
        self.topics = {t: types.SimpleNamespace(partitions=dict.fromkeys(range(n)), error=None) for t, n in partitions.items()}
        self.orig_broker_name = "broker"


class Admin:
    def __init__(self, **partitions):
        self.partitions, self.requests = partitions, 0

    def list_topics(self, timeout):
        self.requests += 1
        return Metadata(self.partitions)


@pytest.mark.parametrize("owned", [{0, 1, 2, 3}, {0, 1}], ids=["all", "some"])
def test_an_assignment_within_the_changelogs_partitions_passes_in_one_request(owned):
    admin = Admin(**{"in": 4, "svc.state": 4})
    changelog.check_assignment(admin, "svc.state", "in", frozenset(owned), timeout=1)
    assert admin.requests == 1


@pytest.mark.parametrize("owned", [{0, 1, 4, 5}, {0, 1}], ids=["given-new-partitions", "given-old-ones-only"])
def test_an_input_that_gained_partitions_is_refused_at_an_assignment_in_one_line(owned):
    """Partitions added while the job runs: the keys hash to other partitions than their state's,
    whichever partitions this instance was given."""
    admin = Admin(**{"in": 8, "svc.state": 4})
    with pytest.raises(SettingsError, match="input topic 'in' now has 8 partitions but state changelog 'svc.state' has 4") as refused:
        changelog.check_assignment(admin, "svc.state", "in", frozenset(owned), timeout=1)
    assert_says_what_to_do(str(refused.value))
    assert admin.requests == 1


def test_the_group_may_know_partitions_the_metadata_does_not_show_yet():
    admin = Admin(**{"in": 4, "svc.state": 4})
    with pytest.raises(SettingsError, match="input topic 'in' now has 6 partitions but state changelog 'svc.state' has 4"):
        changelog.check_assignment(admin, "svc.state", "in", frozenset({0, 5}), timeout=1)


# ---- the reader: parts, ends, offsets out of range --------------------------------------------


class Message:
    def __init__(self, partition, offset, key=None, error=None):
        self._partition, self._offset, self._key, self._error = partition, offset, key, error

    def partition(self):
        return self._partition

    def offset(self):
        return self._offset

    def key(self):
        return self._key.encode()

    def value(self):
        return b"{}"

    def headers(self):
        return [("input_offset", b"10")]

    def error(self):
        return self._error


def eof(partition, offset):
    return Message(partition, offset, error=KafkaError(KafkaError._PARTITION_EOF))


class Consumer:
    """Hands out scripted fetches, one list of messages per consume(); records what was assigned."""

    def __init__(self, fetches):
        self.fetches, self.assigned = list(fetches), []

    def assign(self, tps):
        self.assigned.append([(tp.partition, tp.offset) for tp in tps])

    def incremental_unassign(self, tps):
        pass

    def incremental_assign(self, tps):
        self.assigned.append([(tp.partition, tp.offset) for tp in tps])

    def unassign(self):
        pass

    def consume(self, n, timeout):
        return self.fetches.pop(0) if self.fetches else []


@pytest.fixture
def consumer(monkeypatch):
    holder = {}

    @contextlib.contextmanager
    def use(key, create, idle_seconds=None, valid=None):
        yield holder["consumer"]

    monkeypatch.setattr(changelog._consumers, "use", use)
    return holder


def test_a_read_gives_each_partition_to_its_end_and_leaves_what_was_written_since(consumer):
    consumer["consumer"] = Consumer(
        [
            [Message(0, 5, "a"), Message(1, 0, "b"), Message(0, 6, "c")],
            [Message(0, 7, "d"), eof(0, 8), Message(0, 8, "written-since"), eof(1, 1)],
            [Message(0, 9, "later")],  # the partition ended: left for the store's next read
        ]
    )
    parts = list(changelog.read(changelog.StateContext("t", KafkaAccess({}, "g", 1.0)), {0: 5, 1: None}))
    assert [(p.partition, [r[0] for r in p.records], p.end) for p in parts] == [(0, ["a", "c"], None), (1, ["b"], None), (0, ["d"], 8), (1, [], 1)]
    assert parts[0].records[0] == ("a", b"{}", 10, 5)


def test_an_offset_out_of_range_is_reported_and_read_again_from_the_first_record_when_asked(consumer):
    out_of_range = Message(0, 50, error=KafkaError(KafkaError._AUTO_OFFSET_RESET))
    consumer["consumer"] = fake = Consumer([[out_of_range, Message(1, 3, "b"), eof(1, 4)], [Message(0, 0, "a"), eof(0, 1)]])
    reader = changelog.read(changelog.StateContext("t", KafkaAccess({}, "g", 1.0)), {0: 50, 1: 3})
    parts = []
    for part in reader:
        parts.append(part)
        if part.out_of_range:
            reader.restart(part.partition)
    assert [(p.partition, [r[0] for r in p.records], p.end, p.out_of_range) for p in parts] == [
        (0, [], None, True),
        (1, ["b"], 4, False),
        (0, ["a"], 1, False),
    ]
    assert fake.assigned == [[(0, 50), (1, 3)], [(0, OFFSET_BEGINNING)]]


def test_a_broker_error_fails_the_read(consumer):
    consumer["consumer"] = Consumer([[Message(0, 0, error=KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))]])
    with pytest.raises(KafkaException):
        list(changelog.read(changelog.StateContext("t", KafkaAccess({}, "g", 1.0)), {0: None}))
