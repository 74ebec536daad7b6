"""The aggregation rules, without Kafka: table semantics, monotonic counters, gauge expiry,
histogram merge, malformed snapshots."""

import json

import pytest
from confluent_kafka import KafkaError, KafkaException
from prometheus_client import CollectorRegistry, generate_latest

from detectorkit.metrics import snapshot as snap
from detectorkit.metrics.aggregator import AggregateCollector, Aggregator
from detectorkit.metrics.registry import JobMetrics

READ = ("detector_records_read_total", ())
UP = ("detector_instances_up", ())


def snapshot(instance, *, service="svc", started_at=100.0, timestamp=110.0, read=0.0, lag=None, buckets=None):
    families = [snap.Family("detector_records_read", "counter", "Input records.", [("detector_records_read_total", {}, read)])]
    if lag is not None:
        families.append(
            snap.Family(
                "detector_consumer_lag_records", "gauge", "Lag.", [("detector_consumer_lag_records", {"partition": p}, v) for p, v in lag.items()]
            )
        )
    if buckets is not None:
        samples = [("detector_end_to_end_latency_seconds_bucket", {"le": le}, v) for le, v in buckets.items()]
        samples += [
            ("detector_end_to_end_latency_seconds_count", {}, buckets["+Inf"]),
            ("detector_end_to_end_latency_seconds_sum", {}, buckets["+Inf"] * 0.1),
        ]
        families.append(snap.Family("detector_end_to_end_latency_seconds", "histogram", "Latency.", samples))
    return instance.encode(), snap.Snapshot(service, instance, started_at, timestamp, families).to_json()


def total(agg, series=READ, service="svc", now=115.0):
    return agg.totals(now)[service].get(series)


def test_latest_snapshot_per_instance_wins():
    agg = Aggregator(ttl_seconds=30)
    agg.apply(*snapshot("a", read=10))
    agg.apply(*snapshot("a", read=25, timestamp=120))
    assert total(agg) == 25


def test_counters_sum_over_instances_and_services_stay_apart():
    agg = Aggregator()
    agg.apply(*snapshot("a", read=10))
    agg.apply(*snapshot("b", read=5))
    agg.apply(*snapshot("c", read=7, service="other"))
    assert total(agg) == 15
    assert total(agg, service="other") == 7


def test_scale_down_keeps_the_stopped_instance_in_counters_but_not_in_up():
    agg = Aggregator(ttl_seconds=30)
    agg.apply(*snapshot("a", read=10, timestamp=110))
    agg.apply(*snapshot("b", read=5, timestamp=110))
    agg.apply(*snapshot("a", read=40, timestamp=200))
    assert total(agg, now=205) == 45
    assert total(agg, UP, now=205) == 1
    assert total(agg, UP, now=115) == 2


def test_restart_with_counters_back_at_zero_adds_to_the_earlier_run():
    agg = Aggregator()
    agg.apply(*snapshot("a", read=100, started_at=100))
    agg.apply(*snapshot("a", read=0, started_at=300, timestamp=301))
    assert total(agg, now=305) == 100  # no drop
    agg.apply(*snapshot("a", read=30, started_at=300, timestamp=311))
    assert total(agg, now=315) == 130  # no double count either
    agg.apply(*snapshot("a", read=5, started_at=500, timestamp=501))
    assert total(agg, now=505) == 135


def test_a_late_snapshot_of_an_earlier_run_is_ignored():
    agg = Aggregator()
    agg.apply(*snapshot("a", read=100, started_at=100))
    agg.apply(*snapshot("a", read=10, started_at=300, timestamp=301))
    agg.apply(*snapshot("a", read=90, started_at=100, timestamp=150))
    assert total(agg, now=305) == 110


def test_replaying_the_topic_gives_the_same_totals():
    records = [
        snapshot("a", read=50),
        snapshot("b", read=5),
        snapshot("a", read=0, started_at=200, timestamp=201),
        snapshot("a", read=9, started_at=200, timestamp=211),
        snapshot("b", read=8, timestamp=212),
    ]
    first, second = Aggregator(), Aggregator()
    for r in records:
        first.apply(*r)
    for r in records:
        second.apply(*r)
    assert first.totals(220) == second.totals(220)
    assert total(first, now=220) == 67


