"""Client configurations: secrets that never print, and topic metadata read for what it says."""

from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from detectorkit.kafka import clients


def test_secrets_travel_hidden_and_reach_only_the_client():
    conf = clients.base("b:9092", {"sasl.password": "hunter2", "sasl.username": "svc", "ssl.key.password": "k3y"})
    assert "hunter2" not in repr(conf) and "k3y" not in str(conf)
    assert clients.reveal(conf)["sasl.password"] == "hunter2" and clients.reveal(conf)["sasl.username"] == "svc"
    # Clients are cached per configuration: another password is another client.
    other = clients.base("b:9092", {"sasl.password": "other", "sasl.username": "svc", "ssl.key.password": "k3y"})
    assert clients.conf_key(conf) != clients.conf_key(other)
    assert "hunter2" not in clients.conf_key(conf)


class Listing:
    """A metadata answer as confluent-kafka gives it."""

    def __init__(self, **topics):
        self.topics = topics

    def list_topics(self, timeout):
        return SimpleNamespace(topics=self.topics, orig_broker_name="b:9092/1")


def entry(error=None, partitions=(0, 1)):
    return SimpleNamespace(error=None if error is None else KafkaError(error), partitions=dict.fromkeys(partitions))


def test_an_unauthorised_topic_is_refused_not_missing():
    with pytest.raises(clients.TopicAccessError, match="cannot read topic 't'"):
        clients.topic_partitions(Listing(t=entry(KafkaError.TOPIC_AUTHORIZATION_FAILED)), "t", 1)


@pytest.mark.parametrize("listing", [Listing(), Listing(t=entry(KafkaError.UNKNOWN_TOPIC_OR_PART))], ids=["absent", "unknown"])
def test_a_topic_that_is_not_there_is_missing(listing):
    with pytest.raises(LookupError, match="does not exist"):
        clients.topic_partitions(listing, "t", 1)


def test_partitions_of_a_topic_that_is_there():
    assert clients.topic_partitions(Listing(t=entry(partitions=(2, 0, 1))), "t", 1) == [0, 1, 2]


def answers(*outcomes):
    """A call that fails with each KafkaError code given, then returns "ok"."""
    pending = list(outcomes)

    def call():
        if pending:
            raise KafkaException(KafkaError(pending.pop(0)))
        return "ok"

    return call


def test_a_leader_moving_after_a_broker_restart_is_waited_out():
    # Measured on Kafka 4.2: ListOffsets answers FENCED_LEADER_EPOCH for a moment after a broker
    # restart, and librdkafka does not call it retriable.
    assert clients.retrying(answers(KafkaError.FENCED_LEADER_EPOCH, KafkaError.NOT_LEADER_FOR_PARTITION), timeout=5) == "ok"


def test_a_lasting_or_final_error_is_not_retried():
    with pytest.raises(KafkaException):
        clients.retrying(answers(KafkaError.TOPIC_AUTHORIZATION_FAILED), timeout=5)
    with pytest.raises(KafkaException):
        clients.retrying(answers(*[KafkaError.FENCED_LEADER_EPOCH] * 100), timeout=0.3)


class NewTopicAdmin:
    """An admin whose CreateTopics succeeds before the metadata shows the topic with its leaders,
    as on Kafka, where the controller's answer runs ahead of the brokers' metadata."""

    def __init__(self, lagging_answers):
        self.listings = [{}, *lagging_answers]  # the listing before the creation, then after it

    def list_topics(self, timeout):
        topics = self.listings.pop(0) if len(self.listings) > 1 else self.listings[0]
        return SimpleNamespace(topics=topics, orig_broker_name="b:9092/1")

    def create_topics(self, wanted, **timeouts):
        done = SimpleNamespace(result=lambda: None)
        return {topic.topic: done for topic in wanted}


def led(*leaders):
    return SimpleNamespace(error=None, partitions={p: SimpleNamespace(leader=leader) for p, leader in enumerate(leaders)})


def test_a_created_topic_is_returned_only_once_the_metadata_shows_every_partition_led(monkeypatch):
    admin = NewTopicAdmin([{}, {"t": entry(KafkaError.LEADER_NOT_AVAILABLE)}, {"t": led(1, -1)}, {"t": led(1, 1)}])
    monkeypatch.setattr(clients, "new_admin", lambda conf: admin)
    assert clients.create_topics({}, {"t": 2}, timeout=5) == ["t"]
    assert admin.listings == [{"t": led(1, 1)}]  # every lagging answer was read


def test_a_created_topic_the_metadata_never_shows_is_an_error_naming_it(monkeypatch):
    monkeypatch.setattr(clients, "new_admin", lambda conf: NewTopicAdmin([{}]))
    with pytest.raises(KafkaException, match="topic 't' was created but .* within 0.3 s"):
        clients.create_topics({}, {"t": 1}, timeout=0.3)
