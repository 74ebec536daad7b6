"""The notifier's outbox relay on a broker: what is committed to the notifications topic is delivered,
once per commit of the relay's position, from where the first start found the topic's end."""

import collections
import json

import pytest
from confluent_kafka import KafkaError, KafkaException

from detectorkit.kafka import broker_kind, clients
from detectorkit.roles.notification_relay import DELIVERY_FAILED, NotificationRelay
from detectorkit.settings import SettingsError
from detectorkit.testing import create_test_topics, read_all, wait_for


def note(customer):
    return {"customer": customer, "window_start": "2026-11-26T05:00:00.000Z", "window_end": "2026-11-26T06:00:00.000Z", "detections": []}


def send(bs, topic, customers, transactional_id=None, abort=False):
    conf = clients.producer(clients.base(bs))
    if transactional_id:
        conf["transactional.id"] = transactional_id
    producer = clients.new_producer(conf)
    if transactional_id:
        producer.init_transactions(30)
        producer.begin_transaction()
    failed = []
    for i, customer in enumerate(customers):
        value = json.dumps(note(customer)).encode()
        producer.produce(topic, key=customer.encode(), value=value, partition=i % 2, on_delivery=lambda err, msg: err and failed.append(err))
    assert producer.flush(30) == 0 and failed == []  # written (aborted only after: on the log, never visible)
    if transactional_id:
        (producer.abort_transaction if abort else producer.commit_transaction)(30)


class Receiver:
    def __init__(self):
        self.delivered, self.dead, self.failures = [], collections.Counter(), []

    def deliver(self, notification):
        if notification["customer"] == "refused":
            raise RuntimeError("HTTP 400")
        self.delivered.append(notification["customer"])

    def relay(self, bs, topics, kind):
        return NotificationRelay(
            self.deliver,
            clients.base(bs),
            topics.input,  # the notifications: two partitions
            topics.group,
            topics.dlq,
            "notifier",
            kind,
            on_dead_letter=lambda reason: self.dead.update([reason]),
            on_failure=self.failures.append,
            timeout=15,
        )


def test_the_relay_delivers_what_was_committed_from_the_end_it_first_found_and_dead_letters_refusals(kafka_bootstrap_servers):
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "relay", partitions=2)
    kind = broker_kind.detect(clients.base(bs), 10)
    send(bs, topics.input, ["earlier"])  # delivered by whoever wrote it, before this relay's first start
    receiver = Receiver()
    relay = receiver.relay(bs, topics, kind).start()
    try:
        send(bs, topics.input, ["a", "refused", "b"])
        if broker_kind.profile(kind).hides_aborted:
            # An aborted batch's notifications (exactly-once): never delivered.
            send(bs, topics.input, ["aborted"], transactional_id=f"{topics.group}-t", abort=True)
            send(bs, topics.input, ["c"], transactional_id=f"{topics.group}-t")
        else:
            send(bs, topics.input, ["c"])
        wait_for(lambda: len(receiver.delivered) >= 3, timeout=60, what="the committed notifications delivered")
    finally:
        relay.stop()
    assert sorted(receiver.delivered) == ["a", "b", "c"]
    assert receiver.dead == {DELIVERY_FAILED: 1} and receiver.failures == []
    (dead,) = read_all(bs, topics.dlq)
    assert dead["key"] == "refused" and dead["headers"]["error_type"] == DELIVERY_FAILED and dead["headers"]["error_message"] == "HTTP 400"
    assert dead["headers"]["source_topic"] == topics.input and dead["headers"]["service"] == "notifier"

    # Started again: its position was committed after each delivery, so only what came since is
    # delivered; stopped at once, it delivers what was committed before the stop first.
    send(bs, topics.input, ["d"])
    again = Receiver()
    again.relay(bs, topics, kind).start().stop(timeout=60)
    assert again.delivered == ["d"] and again.failures == []


class RefusedGroup:
    """A consumer whose user may not use the relay's group (no Read on it in its KafkaUser)."""

    def committed(self, partitions, timeout):
        raise KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED, "Broker: Group authorization failed"))

    def close(self):
        pass


def test_a_relay_refused_its_group_stops_the_job_at_start_in_one_line_naming_it(monkeypatch):
    monkeypatch.setattr(clients, "new_admin", lambda conf: None)
    monkeypatch.setattr(clients, "topic_partitions", lambda admin, topic, timeout: [0])
    monkeypatch.setattr(clients, "new_consumer", lambda conf: RefusedGroup())
    relay = NotificationRelay(lambda n: None, {}, "notifications", "notifier", "notifier.dlq", "notifier", "kafka", print, print)
    with pytest.raises(SettingsError, match=r"cannot read 'notifications' in its group 'notifier.delivery': .*authorization failed"):
        relay.start()