def test_gauges_expire_after_the_ttl():
    agg = Aggregator(ttl_seconds=30)
    agg.apply(*snapshot("a", lag={"0": 5, "1": 2}, timestamp=100))
    agg.apply(*snapshot("b", lag={"2": 7}, timestamp=130))
    lag0 = ("detector_consumer_lag_records", (("partition", "0"),))
    lag2 = ("detector_consumer_lag_records", (("partition", "2"),))
    assert total(agg, lag0, now=125) == 5
    assert total(agg, lag0, now=131) is None  # a silent for 31 s > TTL
    assert total(agg, lag2, now=131) == 7


def gauge_snapshot(instance, gauges, timestamp=110.0):
    families = [snap.Family(name, "gauge", "A gauge.", [(name, {"partition": "0"}, value)], aggregation) for name, aggregation, value in gauges]
    return instance.encode(), snap.Snapshot("svc", instance, 100.0, timestamp, families).to_json()


def test_a_gauge_is_summed_or_maxed_as_the_job_declares_not_by_its_name():
    agg = Aggregator()
    # A lag declared "sum" (each partition reported by its owner alone) and a gauge without
    # "lag" or "offset" in its name declared "max".
    for instance, value in (("a", 5), ("b", 3)):
        agg.apply(*gauge_snapshot(instance, [("detector_consumer_lag_records", "sum", value), ("detector_widest_gap", "max", value)]))
    assert total(agg, ("detector_consumer_lag_records", (("partition", "0"),))) == 8
    assert total(agg, ("detector_widest_gap", (("partition", "0"),))) == 5


def test_the_job_declares_its_committed_offset_a_maximum_and_its_lag_a_sum():
    agg = Aggregator()
    for instance, (offset, end) in (("a", (100, 140)), ("b", (90, 140))):
        metrics = JobMetrics(process_tree=False)
        metrics.set_offsets({0: offset}, {0: end})
        agg.apply(instance.encode(), snap.from_registry(metrics.registry, "svc", instance, 100.0, 110.0, metrics.aggregations).to_json())
    assert total(agg, ("detector_committed_offset", (("partition", "0"),))) == 100
    assert total(agg, ("detector_consumer_lag_records", (("partition", "0"),))) == 40 + 50


def test_instances_gone_past_the_horizon_are_retired_and_counters_never_go_down():
    agg = Aggregator(ttl_seconds=30, retire_after_seconds=3600)
    for i in range(1_000):  # churn: a thousand short-lived instances
        agg.apply(*snapshot(f"i-{i}", read=10, timestamp=100.0 + i))
    agg.apply(*snapshot("alive", read=5, timestamp=9_000))
    assert total(agg, now=5_000) == 10_005
    assert agg.retire(now=5_000) == [f"i-{i}" for i in range(1_000) if 5_000 - (100 + i) > 3600]
    assert len(agg.instances) == 1 + sum(1 for i in range(1_000) if 5_000 - (100 + i) <= 3600)
    assert total(agg, now=5_000) == 10_005
    agg.retire(now=10_000)
    assert len(agg.instances) == 1 and total(agg, now=10_000) == 10_005
    # A late snapshot of a retired run changes nothing: its counts are in the retired total.
    agg.apply(*snapshot("i-7", read=10, timestamp=107.0))
    assert total(agg, now=10_000) == 10_005


def test_replaying_snapshots_already_applied_changes_nothing():
    agg = Aggregator()
    first, second = snapshot("a", read=10, timestamp=110), snapshot("a", read=25, timestamp=120)
    for record in (first, second, first, second, first):
        agg.apply(*record)
    assert total(agg) == 25


def test_the_changelog_restores_the_same_table():
    agg = Aggregator(ttl_seconds=30, retire_after_seconds=100)
    agg.apply(*snapshot("a", read=10, started_at=1, timestamp=10))
    agg.apply(*snapshot("a", read=4, started_at=20, timestamp=30))  # a restart
    agg.apply(*snapshot("b", read=7, lag={"0": 3}, timestamp=300))
    agg.apply(*gauge_snapshot("c", [("detector_widest_gap", "max", 9)], timestamp=301))
    changelog = dict(agg.changes())
    agg.retire(now=305)  # a leaves the table
    changelog.update(agg.changes())
    assert changelog["instance:a"] is None
    restored = Aggregator(ttl_seconds=30, retire_after_seconds=100)
    for key, value in changelog.items():
        restored.restore(key, value)
    assert restored.totals(now=305) == agg.totals(now=305)
    assert total(restored, now=305) == 21
    assert agg.changes() == {}  # nothing changed since


