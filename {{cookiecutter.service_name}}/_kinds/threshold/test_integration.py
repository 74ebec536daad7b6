"""The service on a real broker: KAFKA_BOOTSTRAP_SERVERS if set, else Apache Kafka started by detectorkit
(Java and Maven needed), else a Kafka container, else the embedded broker. It runs the service's own
command, as a deployment would."""

import json
import os
import subprocess
import sys

import pytest
from detectorkit.testing import create_test_topics, produce, read_all, samples

from {{ cookiecutter.package_name }}.detector import Config

pytestmark = pytest.mark.integration


def test_service_writes_detections_and_dead_letters(kafka_bootstrap_servers):
    topics = create_test_topics(kafka_bootstrap_servers, "{{ cookiecutter.service_name }}", partitions=4)
    sent = produce(kafka_bootstrap_servers, topics.input, samples(2_000, bad_every=40))
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
    threshold = Config().threshold
    expected = {(s.partition, s.offset) for s in sent if s.sample.kind == "valid" and s.sample.amount > threshold}
    found = [(d["source"]["partition"], d["source"]["offset"]) for d in detections]
    assert sorted(found) == sorted(expected)  # each exactly once

    bad = {(s.partition, s.offset): s.sample.kind for s in sent if s.sample.kind != "valid"}
    dead = {
        (int(m["headers"]["source_partition"]), int(m["headers"]["source_offset"])): m["headers"]["error_type"]
        for m in read_all(kafka_bootstrap_servers, topics.dlq)
    }
    assert dead == bad
