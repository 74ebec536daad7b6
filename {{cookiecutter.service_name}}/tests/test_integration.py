"""The service on a real broker: KAFKA_BOOTSTRAP_SERVERS if set, else Apache Kafka started by detectorkit
(Java and Maven needed), else a Kafka container, else the embedded broker. It runs the service's own
command, as a deployment would."""

import json
import os
import subprocess
import sys

import pytest
from detectorkit.samples import {% if cookiecutter.detector_kind == "burst" %}Sample{% else %}samples{% endif %}
from detectorkit.testing import create_test_topics, produce, read_all

from {{ cookiecutter.package_name }}.detector import Config
{% if cookiecutter.detector_kind == "burst" %}

def burst_samples():
    """Ten customers; every third sends six records in 25 s (a burst), the others one a minute;
    every 40th record has no timestamp and goes to the dead-letter topic."""
    made = []
    for c in range(10):
        gap = 5 if c % 3 == 0 else 60
        for i in range(6):
            at = f"2026-11-22T12:{i * gap // 60:02d}:{i * gap % 60:02d}Z"
            record = {"id": f"r-{c}-{i}", "customer": f"c-{c}", "amount": 10.0, "timestamp": at}
            kind = "valid"
            if len(made) % 40 == 39:
                del record["timestamp"]
                kind = "missing_field"
            made.append(Sample(f"c-{c}".encode(), json.dumps(record).encode(), kind))
    return made

{% endif %}
pytestmark = pytest.mark.integration


def test_service_writes_detections_and_dead_letters(kafka_bootstrap_servers):
    topics = create_test_topics(kafka_bootstrap_servers, "{{ cookiecutter.service_name }}", partitions=4)
    sent = produce(kafka_bootstrap_servers, topics.input, {% if cookiecutter.detector_kind == "burst" %}burst_samples(){% else %}samples(2_000, bad_every=40){% endif %})
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap_servers,
        "INPUT_TOPIC": topics.input,
        "OUTPUT_TOPIC": topics.output,
        "DLQ_TOPIC": topics.dlq,
        "CONSUMER_GROUP": topics.group,
        "STARTING_OFFSETS": "earliest",
        "STOP_AFTER_IDLE_SECONDS": "3",
    }
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}"]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]

    detections = [json.loads(m["value"]) for m in read_all(kafka_bootstrap_servers, topics.output)]
{%- if cookiecutter.detector_kind == "burst" %}
    assert Config().min_records <= 6
    assert sorted(d["detection"]["customer"] for d in detections) == ["c-0", "c-3", "c-6", "c-9"]  # one each
{%- else %}
    threshold = Config().threshold
    expected = {(s.partition, s.offset) for s in sent if s.sample.kind == "valid" and s.sample.amount > threshold}
    found = [(d["source"]["partition"], d["source"]["offset"]) for d in detections]
    assert sorted(found) == sorted(expected)  # each exactly once
{%- endif %}

    bad = {(s.partition, s.offset): s.sample.kind for s in sent if s.sample.kind != "valid"}
    dead = {
        (int(m["headers"]["source_partition"]), int(m["headers"]["source_offset"])): m["headers"]["error_type"]
        for m in read_all(kafka_bootstrap_servers, topics.dlq)
    }
    assert dead == bad
