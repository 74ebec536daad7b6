"""The Kafka resources a job needs, as Strimzi's custom resources: the topics the service owns
(`KafkaTopic`: its dead letters, its state's changelog) and its user with exactly the rights the job
uses (`KafkaUser`, simple authorization). Written from the job's own settings and detector, so they
name what the job will ask for; with TOPICS_AS_CODE=true the job creates nothing and stops at start
if one is missing.

The input, output and metrics topics are shared (the upstream's, the downstream's, the platform's):
their owners declare them; the user only gets the rights on them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

API_VERSION = "kafka.strimzi.io/v1"
# Strimzi's label naming the Kafka cluster a resource belongs to.
CLUSTER_LABEL = "strimzi.io/cluster"
# What Strimzi's User Operator makes for each kind of authentication: a Secret named after the
# user with the client certificate and key (tls), or the password (scram-sha-512).
AUTHENTICATIONS = ("tls", "scram-sha-512")


@dataclass(frozen=True)
class Service:
    """What the resources are written from: the job's settings and its state's changelog."""

    name: str
    input_topic: str
    output_topic: str
    dlq_topic: str
    consumer_group: str
    partitions: int  # the input's, and so its changelog's
    exactly_once: bool
    metrics_topic: str | None  # None: on another cluster, whose user writes it
    changelog: str | None = None
    changelog_config: dict[str, str] = field(default_factory=dict)
    # What it reads beside its input, each in a consumer group of its own: (topic, group).
    also_reads: tuple[tuple[str, str], ...] = ()
    # Its repartition topic (runtime.repartition), also its feeder's consumer group; None: none.
    repartition: str | None = None
    repartition_config: dict[str, str] = field(default_factory=dict)


def manifests(service: Service, cluster: str, authentication: str = "tls", replicas: int = 3) -> list[dict[str, Any]]:
    """The service's KafkaTopics and its KafkaUser (named for the service)."""
    labels = {CLUSTER_LABEL: cluster, "app.kubernetes.io/name": service.name}
    owned = [topic(service.dlq_topic, service.partitions, replicas, {}, labels)]
    if service.changelog is not None:
        # The input's partition count: a key's state lives in the partition its records come from.
        owned.append(topic(service.changelog, service.partitions, replicas, dict(service.changelog_config), labels))
    if service.repartition is not None:
        owned.append(topic(service.repartition, service.partitions, replicas, dict(service.repartition_config), labels))
    return [*owned, user(service.name, authentication, labels, acls(service))]


def topic(name: str, partitions: int, replicas: int, config: dict[str, str], labels: dict[str, str]) -> dict[str, Any]:
    spec: dict[str, Any] = {"topicName": name, "partitions": partitions, "replicas": replicas}
    if config:
        spec["config"] = config
    return {"apiVersion": API_VERSION, "kind": "KafkaTopic", "metadata": {"name": resource_name(name), "labels": dict(labels)}, "spec": spec}


def acls(service: Service) -> list[dict[str, Any]]:
    """Exactly what the job does: reads the input as a member of its group, writes detections, dead
    letters and metrics, reads and writes its changelog, and (exactly-once) runs transactions under
    ids that start with the group's name (kafka.transactions.transactional_id)."""

    rules = [
        rule("topic", service.input_topic, ["Read", "Describe"]),
        rule("group", service.consumer_group, ["Read", "Describe"]),
        rule("topic", service.output_topic, ["Write", "Describe"]),
        rule("topic", service.dlq_topic, ["Write", "Describe"]),
    ]
    if service.metrics_topic is not None:
        rules.append(rule("topic", service.metrics_topic, ["Write", "Describe"]))
    if service.changelog is not None:
        rules.append(rule("topic", service.changelog, ["Read", "Write", "Describe"]))
    for topic_name, group in service.also_reads:
        rules += [rule("topic", topic_name, ["Read", "Describe"]), rule("group", group, ["Read", "Describe"])]
    if service.repartition is not None:
        # Its feeder writes the topic in a group of that name; the job reads it in its own.
        rules += [rule("topic", service.repartition, ["Read", "Write", "Describe"]), rule("group", service.repartition, ["Read", "Describe"])]
    if service.exactly_once:
        rules.append(rule("transactionalId", f"{service.consumer_group}-", ["Write", "Describe"], pattern="prefix"))
        if service.repartition is not None:
            rules.append(rule("transactionalId", f"{service.repartition}-", ["Write", "Describe"], pattern="prefix"))
    # Nothing on the cluster: idempotent producers need only Write on their topics (Kafka 3.0,
    # KIP-679), and with the topics made elsewhere the job describes no configuration.
    return merged(rules)


def merged(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One rule per resource, with the operations of all that name it (the notifier writes and its
    relay reads the same topic): an ACL twice is refused by Kafka's CreateAcls."""
    by_resource: dict[tuple, dict[str, Any]] = {}
    for r in rules:
        key = tuple(r["resource"].values())
        if key in by_resource:
            ops = by_resource[key]["operations"]
            ops += [op for op in r["operations"] if op not in ops]
        else:
            by_resource[key] = {**r, "operations": list(r["operations"])}
    return list(by_resource.values())


def rule(kind: str, name: str, operations: list[str], pattern: str = "literal") -> dict[str, Any]:
    """One of a KafkaUser's simple-authorization ACLs: `operations` on the resource, from any host."""
    return {"resource": {"type": kind, "name": name, "patternType": pattern}, "operations": operations, "host": "*"}


def user(name: str, authentication: str, labels: dict[str, str], rules: list[dict[str, Any]]) -> dict[str, Any]:
    if authentication not in AUTHENTICATIONS:
        raise ValueError(f"authentication {authentication!r}: one of {', '.join(AUTHENTICATIONS)}")
    return {
        "apiVersion": API_VERSION,
        "kind": "KafkaUser",
        "metadata": {"name": resource_name(name), "labels": dict(labels)},
        "spec": {"authentication": {"type": authentication}, "authorization": {"type": "simple", "acls": rules}},
    }


def resource_name(topic_name: str) -> str:
    """A Kubernetes name for a topic's resource (lower case, digits, '-' and '.'), as Strimzi's Topic
    Operator names the ones it finds; the topic's own name stays in spec.topicName."""
    name = re.sub(r"[^a-z0-9.-]", "-", topic_name.lower()).strip(".-")
    return name[:253] or "topic"


def add_arguments(parser) -> None:
    """The options of every `kafka-manifests` command: which cluster, how its user authenticates."""
    parser.add_argument("--cluster", required=True, help="the Strimzi Kafka cluster's name (the strimzi.io/cluster label)")
    parser.add_argument("--authentication", choices=AUTHENTICATIONS, default="tls", help="the user's authentication (default: tls)")
    parser.add_argument("--replicas", type=int, default=3, help="replicas of the topics it owns (default: 3)")


def as_yaml(docs: list[dict[str, Any]], written_by: str) -> str:
    """The resources as one YAML stream, headed by the command that writes them; ImportError saying
    what to install where PyYAML is missing (a service's image has no dev tools)."""
    try:
        import yaml
    except ImportError:
        raise ImportError("kafka-manifests writes YAML with PyYAML: pip install 'detectorkit[dev]'") from None
    header = f"# Written by `{written_by}`; a test compares them with what it would write.\n"
    return header + yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True)
