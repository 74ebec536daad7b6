"""The upstream normaliser as the diamond runs it: `detectorkit produce-raw` feeds raw records,
`detectorkit normalise` is a streaming job of its own, on a broker."""

import collections
import json
import subprocess
import sys

import pytest

from detectorkit.samples import raw_samples
from detectorkit.testing import TANSU, create_test_topics, read_all

from ..jobs import committed, job_env, run

NORMALISE = [sys.executable, "-m", "detectorkit", "normalise"]


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_raw_records_become_normalised_ones_or_dead_letters_and_nothing_is_lost(kafka_broker, guarantee):
    bs, kind = kafka_broker
    if guarantee == "exactly-once" and kind == TANSU:
        pytest.skip("exactly-once needs Apache Kafka")
    topics = create_test_topics(bs, "normalise", partitions=3)
    seed, count = 21, 3_000
    produced = subprocess.run(
        [
            sys.executable,
            "-m",
            "detectorkit",
            "produce-raw",
            "--bootstrap-servers",
            bs,
            "--topic",
            topics.input,
            "--count",
            str(count),
            "--seed",
            str(seed),
            "--anomaly-share",
            "0.05",
            "--malformed-share",
            "0.05",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    summary = json.loads(produced.stdout)
    made = list(raw_samples(count, seed=seed, anomaly_share=0.05, malformed_share=0.05))
    assert summary["produced"] == count and summary["anomalies"] == sum(s.anomaly for s in made)

    env = job_env(bs, topics, starting_offsets="earliest", stop_after_idle_seconds=3, processing_guarantee=guarantee)
    code, output = run(env, command=NORMALISE)
    assert code == 0, output

    committed_only = guarantee == "exactly-once"  # as a read_committed consumer downstream reads it
    normalised = read_all(bs, topics.output, committed_only=committed_only)
    by_id = {json.loads(m["value"])["id"]: m for m in normalised}
    truth = {s.normalised["id"]: s.normalised for s in made if s.kind == "valid"}
    assert len(by_id) == len(normalised)  # each raw record normalised once
    assert {i: json.loads(m["value"]) for i, m in by_id.items()} == truth
    assert all(m["key"] == json.loads(m["value"])["customer"] for m in normalised)  # keyed by customer

    dead = read_all(bs, topics.dlq, committed_only=committed_only)
    assert collections.Counter(m["headers"]["error_type"] for m in dead) == collections.Counter(s.kind for s in made if s.kind != "valid")
    assert len(normalised) + len(dead) == count  # raw = normalised + dead letters
    per_partition = collections.Counter(m["partition"] for m in read_all(bs, topics.input))
    assert committed(bs, topics, range(3)) == dict(per_partition)
