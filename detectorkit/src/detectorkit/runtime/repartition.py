"""Keys from any field: a job whose detector keys its state by a field that is not the input's Kafka
key (`Detector(key_field="merchant", repartition=True)`) re-keys its input through a topic of its
own, as Kafka Streams' `groupBy` does through a repartition topic.

The job runs two readers in one process, each a `StreamJob` with its consumer group:
  - the feeder (`RepartitionStage`, group `<group>.repartition`) reads the input and writes each
    record's value unchanged to `<group>.repartition`, keyed by the field's value (as text), with
    the record's Kafka timestamp; a record that is not a JSON object or lacks the field is a dead
    letter. Under exactly-once each input partition's records and its next offset go in one
    transaction, as any stage's;
  - the detector reads `<group>.repartition` (read_committed on Apache Kafka), from its first
    record when its group has no position: a key's records now come from one partition, in the
    order the feeder wrote them.
With SLICE_SECONDS each reader's slices run on half of the session's cores (JobPlan.readers):
with all of them, one reader's slice would wait for the other's to end.
The topic has the input's partition count and is created at start like the changelog (with
TOPICS_AS_CODE, checked instead); `kafka-manifests` declares it and the rights on it.

A key's records reach it in the order the feeder read them from the input partitions, which may
interleave them otherwise than their event times: the rule's grace must cover how far apart two
input partitions run (each is read in offset order, so a key from one input partition keeps its
order). Under at-least-once a replayed feeder batch lands twice, and a rule counts it twice:
exactly-once is the guarantee a repartitioned rule keeps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from detectorkit import records as rec
from detectorkit.detector import NoConfig
from detectorkit.kafka import clients
from detectorkit.runtime.stage import Output, Source, StageBase
from detectorkit.settings import SettingsError, check_topic_name

SUFFIX = ".repartition"
# Deleted once read by every reader: a week, as the consumer group's offsets are kept.
TOPIC_CONFIG = {"cleanup.policy": "delete", "retention.ms": str(7 * 24 * 3600 * 1000)}


def topic_of(group: str) -> str:
    """The repartition topic of the consumer group `group` (also the feeder's group)."""
    return check_topic_name(f"{group}{SUFFIX}")


@dataclasses.dataclass(frozen=True)
class RepartitionStage(StageBase):
    """Each record's value unchanged, keyed by its `field` (as text), at its Kafka timestamp."""

    name: str
    field: str
    reasons: tuple[str, ...] = (rec.MALFORMED_JSON, rec.NOT_AN_OBJECT, rec.MISSING_FIELD)
    counts_as_detection: bool = False
    decode: rec.Decode | None = None  # None: JSON
    feeds_repartition: bool = True

    def load_config(self) -> NoConfig:
        return NoConfig()

    def reading(self, decode: rec.Decode) -> RepartitionStage:
        reasons = self.reasons if rec.UNDECODABLE in self.reasons else (*self.reasons, rec.UNDECODABLE)
        return dataclasses.replace(self, decode=decode, reasons=reasons)

    def run(self, values: pa.Array, config: Any, source: Callable[[int], Source], service: str) -> tuple[list[Output], list[rec.Rejected]]:
        frame, rejected = rec.parse_arrow(values, (self.field,), self.decode)
        # As the detector's side reads a key from a field (runtime.stage._keyed_by_field): the same text.
        keys = frame[self.field].astype(str).tolist() if len(frame) else []
        raw = values.to_pylist()
        outputs = [
            Output(position, {}, key=key, timestamp_ms=source(position).timestamp_ms, raw=raw[position])
            for position, key in zip(frame.index.tolist(), keys, strict=True)
        ]
        return outputs, rejected


def create(base_conf: Mapping[str, Any], topic: str, input_topic: str, timeout: float) -> None:
    """The repartition topic with the input's partition count; SettingsError when one exists with another."""
    admin = clients.new_admin(base_conf)
    wanted = len(clients.topic_partitions(admin, input_topic, timeout))
    if topic in clients.create_topics(base_conf, {topic: wanted}, timeout, config=TOPIC_CONFIG):
        return
    have = len(clients.topic_partitions(admin, topic, timeout))
    if have != wanted:
        raise SettingsError(
            f"the repartition topic {topic!r} has {have} partition(s), the input {input_topic!r} {wanted}: delete it, or make them agree"
        )


def require(base_conf: Mapping[str, Any], topic: str, input_topic: str, timeout: float) -> None:
    """TOPICS_AS_CODE: the repartition topic made elsewhere; SettingsError in one line when it is missing."""
    admin = clients.new_admin(base_conf)
    try:
        clients.topic_partitions(admin, topic, timeout)
    except LookupError:
        wanted = len(clients.topic_partitions(admin, input_topic, timeout))
        settings = ", ".join(f"{k}={v}" for k, v in TOPIC_CONFIG.items())
        raise SettingsError(
            f"TOPICS_AS_CODE=true and the repartition topic {topic!r} does not exist: create it where the topics are defined, "
            f"with {wanted} partitions (the input's) and {settings}"
        ) from None
