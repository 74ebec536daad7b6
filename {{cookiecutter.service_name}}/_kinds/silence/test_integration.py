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

pytestmark = pytest.mark.integration

BAD = {"malformed_json": b'{"customer": ', "not_an_object": b'["c-1", 10.0]'}
SILENCE_SECONDS = 30


def silence_samples(start_ms: int):
    """Eight customers over three minutes of Kafka timestamps from `start_ms`, produced in time order
    as a normaliser would write them: some send a record every 5 to 20 s, others pause for 40 to 90 s
    now and then (longer than the silence), and all stop before the end. Every 20th record is not a
    JSON object and goes to the dead-letter topic."""
    rng = random.Random(19)
    timed = []
    for c in range(8):
        t, end = rng.randrange(10_000), rng.randrange(60_000, 180_000)
        while t < end:
            timed.append((t, c))
            pause = c % 2 and rng.random() < 0.25
            t += rng.randrange(40_000, 90_000) if pause else rng.randrange(5_000, 20_000)
    made = []
    for t, c in sorted(timed):
        customer = f"c-{c}"
        value, kind = json.dumps({"id": f"r-{len(made)}", "customer": customer}).encode(), "valid"
        if len(made) % 20 == 19:
            kind = list(BAD)[len(made) // 20 % len(BAD)]
            value = BAD[kind]
        made.append(Sample(customer.encode(), value, kind, timestamp_ms=start_ms + t))
    return made


def reference(sent, silence_ms: int) -> collections.Counter:
    """(customer, last record's time, deadline) of every silence: one pass over each partition's
    records in order, the partition's event time its newest record's; a customer's silence is due at
    their newest time + the silence and counts once the event time reaches it. The records are an
    hour old, so by the wall clock every silence still pending at the end is due as well."""
    partitions = collections.defaultdict(list)
    for s in sorted(sent, key=lambda s: (s.partition, s.offset)):
        if s.sample.kind == "valid":
            partitions[s.partition].append((s.sample.key.decode(), s.sample.timestamp_ms))
    found = collections.Counter()
    for records in partitions.values():
        now, last = 0, {}
        for customer, t in records:
            now = max(now, t)
            for quiet in [c for c, seen in last.items() if seen + silence_ms <= now]:
                found[(quiet, last[quiet], last.pop(quiet) + silence_ms)] += 1
            last[customer] = max(last.get(customer, t), t)
        for quiet, seen in last.items():
            found[(quiet, seen, seen + silence_ms)] += 1
    return found


def test_service_writes_detections_and_dead_letters(kafka_bootstrap_servers):
    topics = create_test_topics(kafka_bootstrap_servers, "{{ cookiecutter.service_name }}", partitions=4)
    # An hour ago: silences within the records are found by their Kafka timestamps; the last one of
    # each customer is due by the wall clock, once the partitions have been quiet for the grace.
    start_ms = (int(time.time()) - 3600) * 1000
    sent = produce(kafka_bootstrap_servers, topics.input, silence_samples(start_ms))
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap_servers,
        "INPUT_TOPIC": topics.input,
        "OUTPUT_TOPIC": topics.output,
        "DLQ_TOPIC": topics.dlq,
        "CONSUMER_GROUP": topics.group,
        "STARTING_OFFSETS": "earliest",
        "STOP_AFTER_IDLE_SECONDS": "3",
        # A few records per batch: silences span batches, and a partition whose records wait behind
        # the cap is not quiet (its timers wait for its records, not the wall clock).
        "MAX_RECORDS_PER_BATCH": "5",
        "DETECTOR_SILENCE_SECONDS": str(SILENCE_SECONDS),
        # A partition quiet for a second has its event time moved to the wall clock minus a second.
        "TIMER_IDLE_GRACE_SECONDS": "1",
    }
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}"]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]

    detections = [json.loads(m["value"]) for m in read_all(kafka_bootstrap_servers, topics.output)]
    found = collections.Counter(
        (d["detection"]["key"], d["detection"]["window_end_ms"], d["source"]["timer_ms"]) for d in detections
    )
    expected = reference(sent, SILENCE_SECONDS * 1000)
    assert len(expected) > len({customer for customer, _, _ in expected}) == 8  # silences within the records too
    assert found == expected  # each exactly once
    assert {d["source"]["timer_ms"] - d["detection"]["window_end_ms"] for d in detections} == {SILENCE_SECONDS * 1000}

    bad = {(s.partition, s.offset): s.sample.kind for s in sent if s.sample.kind != "valid"}
    dead = {
        (int(m["headers"]["source_partition"]), int(m["headers"]["source_offset"])): m["headers"]["error_type"]
        for m in read_all(kafka_bootstrap_servers, topics.dlq)
    }
    assert dead == bad
