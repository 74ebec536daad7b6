"""Which broker a job talks to, and what that changes: its gaps become a profile (`BrokerProfile`)
that the rest of the runtime asks, so no module below the job plan tests a broker's name.

Apache Kafka is the reference: the job reads ``read_committed`` (records of aborted upstream
transactions are never detected) and takes end offsets from ListOffsets, which then answers the
last stable offset. The embedded Tansu gets ListOffsets(latest) wrong and does not hide aborted
records anyway, so there the job reads ``read_uncommitted`` and takes end offsets from the high
watermark of Fetch responses (see `end_offsets.EndOffsetProbe`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class BrokerProfile:
    """What a broker does of what the runtime relies on. Apache Kafka does all of it; the embedded
    Tansu has the gaps each field names, worked around where the field is read."""

    kind: str
    # ListOffsets(latest) answers the end of a partition (Tansu: no; ends come from Fetch's high watermark).
    lists_latest: bool = True
    # read_committed consumers never see aborted transactions' records (Tansu: they do, so
    # exactly-once cannot hold there and reading read_committed gains nothing).
    hides_aborted: bool = True
    # A committed offset keeps its metadata (Tansu: dropped; the changelog's position goes there).
    keeps_commit_metadata: bool = True
    # Topics take cleanup.policy=compact and their other configs (Tansu: refused, the changelog grows).
    compacts: bool = True

    @property
    def isolation_level(self) -> str:
        return "read_committed" if self.hides_aborted else "read_uncommitted"


_PROFILES = {
    KAFKA: BrokerProfile(KAFKA),
    TANSU: BrokerProfile(TANSU, lists_latest=False, hides_aborted=False, keeps_commit_metadata=False, compacts=False),
}


def profile(kind: str) -> BrokerProfile:
    """The profile of a resolved kind (KAFKA or TANSU)."""
    if kind not in _PROFILES:
        raise ValueError(f"broker kind must be resolved to one of {', '.join(_PROFILES)}, not {kind!r}")
    return _PROFILES[kind]


def isolation_level(kind: str) -> str:
    """read_committed only where it is known to hide aborted records (an unresolved AUTO is not)."""
    return _PROFILES[kind].isolation_level if kind in _PROFILES else "read_uncommitted"
