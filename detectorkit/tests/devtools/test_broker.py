"""The embedded broker launcher and the `detectorkit broker` command."""

import signal
import subprocess
import sys
import time

import pytest
from confluent_kafka.admin import AdminClient

from detectorkit.devtools.embedded_broker import BrokerError, EmbeddedBroker


def answers(bootstrap):
    try:
        AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=2)
        return True
    except Exception:
        return False


def test_starts_on_a_free_loopback_port_and_stops():
    with EmbeddedBroker() as broker:
        assert broker.bootstrap_servers.startswith("127.0.0.1:")
        assert answers(broker.bootstrap_servers)
        process = broker.process
    assert process.poll() is not None
    assert not answers(broker.bootstrap_servers)


def test_two_brokers_side_by_side():
    with EmbeddedBroker() as a, EmbeddedBroker() as b:
        assert a.bootstrap_servers != b.bootstrap_servers
        assert answers(a.bootstrap_servers) and answers(b.bootstrap_servers)


def test_a_taken_port_is_a_clear_error():
    with EmbeddedBroker() as broker:
        port = int(broker.bootstrap_servers.rsplit(":", 1)[1])
        with pytest.raises(BrokerError, match="Tansu"):
            EmbeddedBroker(port=port, startup_timeout=5).start()


def test_command_prints_the_address_creates_topics_and_stops_on_sigterm():
    command = [sys.executable, "-m", "detectorkit", "broker", "--topics", "a", "b", "--partitions", "3"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        bootstrap = process.stdout.readline().strip()
        assert bootstrap.startswith("127.0.0.1:")
        admin = AdminClient({"bootstrap.servers": bootstrap})
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            topics = admin.list_topics(timeout=5).topics
            if {"a", "b"} <= set(topics):
                break
            time.sleep(0.1)
        assert len(topics["a"].partitions) == 3 and len(topics["b"].partitions) == 3
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        process.kill()
    assert not answers(bootstrap)


def test_kafka_engine_keeps_its_log_and_address_across_restarts_on_a_data_dir(tmp_path):
    from detectorkit.devtools.kafka_broker import run_tool
    from detectorkit.pytest_plugin import _kafka_can_start
    from detectorkit.samples import Sample
    from detectorkit.testing import produce, read_all

    if not _kafka_can_start():
        pytest.skip("starting Apache Kafka needs Java and Maven (or the cached jars)")
    command = [sys.executable, "-m", "detectorkit", "broker", "--engine", "kafka", "--data-dir", str(tmp_path), "--topics", "kept"]
    addresses = []
    for _ in range(2):
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            addresses.append(process.stdout.readline().strip())
            assert addresses[-1].startswith("127.0.0.1:"), process.stderr.read() if process.poll() is not None else ""
            deadline = time.monotonic() + 30
            while "kept" not in AdminClient({"bootstrap.servers": addresses[-1]}).list_topics(timeout=5).topics:
                assert time.monotonic() < deadline, "the topic was not created"
                time.sleep(0.1)
            described = run_tool(
                "topics", ["--bootstrap-server", addresses[-1], "--describe", "--topic", "kept"], capture_output=True, text=True, timeout=60
            )
            assert "PartitionCount: 8" in described.stdout, described.stdout + described.stderr
            if len(addresses) == 1:
                produce(addresses[-1], "kept", [Sample(b"k", b"written before the restart", "valid")])
            else:
                assert [m["value"] for m in read_all(addresses[-1], "kept")] == ["written before the restart"]
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0
        finally:
            process.kill()
        assert not answers(addresses[-1])
    assert addresses[0] == addresses[1]


def test_tansu_refuses_a_data_dir():
    done = subprocess.run([sys.executable, "-m", "detectorkit", "broker", "--data-dir", "/tmp/x"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--engine kafka" in done.stderr


def test_cluster_ids_never_look_like_an_option(monkeypatch):
    import uuid as uuid_module

    from detectorkit.devtools import kafka_broker

    # 0xf8... encodes to a leading '-' in URL-safe base64: the first draw must be refused.
    draws = iter([uuid_module.UUID(int=0xF8 << 120), uuid_module.UUID(int=1)])
    monkeypatch.setattr(kafka_broker.uuid, "uuid4", lambda: next(draws))
    assert kafka_broker.cluster_id() == "AAAAAAAAAAAAAAAAAAAAAQ"


def test_the_kafka_launcher_deletes_no_record_for_its_age(kafka_bootstrap_servers, kafka_broker_kind):
    """Records stamped with event times days old (the samples, a backfill through the normaliser)
    must not vanish under Kafka's 7-day time retention a moment after they are written: seen as a
    test that read an output topic whose first records the broker's retention check had deleted."""
    if kafka_broker_kind != "kafka":
        pytest.skip("a property of the Apache Kafka launcher (kafka_broker.KafkaBroker)")
    from confluent_kafka.admin import ConfigResource

    from detectorkit.kafka import clients
    from detectorkit.testing import create_test_topics

    topic = create_test_topics(kafka_bootstrap_servers, "retention", partitions=1).output
    admin = clients.new_admin(clients.base(kafka_bootstrap_servers))
    (future,) = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values()
    assert future.result(timeout=30)["retention.ms"].value == "-1"
