"""The notifier's outbox relay: delivers the notifications its batches committed to its output topic.

The notifier's batches run as any stage's: their notifications are outputs, written and committed
by the runtime's commit sequence (with exactly-once, in the batch's transactions). This relay, in
the notifier's process, reads that topic in a consumer group of its own (`<group>.delivery`, read
committed where the broker hides aborted records, so an aborted batch's notifications are never
delivered), delivers each one and only then commits its position: a delivery is at-least-once, and
the `Idempotency-Key` each one carries (its customer and window) lets a receiver drop a repeat. A
delivery that keeps failing goes to the notifier's dead-letter topic with the reason.

A delivery's retries hold the relay, never a batch. On its first start the relay begins at the
topic's end (what an older version delivered itself is not delivered again); a partition added
later is read from its first record. Stopping delivers what was committed up to then first.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from detectorkit.kafka import broker_kind, clients
from detectorkit.kafka import sink as sinks
from detectorkit.kafka.end_offsets import open_end_offsets
from detectorkit.records import dead_letter_headers
from detectorkit.settings import SettingsError

log = structlog.get_logger("detectorkit.notifier")

DELIVERY_FAILED = "delivery_failed"


def delivery_group(group: str) -> str:
    """The relay's consumer group, beside the notifier's own `group`."""
    return f"{group}.delivery"


class NotificationRelay:
    def __init__(
        self,
        deliver: Callable[[dict[str, Any]], None],
        base_conf: Mapping[str, Any],
        topic: str,
        group: str,
        dlq_topic: str,
        service: str,
        kind: str,
        on_dead_letter: Callable[[str], None],
        on_failure: Callable[[str], None],
        timeout: float = 30.0,
    ):
        self._deliver = deliver
        self.base, self.topic, self.group, self.dlq_topic, self.service = dict(base_conf), topic, delivery_group(group), dlq_topic, service
        self.kind, self.timeout = kind, timeout
        self._on_dead_letter, self._on_failure = on_dead_letter, on_failure
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.delivered = 0

    def start(self) -> NotificationRelay:
        try:
            self._start_at_the_end()
        except KafkaException as exc:  # its user lacks the rights on the topic or the group, above all
            raise SettingsError(f"the notification relay cannot read {self.topic!r} in its group {self.group!r}: {exc.args[0].str()}") from None
        conf = clients.consumer(
            self.base,
            self.group,
            **{
                "isolation.level": broker_kind.isolation_level(self.kind),
                "auto.offset.reset": "earliest",  # only a partition with no commit: one added since the first start
                "enable.partition.eof": True,
                # Deliveries run between polls, and a webhook's retries may take minutes.
                "max.poll.interval.ms": 30 * 60 * 1000,
                # The topic may be created after the relay subscribes (the notifier's first start).
                "topic.metadata.refresh.interval.ms": 5000,
            },
        )
        self._consumer = clients.new_consumer(conf)
        self._consumer.subscribe([self.topic])
        self._thread = threading.Thread(target=self._run, name="notification-relay", daemon=True)
        self._thread.start()
        return self

    def _start_at_the_end(self) -> None:
        """The first start's position, committed at once: the topic's end now, before any batch of
        this notifier writes (what is there was delivered by whoever wrote it)."""
        admin = clients.new_admin(self.base)
        try:
            partitions = clients.topic_partitions(admin, self.topic, self.timeout)
        except LookupError:
            return  # not created yet: everything in it will be new
        probe = clients.new_consumer(clients.consumer(self.base, self.group))
        try:
            committed = probe.committed([TopicPartition(self.topic, p) for p in partitions], timeout=self.timeout)
            missing = [tp.partition for tp in committed if tp.offset < 0]
            if missing:
                at = self._ends_now(set(missing))
                probe.commit(offsets=[TopicPartition(self.topic, p, o) for p, o in at.items()], asynchronous=False)
        finally:
            probe.close()

    def _run(self) -> None:
        try:
            with sinks.for_worker(clients.producer(self.base)) as dlq:
                self._loop(dlq)
        except Exception as exc:  # noqa: BLE001 - a relay that stops delivering must stop the job, saying why
            self._on_failure(f"notification relay: {type(exc).__name__}: {exc}")
        finally:
            self._consumer.close()

    def _loop(self, dlq: sinks.Sink) -> None:
        reached: dict[int, int] = {}  # how far each partition has been read: delivered, or found at its end
        ends: dict[int, int] | None = None  # once stopping: where each partition ended then
        while True:
            delivered = {}
            for message in self._consumer.consume(100, 0.2):
                error = message.error()
                if error is None:
                    self._deliver_one(message, dlq)
                    delivered[message.partition()] = message.offset() + 1
                elif error.code() == KafkaError._PARTITION_EOF:
                    reached[message.partition()] = max(reached.get(message.partition(), 0), message.offset())
                elif error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise KafkaException(error)
            if delivered:
                dlq.flush(self.timeout)  # its dead letters written before the position moves past them
                self._consumer.commit(offsets=[TopicPartition(self.topic, p, o) for p, o in delivered.items()], asynchronous=False)
                for p, o in delivered.items():
                    reached[p] = max(reached.get(p, 0), o)
            if self._stopping.is_set():
                assigned = {tp.partition for tp in self._consumer.assignment()}
                if ends is None and assigned:
                    ends = self._ends_now(assigned)
                done = ends is not None and all(reached.get(p, 0) >= ends.get(p, 0) for p in assigned)
                if done or time.monotonic() > self._deadline:
                    return

    def _ends_now(self, partitions: set[int]) -> dict[int, int]:
        ends = open_end_offsets(self.kind, self.base, self.group, self.topic, self.timeout)
        try:
            return ends.end_offsets(sorted(partitions), confirmed=True)
        finally:
            ends.close()

    def _deliver_one(self, message, dlq: sinks.Sink) -> None:
        notification = json.loads(message.value())
        try:
            self._deliver(notification)
        except Exception as exc:  # noqa: BLE001 - any failure of a delivery is a dead letter
            headers = dead_letter_headers(self.service, DELIVERY_FAILED, str(exc), self.topic, message.partition(), message.offset())
            dlq.send(self.dlq_topic, message.key(), message.value(), headers)
            self._on_dead_letter(DELIVERY_FAILED)
            return
        self.delivered += 1

    def stop(self, timeout: float = 60.0) -> None:
        """Deliver what is committed now (up to `timeout`), then leave the group."""
        if self._thread is None:
            return
        self._deadline = time.monotonic() + timeout
        self._stopping.set()
        self._thread.join(timeout + self.timeout)
        self._thread = None
