"""confluent-kafka client configurations, tuned once here for every part of the runtime.

The values come from measurements on Tansu and hold on real Kafka (see the project's notes):
short session timeouts make group joins take seconds, not tens of seconds; a short
fetch.queue.backoff.ms keeps consumers from stalling once their queue fills; large producer
batches keep Tansu, which scans stored batches on every fetch, fast.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicCollection
from confluent_kafka.admin import AdminClient, NewTopic
from pydantic import SecretStr

from detectorkit.kafka.secrets import is_secret

# Fetch long-polls shorter than this livelock on Tansu; longer ones add latency at the end of a topic.
FETCH_WAIT_MAX_MS = 50


def base(bootstrap_servers: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, "log_level": 3}
    for key, value in (options or {}).items():
        conf[key] = SecretStr(value) if is_secret(key) and not isinstance(value, SecretStr) else value
    return conf


def reveal(conf: Mapping[str, Any]) -> dict[str, Any]:
    """The plain configuration librdkafka takes: only client constructors see secrets."""
    return {k: (v.get_secret_value() if isinstance(v, SecretStr) else v) for k, v in conf.items()}


def conf_key(conf: Mapping[str, Any]) -> str:
    """A key for caching clients per configuration; tells secrets apart without holding them."""
    return hashlib.sha256(json.dumps(reveal(conf), sort_keys=True, default=str).encode()).hexdigest()


def new_consumer(conf: Mapping[str, Any]) -> Consumer:
    return Consumer(reveal(conf))


def new_producer(conf: Mapping[str, Any]) -> Producer:
    return Producer(reveal(conf))


def new_admin(conf: Mapping[str, Any]) -> AdminClient:
    return AdminClient(reveal(conf))


def consumer(base_conf: Mapping[str, Any], group_id: str, **extra: Any) -> dict[str, Any]:
    conf = {
        **base_conf,
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        "fetch.queue.backoff.ms": 10,
        "fetch.wait.max.ms": FETCH_WAIT_MAX_MS,
        "fetch.max.bytes": 16 * 1024 * 1024,
        "max.partition.fetch.bytes": 4 * 1024 * 1024,
    }
    conf.update(extra)
    return conf


def producer(base_conf: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    conf = {
        **base_conf,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "batch.size": 1024 * 1024,
        "compression.type": "none",
    }
    conf.update(extra)
    return conf


class TopicAccessError(KafkaException):
    """The broker refused to describe a topic (not authorised, or another error than "not there")."""


# The only answers that mean a topic or partition is not there (deleted, or never created);
# anything else (authorisation above all) is no evidence that records were lost and must never be
# read as a deleted topic.
NOT_THERE = frozenset(
    {
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
        getattr(KafkaError, "UNKNOWN_TOPIC_ID", KafkaError.UNKNOWN_TOPIC_OR_PART),
    }
)


def is_not_there(exc: BaseException) -> bool:
    """True for an error that says the topic or partition is gone (LookupError is ours for that)."""
    if isinstance(exc, LookupError):
        return True
    return isinstance(exc, KafkaException) and bool(exc.args) and isinstance(exc.args[0], KafkaError) and exc.args[0].code() in NOT_THERE


T = TypeVar("T")

# librdkafka does not flag these as retriable, but they pass: a group coordinator or a partition
# leader that is moving or still loading, as on a fresh cluster or right after a broker restart
# (measured: FENCED_LEADER_EPOCH from ListOffsets for ~1 s after one).
TRANSIENT = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.OFFSET_NOT_AVAILABLE,
    }
)


def is_transient(exc: KafkaException) -> bool:
    error = exc.args[0]
    return error.retriable() or error.code() in TRANSIENT


def retrying(call: Callable[[], T], timeout: float) -> T:
    """`call`, again while the broker answers with a retriable or transient error, until `timeout`."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        try:
            return call()
        except KafkaException as exc:
            if not is_transient(exc) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


