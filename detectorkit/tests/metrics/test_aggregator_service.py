"""The metrics-aggregator at scale, on a broker: a restart reads its changelog, not the metrics
topic's history, and instances dead past the horizon are retired without changing any total."""

import json
import pathlib
import signal
import subprocess
import tempfile
import time
import urllib.request
import uuid

from prometheus_client.parser import text_string_to_metric_families

from detectorkit.kafka import clients
from detectorkit.metrics import snapshot as snap

from ..jobs import aggregator_command, wait_for

INSTANCES = 200
ROUNDS = 500  # 100,000 snapshots
DEAD = 50  # instances whose last snapshot is two days old


class Aggregator:
    def __init__(self, bootstrap, metrics_topic, *extra, env=None):
        self.log = tempfile.NamedTemporaryFile(prefix="aggregator-", suffix=".log", delete=False)
        command = aggregator_command(bootstrap, metrics_topic, 0, *extra)
        self.started = time.monotonic()
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        wait_for(lambda: self.event("aggregator started") or self.process.poll() is not None, timeout=60, what="the aggregator")
        assert self.process.poll() is None, self.output()
        self.endpoint = self.event("aggregator started")["endpoint"]

    def output(self):
        return pathlib.Path(self.log.name).read_text()

    def event(self, name):
        for line in self.output().splitlines():
            if line.startswith("{") and f'"{name}"' in line:
                return json.loads(line)
        return None

    def scrape(self):
        with urllib.request.urlopen(self.endpoint, timeout=5) as response:
            text = response.read().decode()
        return {(s.name, s.labels.get("service")): s.value for f in text_string_to_metric_families(text) for s in f.samples}

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(30) == 0, self.output()


def history(bs, topic):
    """100,000 snapshots: 200 instances of two services, each reporting 500 times, counters rising.
    The first DEAD instances stopped two days ago."""
    producer = clients.new_producer(clients.producer(clients.base(bs)))
    now = time.time()
    # The dead instances' snapshots were written two days ago, so they come first in the topic.
    order = [(r, i) for r in range(ROUNDS) for i in range(DEAD)] + [(r, i) for r in range(ROUNDS) for i in range(DEAD, INSTANCES)]
    for r, i in order:
        stamp = (now - 2 * 86400 if i < DEAD else now) - (ROUNDS - r)
        family = snap.Family("detector_records_read", "counter", "Input records.", [("detector_records_read_total", {}, float(r + 1))])
        value = snap.Snapshot(f"svc-{i % 2}", f"i-{i}", 1000.0 + i, stamp, [family]).to_json()
        producer.produce(topic, key=f"i-{i}".encode(), value=value)
        producer.poll(0)
    assert producer.flush(60) == 0
    return {f"svc-{s}": float(ROUNDS * INSTANCES // 2) for s in (0, 1)}


def totals(aggregator):
    values = aggregator.scrape()
    return {service: values.get(("detector_records_read_total", service)) for service in ("svc-0", "svc-1")}


def test_a_restart_reads_the_changelog_not_the_history_and_retirement_keeps_the_totals(kafka_bootstrap_servers):
    bs = kafka_bootstrap_servers
    topic = f"metrics.{uuid.uuid4().hex[:8]}"
    clients.create_topics(clients.base(bs), {topic: 1})
    expected = history(bs, topic)
    retire = ("--retire-after-seconds", "86400")

    # From the whole history, as the first start (or a cold one) must.
    first = Aggregator(bs, topic, *retire)
    wait_for(lambda: totals(first) == expected, timeout=300, what="the totals of 100,000 snapshots")
    replay_seconds = time.monotonic() - first.started
    wait_for(lambda: first.scrape()[("detector_aggregator_instances", None)] == INSTANCES - DEAD, timeout=30, what="the dead instances to be retired")
    assert totals(first) == expected  # retiring changed no total
    first.stop()

    restarted = Aggregator(bs, topic, *retire)
    wait_for(lambda: totals(restarted) == expected, timeout=120, what="the same totals after the restart")
    restart_seconds = time.monotonic() - restarted.started
    restored = restarted.event("table restored")
    resumed = restarted.event("aggregator started")["resumed_at"]
    print(
        f"aggregator over {ROUNDS * INSTANCES:,} snapshots of {INSTANCES} instances: cold start {replay_seconds:.1f} s, "
        f"restart {restart_seconds:.1f} s ({restored['changelog_records']} changelog records, restored in {restored['seconds']} s)"
    )
    assert resumed == {"0": ROUNDS * INSTANCES}  # nothing of the history is read again
    assert restored["instances"] == INSTANCES - DEAD
    # In proportion to the instances: the first run checkpointed every second while it read.
    assert restored["changelog_records"] < 20 * INSTANCES
    assert restarted.scrape()[("detector_aggregator_snapshots_total", None)] == 0

    # It goes on from there: a new snapshot counts.
    producer = clients.new_producer(clients.producer(clients.base(bs)))
    family = snap.Family("detector_records_read", "counter", "Input records.", [("detector_records_read_total", {}, 7.0)])
    producer.produce(topic, key=b"new", value=snap.Snapshot("svc-0", "new", 5.0, time.time(), [family]).to_json())
    producer.flush(10)
    wait_for(lambda: totals(restarted)["svc-0"] == expected["svc-0"] + 7, timeout=30, what="the new snapshot")
    restarted.stop()
