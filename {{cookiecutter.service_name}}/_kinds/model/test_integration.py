"""The service on a real broker: KAFKA_BOOTSTRAP_SERVERS if set, else Apache Kafka started by detectorkit
(Java and Maven needed), else a Kafka container, else the embedded broker. It runs the service's own
command, as a deployment would."""

import json
import os
import random
import subprocess
import sys
import time

import pandas as pd
import pytest
from detectorkit.testing import DetectorHarness, Sample, create_test_topics, event_times, produce, read_all

from {{ cookiecutter.package_name }}.detector import DETECTOR, Config

pytestmark = pytest.mark.integration

BAD = {"malformed_json": b'{"customer": ', "not_an_object": b'["c-1", 10.0]'}


def order_samples(start_ms: int):
    """Twenty customers over an hour of Kafka timestamps from `start_ms`, in time order as a
    normaliser writes them: an order every few minutes, and for every fourth customer a spree of
    large orders a minute apart. Every 25th record is not a JSON object: a dead letter."""
    rng = random.Random(23)
    timed = []
    for c in range(20):
        t = rng.randrange(60_000)
        while t < 3_600_000:
            timed.append((t, c, round(rng.uniform(5, 120), 2)))
            t += rng.randrange(120_000, 900_000)
        if c % 4 == 0:
            t = rng.randrange(600_000, 3_000_000)
            for _ in range(5):
                timed.append((t, c, round(rng.uniform(400, 1500), 2)))
                t += rng.randrange(20_000, 90_000)
    made = []
    for t, c, amount in sorted(timed):
        customer = f"c-{c}"
        value, kind = json.dumps({"id": f"r-{len(made)}", "customer": customer, "amount": amount}).encode(), "valid"
        if len(made) % 25 == 24:
            kind = list(BAD)[len(made) // 25 % len(BAD)]
            value = BAD[kind]
        made.append(Sample(customer.encode(), value, kind, timestamp_ms=start_ms + t))
    return made


def reference(sent) -> set:
    """(partition, offset) of every record the detector flags over all of it in one pass, in each
    partition's order, independently of how the service cut it into batches."""
    valid = sorted((s for s in sent if s.sample.kind == "valid"), key=lambda s: (s.partition, s.offset))
    records = pd.DataFrame(
        {
            "amount": [json.loads(s.sample.value)["amount"] for s in valid],
            "key": [s.sample.key.decode() for s in valid],
            "event_time": event_times(pd.to_datetime([s.sample.timestamp_ms for s in valid], unit="ms", utc=True)),
        }
    )
    found = DetectorHarness(DETECTOR, Config()).batch(records)
    return {(valid[i].partition, valid[i].offset) for i in found.index}


def test_service_writes_detections_and_dead_letters(kafka_bootstrap_servers):
    topics = create_test_topics(kafka_bootstrap_servers, "{{ cookiecutter.service_name }}", partitions=4)
    # An hour ago: the detector goes by the records' Kafka timestamps, not by when it reads them.
    start_ms = (int(time.time()) - 3600) * 1000
    sent = produce(kafka_bootstrap_servers, topics.input, order_samples(start_ms))
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap_servers,
        "INPUT_TOPIC": topics.input,
        "OUTPUT_TOPIC": topics.output,
        "DLQ_TOPIC": topics.dlq,
        "CONSUMER_GROUP": topics.group,
        "STARTING_OFFSETS": "earliest",
        "STOP_AFTER_IDLE_SECONDS": "3",
        # A few records per batch: a customer's hour is spread over several batches.
        "MAX_RECORDS_PER_BATCH": "5",
    }
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}"]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]

    detections = [json.loads(m["value"]) for m in read_all(kafka_bootstrap_servers, topics.output)]
    found = [(d["source"]["partition"], d["source"]["offset"]) for d in detections]
    expected = reference(sent)
    assert len({d["detection"]["key"] for d in detections}) >= 3  # the test means something: several customers' sprees
    assert sorted(found) == sorted(expected)  # each exactly once
    versions = {(d["detection"]["model"], d["detection"]["model_version"]) for d in detections}
    assert versions == {("orders-last-hour", "1")}

    bad = {(s.partition, s.offset): s.sample.kind for s in sent if s.sample.kind != "valid"}
    dead = {
        (int(m["headers"]["source_partition"]), int(m["headers"]["source_offset"])): m["headers"]["error_type"]
        for m in read_all(kafka_bootstrap_servers, topics.dlq)
    }
    assert dead == bad
