"""Strimzi's resources a service needs (detectorkit.manifests, `<service> kafka-manifests`): the topics
it owns and its user's rights, from its settings and detector. Applied to a real broker's ACLs in
runtime/test_on_kafka.py; validated against Strimzi's schemas in the template's tests/test_deploy.py."""

import pytest

from detectorkit import manifests
from detectorkit.cli.manifests import service_of
from detectorkit.cli.run import run_detector
from detectorkit.kafka import transactions
from detectorkit.runtime.stage import as_stage
from detectorkit.settings import Settings
from detectorkit.state.changelog import TOPIC_CONFIG

from .detectors import COUNT, THRESHOLD


def settings(**extra):
    return Settings(input_topic="in", output_topic="out", dlq_topic="svc.dlq", consumer_group="svc", topic_partitions=6, **extra)


def rights(user):
    acls = user["spec"]["authorization"]["acls"]
    return {(r["resource"]["type"], r["resource"].get("name"), r["resource"].get("patternType")): r["operations"] for r in acls}


def test_a_stateful_exactly_once_service_owns_its_dead_letters_and_changelog_and_may_use_its_transactional_ids():
    changelog = as_stage(COUNT).state.changelog_topic("svc")
    docs = manifests.manifests(service_of(settings(processing_guarantee="exactly-once"), "svc", as_stage(COUNT).state), "main")
    topics = {d["spec"]["topicName"]: d for d in docs if d["kind"] == "KafkaTopic"}
    assert set(topics) == {"svc.dlq", changelog}
    assert topics[changelog]["spec"]["config"] == TOPIC_CONFIG and topics[changelog]["spec"]["partitions"] == 6
    assert all(d["metadata"]["labels"]["strimzi.io/cluster"] == "main" for d in docs)
    (user,) = [d for d in docs if d["kind"] == "KafkaUser"]
    granted = rights(user)
    assert granted[("topic", "in", "literal")] == ["Read", "Describe"]
    assert granted[("group", "svc", "literal")] == ["Read", "Describe"]
    assert granted[("topic", changelog, "literal")] == ["Read", "Write", "Describe"]
    # The prefix covers every id the job's transactions use.
    ((_, prefix, _),) = [k for k in granted if k[0] == "transactionalId"]
    assert transactions.transactional_id("svc", "in", 5).startswith(prefix)
    assert granted[("transactionalId", prefix, "prefix")] == ["Write", "Describe"]
    # Nothing it does not do: no Create (the topics are made elsewhere), no Delete, no Alter, nothing
    # on the cluster (a job with only these rights runs: runtime/test_on_kafka.py).
    assert not {op for ops in granted.values() for op in ops} & {"Create", "Delete", "Alter", "All"}
    assert not [k for k in granted if k[0] == "cluster"]
    # The default runs exactly-once on Apache Kafka, which a Strimzi cluster is: the same rights.
    assert manifests.manifests(service_of(settings(), "svc", as_stage(COUNT).state), "main") == docs


def test_a_stateless_at_least_once_service_gets_no_changelog_and_no_transactions_and_no_metrics_on_another_cluster():
    stateless = service_of(settings(processing_guarantee="at-least-once", metrics_bootstrap_servers="metrics:9092"), "svc", None)
    docs = manifests.manifests(stateless, "main", authentication="scram-sha-512")
    assert [d["spec"]["topicName"] for d in docs if d["kind"] == "KafkaTopic"] == ["svc.dlq"]
    (user,) = [d for d in docs if d["kind"] == "KafkaUser"]
    assert user["spec"]["authentication"] == {"type": "scram-sha-512"}
    assert not [k for k in rights(user) if k[0] == "transactionalId" or k[1] == "metrics"]
    with pytest.raises(ValueError, match="one of tls, scram-sha-512"):
        manifests.manifests(stateless, "main", authentication="plain")


def test_a_topic_name_kubernetes_refuses_is_kept_in_the_spec_and_its_resource_renamed():
    (doc,) = [manifests.topic("Orders_V2.dlq", 1, 3, {}, {})]
    assert doc["metadata"]["name"] == "orders-v2.dlq" and doc["spec"]["topicName"] == "Orders_V2.dlq"


def test_the_service_prints_them_as_yaml_from_its_settings(capsys, monkeypatch):
    yaml = pytest.importorskip("yaml")
    monkeypatch.setenv("PROCESSING_GUARANTEE", "exactly-once")
    code = run_detector(THRESHOLD, ["kafka-manifests", "--cluster", "main"], {"input_topic": "in", "consumer_group": "svc", "dlq_topic": "svc.dlq"})
    assert code == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["KafkaTopic", "KafkaUser"]
    assert docs[1]["metadata"]["name"] == THRESHOLD.name
    assert any(r["resource"]["type"] == "transactionalId" for r in docs[1]["spec"]["authorization"]["acls"])


def test_the_notifier_may_read_its_own_output_in_its_relays_group_in_one_rule_per_topic():
    from detectorkit.roles.notifier import Notifier

    stage = Notifier()
    s = settings().model_copy(update={"output_topic": "notifications"})
    (user,) = [d for d in manifests.manifests(service_of(s, "notifier", stage.state, stage.also_reads(s)), "main") if d["kind"] == "KafkaUser"]
    granted = rights(user)
    assert granted[("topic", "notifications", "literal")] == ["Write", "Describe", "Read"]
    assert granted[("group", "svc.delivery", "literal")] == ["Read", "Describe"]
    resources = [tuple(r["resource"].values()) for r in user["spec"]["authorization"]["acls"]]
    assert len(resources) == len(set(resources))  # Kafka refuses the same ACL twice
