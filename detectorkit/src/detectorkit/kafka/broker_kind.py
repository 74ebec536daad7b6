"""Which broker a job talks to, and what that changes: its quirks become strategies chosen here.

Apache Kafka is the reference: the job reads ``read_committed`` (records of aborted upstream
transactions are never detected) and takes end offsets from ListOffsets, which then answers the
last stable offset. The embedded Tansu gets ListOffsets(latest) wrong and does not hide aborted
records anyway, so there the job reads ``read_uncommitted`` and takes end offsets from the high
watermark of Fetch responses (see `end_offsets.EndOffsetProbe`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import ConfigResource, ResourceType

from detectorkit.kafka import clients

AUTO, KAFKA, TANSU = "auto", "kafka", "tansu"
KINDS = (AUTO, KAFKA, TANSU)


def detect(base_conf: Mapping[str, Any], timeout: float) -> str:
    """KAFKA or TANSU. Tansu names its cluster "tansu_cluster" by default and describes no broker
    configuration at all; any broker that describes some, or refuses to, is taken for Kafka."""
    admin = clients.new_admin({**base_conf, "log_level": 0})
    metadata = admin.list_topics(timeout=timeout)
    if (metadata.cluster_id or "").startswith("tansu"):
        return TANSU
    if not metadata.brokers:
        return KAFKA
    resource = ConfigResource(ResourceType.BROKER, str(next(iter(metadata.brokers))))
    try:
        entries = next(iter(admin.describe_configs([resource], request_timeout=timeout).values())).result()
    except KafkaException:
        return KAFKA
    return KAFKA if entries else TANSU


def resolve(kind: str, base_conf: Mapping[str, Any], timeout: float) -> str:
    if kind not in KINDS:
        raise ValueError(f"broker kind must be one of {', '.join(KINDS)}, not {kind!r}")
    return detect(base_conf, timeout) if kind == AUTO else kind


def isolation_level(kind: str) -> str:
    return "read_committed" if kind == KAFKA else "read_uncommitted"
