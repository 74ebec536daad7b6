"""Keys from any field (runtime.repartition): a rule keyed by a field that is not the input's Kafka
key reads its records through a topic of the job's own, re-keyed by a feeder, exactly once."""

import collections
import json
import random
import sys
from types import SimpleNamespace

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition

from detectorkit import Detector, State, manifests, windows
from detectorkit.cli.manifests import service_of
from detectorkit.kafka import clients
from detectorkit.runtime import repartition
from detectorkit.runtime.job import StreamJob
from detectorkit.runtime.stage import DetectorStage, Source
from detectorkit.settings import Settings
from detectorkit.testing import Sample, create_test_topics, produce, read_all

from ..detectors import COUNT_BY_CUSTOMER, CountConfig
from ..jobs import committed, job_env, run
from .test_exactly_once import crash

PARTITIONS = 4
RECORDS = 6_000
COMMAND = [sys.executable, "-m", "detectorkit", "run", "--detector", "tests.detectors:COUNT_BY_CUSTOMER"]


def test_the_feeder_keeps_each_value_as_it_is_keyed_by_its_field_at_its_time_and_refuses_what_has_none():
    stage = repartition.RepartitionStage("s-repartition", "merchant")
    values = pa.array([b'{"merchant": "m-1", "x": 1}', b'{"merchant": 7}', b'{"x": 1}', b"not json", b'{"merchant": null}'], pa.binary())
    outputs, rejected = stage.run(values, None, lambda i: Source("in", 0, 100 + i, 5_000 + i, "k"), "s")
    assert [(o.position, o.key, o.timestamp_ms, o.raw) for o in outputs] == [
        (0, "m-1", 5_000, b'{"merchant": "m-1", "x": 1}'),
        (1, "7", 5_001, b'{"merchant": 7}'),
    ]
    assert [(r.position, r.reason) for r in rejected] == [(2, "missing_field"), (3, "malformed_json"), (4, "missing_field")]


def test_repartition_names_the_field_it_keys_by_and_its_two_readers_share_the_cores():
    with pytest.raises(TypeError, match="key_field"):
        Detector(name="x", detect=lambda r, s, c: None, state=State(columns=("n",)), repartition=True)
    rule = windows.detector("x", windows.Tumbling(60), windows.Count(), windows.Final(), key_field="merchant", repartition=True)
    assert DetectorStage(rule).repartition_field == "merchant" and DetectorStage(COUNT_BY_CUSTOMER).repartition_field == "customer"
    settings = Settings(kafka_bootstrap_servers="x:9092", input_topic="in", consumer_group="g", slice_seconds=5, kafka_broker_kind="kafka")
    job = StreamJob.of(rule, settings, spark=None)
    # Each reader's slices run on half the cores: neither waits for the other's slice to end.
    assert job.make_plan().readers == 2 and job._feeder.make_plan().readers == 2
    alone = windows.detector("y", windows.Tumbling(60), windows.Count(), windows.Final())
    assert StreamJob.of(alone, settings, spark=None).make_plan().readers == 1


def test_the_repartition_topic_and_the_rights_on_it_are_declared():
    settings = Settings(kafka_bootstrap_servers="x:9092", input_topic="in", consumer_group="g", processing_guarantee="exactly-once").for_service("s")
    service = service_of(settings, "s", COUNT_BY_CUSTOMER.state, repartitioned=True)
    docs = manifests.manifests(service, "my-cluster")
    topics = {d["spec"]["topicName"]: d["spec"] for d in docs if d["kind"] == "KafkaTopic"}
    assert topics["g.repartition"]["config"] == repartition.TOPIC_CONFIG
    rules = {(r["resource"]["type"], r["resource"]["name"]): r["operations"] for r in docs[-1]["spec"]["authorization"]["acls"]}
    assert rules[("topic", "g.repartition")] == ["Read", "Write", "Describe"]
    assert rules[("group", "g.repartition")] == ["Read", "Describe"]
    assert rules[("transactionalId", "g.repartition-")] == ["Write", "Describe"]