def test_histograms_merge_bucket_by_bucket():
    agg = Aggregator()
    agg.apply(*snapshot("a", buckets={"0.1": 1, "1.0": 3, "+Inf": 4}))
    agg.apply(*snapshot("b", buckets={"0.1": 2, "1.0": 2, "+Inf": 5}))
    series = agg.totals(115)["svc"]
    bucket = "detector_end_to_end_latency_seconds_bucket"
    assert series[(bucket, (("le", "0.1"),))] == 3
    assert series[(bucket, (("le", "1.0"),))] == 5
    assert series[(bucket, (("le", "+Inf"),))] == 9
    assert series[("detector_end_to_end_latency_seconds_count", ())] == 9


@pytest.mark.parametrize(
    "value",
    [
        b"not json",
        b"[]",
        b'{"version": 99}',
        b'{"version": 1, "service": "s"}',
        b'{"version": 1, "service": "s", "instance": "i", "started_at": 1, "timestamp": 1, '
        b'"families": [{"name": "x", "type": "summary", "samples": []}]}',
        None,
    ],
)
def test_malformed_snapshots_are_counted_and_skipped(value):
    agg = Aggregator()
    agg.apply(*snapshot("a", read=3))
    assert agg.apply(b"a", value) is False
    assert agg.malformed == 1
    assert total(agg) == 3


def test_key_must_match_the_instance():
    agg = Aggregator()
    _, value = snapshot("a", read=3)
    assert agg.apply(b"someone-else", value) is False


def test_exposition_of_a_real_job_registry_is_valid_prometheus_text():
    metrics = JobMetrics(process_tree=True)
    metrics.record_batch(100, 5, {"malformed_json": 2}, 0.3, [1] * 16, 1.5)
    metrics.set_offsets({0: 100}, {0: 140})
    agg = Aggregator()
    value = snap.from_registry(metrics.registry, "svc", "i-1", 100.0, 110.0).to_json()
    assert agg.apply(b"i-1", value)
    registry = CollectorRegistry()
    registry.register(AggregateCollector(agg))
    text = generate_latest(registry).decode()
    assert 'detector_records_read_total{service="svc"} 100.0' in text
    assert 'detector_dead_letters_total{reason="malformed_json",service="svc"} 2.0' in text
    assert 'detector_end_to_end_latency_seconds_bucket{le="+Inf",service="svc"} 16.0' in text
    assert 'detector_instances_up{service="svc"}' in text
    assert "detector_process_cpu_seconds_total" in text
    assert "# TYPE detector_end_to_end_latency_seconds histogram" in text
    assert json.loads(value)["instance"] == "i-1"


def test_the_bind_address_and_port_are_settings():
    import argparse

    from detectorkit.metrics.aggregator_service import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser, {"AGGREGATOR_HOST": "0.0.0.0", "AGGREGATOR_PORT": "9200"})
    args = parser.parse_args([])
    assert (args.host, args.port) == ("0.0.0.0", 9200)
    assert parser.parse_args(["--host", "::"]).host == "::"


class FreshChangelogConsumer:
    """A consumer asked for the ends of a changelog created a moment ago, whose partition's leader
    Kafka has not yet settled: NOT_LEADER_FOR_PARTITION first, then the (empty) changelog's ends."""

    def __init__(self):
        self.refusals = 1

    def get_watermark_offsets(self, tp, timeout):
        if self.refusals:
            self.refusals -= 1
            raise KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
        return 0, 0


def test_a_changelog_whose_leader_is_still_settling_is_waited_for_not_a_crash_at_start():
    from detectorkit.metrics.aggregator_service import AggregatorService

    consumer = FreshChangelogConsumer()
    assert AggregatorService("b:9092", connect_timeout=5).restore(consumer) == {}
    assert consumer.refusals == 0


def test_with_topics_as_code_the_aggregator_creates_nothing_and_names_every_missing_topic(monkeypatch):
    from detectorkit.kafka import clients
    from detectorkit.metrics.aggregator_service import AggregatorService

    def partitions(admin, topic, timeout):
        if topic != "metrics":
            raise LookupError(f"topic {topic!r} does not exist")
        return [0]

    monkeypatch.setattr(clients, "new_admin", lambda conf: None)
    monkeypatch.setattr(clients, "topic_partitions", partitions)
    monkeypatch.setattr(clients, "create_topics", lambda *a, **k: pytest.fail("a topic was created"))
    service = AggregatorService("b:9092", topics_as_code=True)
    with pytest.raises(LookupError, match=r"topic\(s\) metrics-agg, metrics.aggregator-changelog do not exist: .*the aggregator's KafkaTopics"):
        service._topics()