def topic_partitions(admin_or_consumer, topic: str, timeout: float) -> list[int]:
    """The topic's partition ids; KafkaException when the broker does not answer in time, LookupError
    when the topic does not exist, TopicAccessError when the broker refuses to say."""
    # All topics, not just this one: a Metadata request naming a topic creates it on brokers with
    # auto-creation on (Tansu always), and a job must not conjure up the topic it was told to read.
    metadata = admin_or_consumer.list_topics(timeout=timeout)
    entry = metadata.topics.get(topic)
    where = metadata.orig_broker_name or "the broker"
    error = entry.error if entry is not None else None
    if entry is None and isinstance(admin_or_consumer, AdminClient):
        # Kafka leaves out of a full listing the topics this user may not describe. Asked by
        # name (DescribeTopics never creates a topic), it says which: refused, or not there.
        future = next(iter(admin_or_consumer.describe_topics(TopicCollection([topic]), request_timeout=timeout).values()))
        try:
            future.result()
        except KafkaException as exc:
            error = exc.args[0]
    if error is not None and error.code() not in NOT_THERE:
        raise TopicAccessError(KafkaError(error.code(), f"cannot read topic {topic!r} on {where}: {error.str()}", fatal=True))
    if entry is None or entry.error is not None or not entry.partitions:
        raise LookupError(f"topic {topic!r} does not exist on {where}")
    return sorted(entry.partitions)


def topic_id(admin, topic: str, timeout: float) -> str | None:
    """The topic's id (KIP-516: a topic deleted and created again has a new one); None while it is
    not there."""
    future = next(iter(admin.describe_topics(TopicCollection([topic]), request_timeout=timeout).values()))
    try:
        return str(future.result().topic_id)
    except KafkaException as exc:
        if is_not_there(exc):
            return None
        raise


def missing_topics(admin, topics: Sequence[str], timeout: float, owner: str) -> str | None:
    """TOPICS_AS_CODE: the topics that do not exist, in one line saying where to make them (`owner`'s
    KafkaTopics); None when all are there."""
    missing = []
    for topic in topics:
        try:
            topic_partitions(admin, topic, timeout)
        except LookupError:
            missing.append(topic)
    if not missing:
        return None
    return f"TOPICS_AS_CODE=true and topic(s) {', '.join(missing)} do not exist: create them where the topics are defined ({owner})"


def create_topics(
    base_conf: Mapping[str, Any], topics: Mapping[str, int], timeout: float = 30.0, config: Mapping[str, str] | None = None
) -> list[str]:
    """Create the topics that do not exist yet, with topic `config`; returns the ones created."""
    admin = new_admin(base_conf)
    existing = admin.list_topics(timeout=timeout).topics
    wanted = [
        NewTopic(name, num_partitions=n, replication_factor=-1, config=dict(config or {})) for name, n in topics.items() if name not in existing
    ]
    if not wanted:
        return []
    created = []
    for name, future in admin.create_topics(wanted, operation_timeout=timeout, request_timeout=timeout).items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                raise
    _await_leaders(admin, {name: topics[name] for name in created}, timeout)
    return created


def _await_leaders(admin, topics: Mapping[str, int], timeout: float) -> None:
    """Until the metadata shows each topic's partitions with a leader: CreateTopics answers once the
    controller has the topic, before the brokers do, and a client asking at once (for its offsets,
    say) is told _UNKNOWN_PARTITION."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while topics:
        listed = admin.list_topics(timeout=timeout).topics
        topics = {name: n for name, n in topics.items() if not _led(listed.get(name), n)}
        if not topics:
            return
        if time.monotonic() + delay > deadline:
            name = next(iter(topics))
            why = f"topic {name!r} was created but the metadata shows no leader for it within {timeout:g} s"
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, why))
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def _led(entry, partitions: int) -> bool:
    if entry is None or entry.error is not None or len(entry.partitions) < partitions:
        return False
    return all(p.leader >= 0 for p in entry.partitions.values())