def records(count, seed=11):
    """Records keyed by their id, each of one of 30 customers named in its value; every 40th not JSON."""
    rng = random.Random(seed)
    for i in range(count):
        if i % 40 == 39:
            yield Sample(f"r-{i}".encode(), b'{"customer": ', "malformed_json")
        else:
            yield Sample(f"r-{i}".encode(), json.dumps({"id": f"r-{i}", "customer": f"c-{rng.randrange(30):02d}"}).encode(), "valid")


def every_nth_of(messages, every=CountConfig.every):
    """(partition, offset) of every `every`-th record of each key, over the repartition topic's
    committed records in each partition's order (a key lives in one)."""
    counts, found = collections.Counter(), set()
    for m in sorted(messages, key=lambda m: (m["partition"], m["offset"])):
        counts[m["key"]] += 1
        if counts[m["key"]] % every == 0:
            found.add((m["partition"], m["offset"]))
    return found


def ends(bs, topic):
    consumer = Consumer(clients.consumer(clients.base(bs), f"ends-{topic}"))
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)}
    finally:
        consumer.close()


def test_a_rule_keyed_by_a_field_answers_exactly_once_through_kill_9s_in_either_reader(transactional_kafka):
    bs = transactional_kafka
    topics = create_test_topics(bs, "repartition", partitions=PARTITIONS)
    sent = produce(bs, topics.input, records(RECORDS))
    env = job_env(bs, topics, starting_offsets="earliest", max_records_per_batch=600, group_session_timeout_seconds=6)
    # Checkpoints a second apart: each kill lands in a transaction with a second's writes flushed
    # or being sent (at 0.1 s, the third reach of a point was once a checkpoint with nothing in it,
    # and no kill left an aborted write behind).
    env.update(PROCESSING_GUARANTEE="exactly-once", SLICE_SECONDS="5", SLICE_COMMIT_INTERVAL_SECONDS="1")
    feeder = SimpleNamespace(group=f"{topics.group}.repartition", input=topics.input)
    for point in ("during-produce", "during-commit", "before-commit"):
        crash(env, COMMAND, point, bs, feeder)
    code, output = run({**env, "STOP_AFTER_IDLE_SECONDS": "3"}, timeout=300, command=COMMAND)
    assert code == 0, output

    topic = repartition.topic_of(topics.group)
    assert sum(committed(bs, feeder, range(PARTITIONS)).values()) == RECORDS
    between = read_all(bs, topic, committed_only=True)
    ids = collections.Counter(json.loads(m["value"])["id"] for m in between)
    assert set(ids) == {json.loads(s.sample.value)["id"] for s in sent if s.sample.kind == "valid"} and set(ids.values()) == {1}
    assert all(m["key"] == json.loads(m["value"])["customer"] for m in between)  # re-keyed by the field
    reader = SimpleNamespace(group=topics.group, input=topic)
    assert committed(bs, reader, range(PARTITIONS)) == ends(bs, topic)  # read to the end (markers and aborted writes included)

    found = collections.Counter(
        (d["source"]["partition"], d["source"]["offset"])
        for d in map(json.loads, (m["value"] for m in read_all(bs, topics.output, committed_only=True)))
    )
    assert set(found) == every_nth_of(between) and set(found.values()) == {1}  # one pass, each once
    dead = collections.Counter(
        (int(m["headers"]["source_partition"]), int(m["headers"]["source_offset"])) for m in read_all(bs, topics.dlq, committed_only=True)
    )
    assert set(dead) == {(s.partition, s.offset) for s in sent if s.sample.kind != "valid"} and set(dead.values()) == {1}
    # The kills left writes behind that were aborted, in the topic between the readers or after them.
    assert len(read_all(bs, topic)) + len(read_all(bs, topics.output)) > len(between) + len(found), "no kill left an aborted write behind"


def test_a_backtest_of_a_repartitioned_rule_over_the_input_topic_says_what_to_read_instead(capsys):
    from detectorkit.cli.backtest import backtest_main

    code = backtest_main(COUNT_BY_CUSTOMER, ["--out", "x.jsonl", "--kafka-bootstrap-servers", "localhost:1"], defaults={"input_topic": "orders"})
    assert code == 2
    assert "keyed by 'customer' through its repartition topic: backtest over files (--files), or over that topic" in capsys.readouterr().err
