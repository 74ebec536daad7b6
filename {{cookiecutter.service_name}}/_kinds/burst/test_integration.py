"""The service on a real broker: KAFKA_BOOTSTRAP_SERVERS if set, else Apache Kafka started by detectorkit
(Java and Maven needed), else a Kafka container, else the embedded broker. It runs the service's own
command, as a deployment would."""

import collections
import json
import os
import random
import subprocess
import sys
import time

import pytest
from detectorkit.testing import Sample, create_test_topics, produce, read_all

from {{ cookiecutter.package_name }}.detector import Config

pytestmark = pytest.mark.integration

BAD = {"malformed_json": b'{"customer": ', "not_an_object": b'["c-1", 10.0]'}


def burst_samples(start_ms: int, config: Config):
    """Twelve customers over three minutes of Kafka timestamps from `start_ms`, produced in time order
    as a normaliser would write them: every third sends bursts (`min_records` records 0.5 to 4 s
    apart, a minute or two between bursts), the others a record every 8 to 40 s, which now and then
    makes a burst too. Every 25th record is not a JSON object and goes to the dead-letter topic."""
    rng = random.Random(19)
    timed = []
    for c in range(12):
        t = rng.randrange(20_000)
        while t < 180_000:
            if c % 3 == 0:
                for _ in range(config.min_records):
                    timed.append((t, c))
                    t += rng.randrange(500, 4_000)
                t += rng.randrange(60_000, 120_000)
            else:
                timed.append((t, c))
                t += rng.randrange(8_000, 40_000)
    made = []
    for t, c in sorted(timed):
        customer = f"c-{c}"
        value, kind = json.dumps({"id": f"r-{len(made)}", "customer": customer, "amount": 10.0}).encode(), "valid"
        if len(made) % 25 == 24:
            kind = list(BAD)[len(made) // 25 % len(BAD)]
            value = BAD[kind]
        made.append(Sample(customer.encode(), value, kind, timestamp_ms=start_ms + t))
    return made


def reference(sent, config: Config) -> collections.Counter:
    """(partition, offset, customer) of every record that completes a burst: one pass over what the
    partitions hold, each customer's records one at a time over their whole history, as the README
    defines a burst, independently of the detector's state."""
    window_ms = config.window_seconds * 1000
    history, last_flag, found = {}, {}, collections.Counter()
    for s in sorted(sent, key=lambda s: (s.partition, s.offset)):
        if s.sample.kind != "valid":
            continue
        customer, t = s.sample.key.decode(), s.sample.timestamp_ms
        history.setdefault(customer, []).append(t)
        in_window = sum(1 for seen in history[customer] if t - seen <= window_ms)
        if in_window >= config.min_records and not (customer in last_flag and t - last_flag[customer] <= window_ms):
            found[(s.partition, s.offset, customer)] += 1
            last_flag[customer] = t
    return found


def test_service_writes_detections_and_dead_letters(kafka_bootstrap_servers):
    topics = create_test_topics(kafka_bootstrap_servers, "{{ cookiecutter.service_name }}", partitions=4)
    # An hour ago: the detector goes by the records' Kafka timestamps, not by when it reads them.
    start_ms = (int(time.time()) - 3600) * 1000
    sent = produce(kafka_bootstrap_servers, topics.input, burst_samples(start_ms, Config()))
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap_servers,
        "INPUT_TOPIC": topics.input,
        "OUTPUT_TOPIC": topics.output,
        "DLQ_TOPIC": topics.dlq,
        "CONSUMER_GROUP": topics.group,
        "STARTING_OFFSETS": "earliest",
        "STOP_AFTER_IDLE_SECONDS": "3",
        # A few records per batch: each burst is spread over several batches.
        "MAX_RECORDS_PER_BATCH": "5",
    }
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}"]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]

    detections = [json.loads(m["value"]) for m in read_all(kafka_bootstrap_servers, topics.output)]
    found = collections.Counter(
        (d["source"]["partition"], d["source"]["offset"], d["detection"]["key"]) for d in detections
    )
    expected = reference(sent, Config())
    assert len({customer for _, _, customer in expected}) >= 4  # the test means something: bursts of several customers
    assert found == expected  # each exactly once

    bad = {(s.partition, s.offset): s.sample.kind for s in sent if s.sample.kind != "valid"}
    dead = {
        (int(m["headers"]["source_partition"]), int(m["headers"]["source_offset"])): m["headers"]["error_type"]
        for m in read_all(kafka_bootstrap_servers, topics.dlq)
    }
    assert dead == bad
