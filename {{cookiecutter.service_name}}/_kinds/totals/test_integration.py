"""The service on a real broker: KAFKA_BOOTSTRAP_SERVERS if set, else Apache Kafka started by detectorkit
(Java and Maven needed), else a Kafka container, else the embedded broker. It runs the service's own
command, as a deployment would."""

import collections
import json
import math
import os
import random
import subprocess
import sys
import time

import pytest
from detectorkit.testing import Sample, create_test_topics, produce, read_all

pytestmark = pytest.mark.integration

BAD = {"malformed_json": b'{"customer": ', "not_an_object": b'["c-1", 10.0]'}
WINDOW_SECONDS, MIN_TOTAL = 60, 700


def payment_samples(start_ms: int):
    """Eight customers over three minutes of Kafka timestamps from `start_ms`, produced in time order
    as a normaliser would write them: a payment every 2 to 15 s of 10 to 200. Every 25th record is not
    a JSON object and goes to the dead-letter topic."""
    rng = random.Random(23)
    timed = []
    for c in range(8):
        t = rng.randrange(5_000)
        while t < 180_000:
            timed.append((t, c, round(rng.uniform(10, 200), 2)))
            t += rng.randrange(2_000, 15_000)
    made = []
    for t, c, amount in sorted(timed):
        customer = f"c-{c}"
        value, kind = json.dumps({"id": f"r-{len(made)}", "customer": customer, "amount": amount}).encode(), "valid"
        if len(made) % 25 == 24:
            kind = list(BAD)[len(made) // 25 % len(BAD)]
            value = BAD[kind]
        made.append(Sample(customer.encode(), value, kind, timestamp_ms=start_ms + t))
    return made


def reference(sent) -> collections.Counter:
    """(customer, window start, total) of every minute above the total: the records are an hour
    old, so by the wall clock every window has closed by the end, each once."""
    totals = collections.defaultdict(list)
    for s in sent:
        if s.sample.kind == "valid":
            start = s.sample.timestamp_ms // (WINDOW_SECONDS * 1000) * WINDOW_SECONDS * 1000
            totals[(s.sample.key.decode(), start)].append(json.loads(s.sample.value)["amount"])
    return collections.Counter(
        (key, start, round(math.fsum(a), 2)) for (key, start), a in totals.items() if math.fsum(a) > MIN_TOTAL
    )


def test_service_writes_detections_and_dead_letters(kafka_bootstrap_servers):
    topics = create_test_topics(kafka_bootstrap_servers, "{{ cookiecutter.service_name }}", partitions=4)
    # An hour ago, on a window's start: the same minutes every run (off it, some runs had fewer than 8).
    start_ms = (int(time.time()) - 3600) // WINDOW_SECONDS * WINDOW_SECONDS * 1000
    sent = produce(kafka_bootstrap_servers, topics.input, payment_samples(start_ms))
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap_servers,
        "INPUT_TOPIC": topics.input,
        "OUTPUT_TOPIC": topics.output,
        "DLQ_TOPIC": topics.dlq,
        "CONSUMER_GROUP": topics.group,
        "STARTING_OFFSETS": "earliest",
        "STOP_AFTER_IDLE_SECONDS": "3",
        # A few records per batch: windows span batches.
        "MAX_RECORDS_PER_BATCH": "10",
        "DETECTOR_WINDOW_SECONDS": str(WINDOW_SECONDS),
        "DETECTOR_GRACE_SECONDS": "5",
        "DETECTOR_MIN_TOTAL": str(MIN_TOTAL),
        # A partition quiet for a second has its event time moved to the wall clock minus a second:
        # its last windows close too.
        "TIMER_IDLE_GRACE_SECONDS": "1",
    }
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}"]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]

    detections = [json.loads(m["value"]) for m in read_all(kafka_bootstrap_servers, topics.output)]
    found = collections.Counter(
        (d["detection"]["key"], d["detection"]["window_start_ms"], round(d["detection"]["total"], 2))
        for d in detections
    )
    expected = reference(sent)
    assert len(expected) >= 8  # the test means something: minutes above the total of most customers
    assert found == expected  # each exactly once

    bad = {(s.partition, s.offset): s.sample.kind for s in sent if s.sample.kind != "valid"}
    dead = {
        (int(m["headers"]["source_partition"]), int(m["headers"]["source_offset"])): m["headers"]["error_type"]
        for m in read_all(kafka_bootstrap_servers, topics.dlq)
    }
    assert dead == bad
