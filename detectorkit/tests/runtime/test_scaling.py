"""Instances of one service share its input through the consumer group: scaling out and in, a
member's death, a rolling redeploy, static membership and a zombie. Every test produces while the
instances change and checks each detection once (or, after a kill -9, duplicates bounded by the
killed instance's uncommitted batch) and nothing lost. The scale-out and scale-in and the rolling
redeploy run a detector with state (every third record of each customer), so they also prove each
partition's state handed over with it: a count lost, replayed or split shifts every later detection."""

import collections
import json
import pathlib
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from detectorkit.kafka import clients
from detectorkit.kafka.topic_reader import read_messages
from detectorkit.metrics.aggregator import Aggregator
from detectorkit.samples import samples
from detectorkit.testing import KAFKA, create_test_topics, produce, read_all

from ..detectors import every_nth_reference
from ..jobs import COMMAND, Job, committed, job_env, wait_for

STATEFUL = [sys.executable, "-m", "detectorkit", "run", "--detector", "tests.detectors:COUNT"]

PARTITIONS = 4
SESSION = 6  # seconds: the broker's minimum (group.min.session.timeout.ms)


@pytest.fixture
def real_kafka(kafka_broker_kind):
    if kafka_broker_kind != KAFKA and kafka_broker_kind != "external":
        pytest.skip("group rebalances are proven on Apache Kafka (Tansu's take tens of seconds)")


def detections(bs, topics, committed_only=False):
    values = [json.loads(m["value"]) for m in read_all(bs, topics.output, committed_only=committed_only)]
    return collections.Counter((v["source"]["partition"], v["source"]["offset"]) for v in values)


def expected(sent):
    return {(s.partition, s.offset) for s in sent if s.sample.kind == "valid" and s.sample.amount > 1000}


SCRIPTS = pathlib.Path(__file__).parents[3] / "scripts"


def events(job, name):
    """The job's JSON log lines with this event, in order."""
    found = []
    for line in job.output().splitlines():
        if line.startswith("{") and f'"{name}"' in line:
            entry = json.loads(line)
            if entry.get("event") == name:
                found.append(entry)
    return found


def owned(job):
    """The partitions the instance reads now, from its last assignment."""
    return owned_in(job.output())


def assignments(job):
    return len(events(job, "partitions assigned"))


def owned_in(log):
    assigned = [line for line in log.splitlines() if line.startswith("{") and '"partitions assigned"' in line]
    return set(json.loads(assigned[-1])["partitions"]) if assigned else set()


def aggregated_records_read(bs, metrics_topic):
    """What the metrics-aggregator shows for `records read`, from the same topic and rules."""
    aggregator = Aggregator(ttl_seconds=3600)
    for message in read_messages(clients.base(bs), metrics_topic, timeout=10):
        aggregator.apply(message.key(), message.value())
    totals = aggregator.totals()
    return sum(v for series in totals.values() for (name, _), v in series.items() if name == "detector_records_read_total")


class Feed:
    """Records produced in the background, in chunks, while instances come and go."""

    def __init__(self, bs, topic, chunks, chunk, seed):
        self.sent = []
        self.done = threading.Event()
        self.chunks_sent = 0

        def run():
            for i in range(chunks):
                self.sent += produce(bs, topic, samples(chunk, seed=seed + i, bad_every=200, high_share=0.05))
                self.chunks_sent += 1
                time.sleep(0.5)
            self.done.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def finish(self):
        self.thread.join(600)
        assert self.done.is_set()
        return self.sent


def group_members(bs, group):
    """kafka-consumer-groups --describe --members, as rows {column: value}."""
    from detectorkit.devtools.kafka_broker import run_tool

    done = run_tool(
        "consumer-groups", ["--bootstrap-server", bs, "--describe", "--members", "--group", group], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stdout.splitlines() if line.strip()]
    header = next(i for i, cells in enumerate(lines) if cells and cells[0] == "GROUP")
    return [dict(zip(lines[header], cells, strict=False)) for cells in lines[header + 1 :]]


def start(bs, topics, metrics_topic, command=COMMAND, **settings):
    defaults = {"group_session_timeout_seconds": SESSION, "max_records_per_batch": 10_000}
    env = job_env(bs, topics, starting_offsets="earliest", metrics_topic=metrics_topic, metrics_interval_seconds=1, **{**defaults, **settings})
    return Job(env, command)


def all_committed(bs, topics, total):
    return sum(o or 0 for o in committed(bs, topics, range(PARTITIONS)).values()) == total


def stop(job):
    job.process.send_signal(signal.SIGTERM)
    assert job.wait(180) == 0, job.output()


def handovers(*jobs):
    return [round(e["handover_seconds"], 2) for job in jobs for e in events(job, "partitions assigned") + events(job, "partitions released")]


def setup(bs, name, partitions=PARTITIONS):
    topics = create_test_topics(bs, name, partitions=partitions)
    metrics_topic = f"metrics.{uuid.uuid4().hex[:8]}"
    clients.create_topics(clients.base(bs), {metrics_topic: 1})
    return topics, metrics_topic


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_the_talks_scenario_processes_every_record_once(kafka_bootstrap_servers, real_kafka, guarantee):
    """Instance 1 alone, instance 2 joins while records flow, instance 2 leaves, instance 1 ends.
    Each join and leave ends the slices in flight at their next checkpoint."""
    bs = kafka_bootstrap_servers
    topics, metrics_topic = setup(bs, "talk")
    feed = Feed(bs, topics.input, chunks=20, chunk=10_000, seed=100)  # 200,000 records
    settings = {"processing_guarantee": guarantee, "slice_seconds": 5}
    one = start(bs, topics, metrics_topic, STATEFUL, **settings)
    two = None
    try:
        wait_for(lambda: feed.chunks_sent >= 5 and owned(one) == set(range(PARTITIONS)), timeout=180, what="instance 1 reading")
        two = start(bs, topics, metrics_topic, STATEFUL, **settings)
        wait_for(lambda: len(owned(two)) == 2 and len(owned(one)) == 2, timeout=180, what="the partitions split")
        # Kafka's own tool shows both members and who owns what.
        members = group_members(bs, topics.group)
        assert len(members) == 2 and sorted(int(m["#PARTITIONS"]) for m in members) == [2, 2], members
        wait_for(lambda: feed.chunks_sent >= 12, timeout=180, what="records to flow to both")
        stop(two)
        wait_for(lambda: owned(one) == set(range(PARTITIONS)), timeout=60, what="instance 1 to take everything back")
        sent = feed.finish()
        wait_for(lambda: all_committed(bs, topics, len(sent)), timeout=300, what="instance 1 to finish")
        stop(one)
    finally:
        for job in (one, two):
            if job is not None and job.process.poll() is None:
                job.process.kill()
    found = detections(bs, topics, committed_only=guarantee == "exactly-once")
    read = aggregated_records_read(bs, metrics_topic)
    print(f"records produced {len(sent)}, aggregated records read {read:.0f}, delta {read - len(sent):.0f}; hand-overs (s): {handovers(one, two)}")
    assert set(found) == every_nth_reference(sent)
    assert set(found.values()) == {1}, f"{sum(n - 1 for n in found.values())} detections written twice"
    assert read == len(sent)


class ScriptedInstances:
    """Instances run by scripts/start-instance.sh, stop-instance.sh and rolling-redeploy.sh, as the
    README tells a team to."""

    def __init__(self, run_dir, env):
        self.run_dir, self.env = run_dir, env

    def script(self, name, *args):
        result = subprocess.run([str(SCRIPTS / name), str(self.run_dir), *args], env=self.env, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stdout + result.stderr + self.logs()
        return result.stdout

    def start(self, name):
        return self.script("start-instance.sh", name, *STATEFUL)

    def running(self):
        return sorted(p.stem for p in self.run_dir.glob("*.pid"))

    def owned(self, name):
        return owned_in((self.run_dir / f"{name}.log").read_text())

    def logs(self):
        return "".join(f"\n--- {p.name}\n" + p.read_text()[-3000:] for p in self.run_dir.glob("*.log"))


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_a_rolling_redeploy_loses_and_duplicates_nothing(kafka_bootstrap_servers, real_kafka, tmp_path, guarantee):
    """scripts/rolling-redeploy.sh: for each instance in turn, start the new version's instance,
    then stop the old one gracefully (its slices end at their next checkpoint)."""
    bs = kafka_bootstrap_servers
    topics, metrics_topic = setup(bs, "rolling")
    env = job_env(
        bs,
        topics,
        starting_offsets="earliest",
        metrics_topic=metrics_topic,
        metrics_interval_seconds=1,
        group_session_timeout_seconds=SESSION,
        max_records_per_batch=10_000,
        processing_guarantee=guarantee,
        slice_seconds=5,
    )
    instances = ScriptedInstances(tmp_path / "run", env)
    feed = Feed(bs, topics.input, chunks=12, chunk=5_000, seed=300)
    try:
        instances.start("a")
        instances.start("b")
        wait_for(
            lambda: all(len(instances.owned(n)) == 2 for n in ("a", "b")) and feed.chunks_sent >= 2,
            timeout=180,
            what="two instances sharing the input",
        )
        output = instances.script("rolling-redeploy.sh", *STATEFUL)
        new = instances.running()
        assert len(new) == 2 and not {"a", "b"} & set(new), output
        wait_for(lambda: all(len(instances.owned(n)) == 2 for n in new), timeout=120, what="the new instances to share the input")
        sent = feed.finish()
        wait_for(lambda: all_committed(bs, topics, len(sent)), timeout=300, what="the new instances to finish")
        for name in new:
            instances.script("stop-instance.sh", name)
    finally:
        for pidfile in (tmp_path / "run").glob("*.pid"):
            subprocess.run(["kill", "-9", pidfile.read_text().strip()], check=False)
    found = detections(bs, topics, committed_only=guarantee == "exactly-once")
    print(f"rolling redeploy: {output.strip()}")
    assert set(found) == every_nth_reference(sent), instances.logs()
    assert set(found.values()) == {1}


def test_a_static_member_restarted_in_time_gets_its_partitions_back_without_a_rebalance(kafka_bootstrap_servers, real_kafka):
    bs = kafka_bootstrap_servers
    topics, metrics_topic = setup(bs, "static")
    feed = Feed(bs, topics.input, chunks=8, chunk=5_000, seed=400)
    # Long enough for a restart (a job starts in about 10 s here).
    session = {"group_session_timeout_seconds": 45}
    one = start(bs, topics, metrics_topic, instance_id="detector-1", **session)
    two = start(bs, topics, metrics_topic, instance_id="detector-2", **session)
    again = None
    try:
        wait_for(lambda: len(owned(one)) == 2 and len(owned(two)) == 2, timeout=180, what="two static members")
        before = owned(two)
        rebalances_of_one = len(events(one, "partitions assigned")) + len(events(one, "partitions released"))
        stop(two)
        again = start(bs, topics, metrics_topic, instance_id="detector-2", **session)
        wait_for(lambda: owned(again), timeout=120, what="the restarted member's partitions")
        assert owned(again) == before
        sent = feed.finish()
        wait_for(lambda: all_committed(bs, topics, len(sent)), timeout=300, what="the instances to finish")
        # The other member never noticed: no partition released or assigned since the split.
        assert len(events(one, "partitions assigned")) + len(events(one, "partitions released")) == rebalances_of_one
        stop(again)
        stop(one)
    finally:
        for job in (one, two, again):
            if job is not None and job.process.poll() is None:
                job.process.kill()
    found = detections(bs, topics)
    assert set(found) == expected(sent)
    assert set(found.values()) == {1}


def test_a_zombie_then_a_killed_instance_lose_nothing_and_never_move_offsets_back(kafka_bootstrap_servers, real_kafka):
    """Instance 2 is paused past the session timeout with a batch in flight (SIGSTOP: a long GC
    pause, a frozen VM), resumed, then killed with `kill -9` with a batch in flight; an instance
    3 comes in its place. The group's committed offsets never go backwards, nothing is lost, and
    every duplicate is a record of instance 2's uncommitted batches. The detector keeps state (every
    third record of each customer): the zombie's late changelog writes land after the new owner's,
    and a count it then caught up wrongly, when partitions come back to it, shifts every later
    detection of their customers."""
    bs = kafka_bootstrap_servers
    topics, metrics_topic = setup(bs, "zombie")
    feed = Feed(bs, topics.input, chunks=12, chunk=5_000, seed=500)
    one = start(bs, topics, metrics_topic, STATEFUL)
    # Slow, small polls: output is nearly always written and not yet committed, 2,000 records at most.
    two = start(bs, topics, metrics_topic, STATEFUL, max_records_per_batch=2_000, detector_delay_seconds=1)
    three = None
    history = collections.defaultdict(list)
    watching = threading.Event()

    def watch():
        while not watching.is_set():
            for p, o in committed(bs, topics, range(PARTITIONS)).items():
                if o is not None and (not history[p] or history[p][-1] != o):
                    history[p].append(o)
            time.sleep(0.05)

    def batch_in_flight_with_output(partitions):
        """Instance 2 has written detections past what it committed: a batch is half done."""
        ends = committed(bs, topics, partitions)
        return any(p in ends and offset >= (ends[p] or 0) for p, offset in detections(bs, topics))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    uncommitted = []  # (partition, first uncommitted offset) of instance 2's batches in flight
    try:
        wait_for(lambda: len(owned(one)) == 2 and len(owned(two)) == 2, timeout=180, what="two members")
        mine = owned(two)
        # Right after one of its commits, instance 2 is in its next batch (records wait; its
        # detector sleeps 1 s per call): paused there, the batch's commit comes after the group
        # moved on. Pausing once output shows lands in a window of a few ms before the commit.
        last = committed(bs, topics, mine)
        wait_for(lambda: committed(bs, topics, mine) != last, timeout=180, what="a commit of instance 2")
        time.sleep(0.4)  # a point inside the next batch's 1 s detector call, not a wait for a condition
        two.signal_group(signal.SIGSTOP)  # driver, JVM and Python workers: the whole instance
        uncommitted += committed(bs, topics, mine).items()
        seen_one, seen_two = assignments(one), assignments(two)
        wait_for(lambda: assignments(one) > seen_one and owned(one) == set(range(PARTITIONS)), timeout=SESSION + 30, what="the group to move on")
        two.signal_group(signal.SIGCONT)
        wait_for(
            lambda: (assignments(two) > seen_two and len(owned(two)) == 2) or two.process.poll() is not None,
            timeout=120,
            what="the zombie to rejoin and get a share again",
        )
        assert two.process.poll() is None, two.output()
        returned = set(mine) & owned(two)  # partitions whose stores the zombie holds, stale
        refused = events(two, "offsets not committed: the group gave these partitions to another member")
        skipped = events(two, "not committing partitions this instance no longer owns")

        # The survivor has read everything meanwhile: more records, for the zombie to go on with.
        sent = feed.finish()
        feed = Feed(bs, topics.input, chunks=12, chunk=5_000, seed=600)
        mine = owned(two)
        wait_for(lambda: len(owned(one)) == 2 and batch_in_flight_with_output(mine), timeout=180, what="instance 2's batch in flight again")
        seen_one = assignments(one)
        two.signal_group(signal.SIGKILL)
        killed = time.monotonic()
        uncommitted += committed(bs, topics, mine).items()
        wait_for(
            lambda: assignments(one) > seen_one and owned(one) == set(range(PARTITIONS)),
            timeout=SESSION + 30,
            what="the survivor to take the partitions",
        )
        moved = time.monotonic() - killed
        three = start(bs, topics, metrics_topic, STATEFUL)  # back when an instance returns
        wait_for(lambda: len(owned(three)) == 2 and len(owned(one)) == 2, timeout=180, what="the partitions to be shared again")
        sent += feed.finish()
        wait_for(lambda: all_committed(bs, topics, len(sent)), timeout=300, what="the instances to finish")
        stop(three)
        stop(one)
    finally:
        watching.set()
        for job in (one, two, three):
            if job is not None and job.process.poll() is None:
                job.signal_group(signal.SIGCONT)
                job.signal_group(signal.SIGKILL)
    watcher.join(5)
    found = detections(bs, topics)
    duplicated = {x for x, n in found.items() if n > 1}
    backwards = {p: h for p, h in history.items() if h != sorted(h)}
    print(
        f"zombie: its batch in flight was not committed after SIGCONT ({len(skipped)} skipped as lost, {len(refused)} refused by "
        f"the group), partitions {sorted(returned)} came back to it; "
        f"kill -9: partitions moved {moved:.1f} s after (session timeout {SESSION} s); {len(duplicated)} detections "
        f"written twice; committed offsets seen {sum(map(len, history.values()))} times, never going back"
    )
    assert refused or skipped, "the zombie had no commit to make: the test proved nothing"
    assert not backwards, f"committed offsets went backwards: {backwards}"
    assert set(found) == every_nth_reference(sent)
    assert moved <= SESSION + 15
    assert max(found.values()) <= 2
    assert all(any(p == q and start <= o < start + 2_000 for q, start in uncommitted) for p, o in duplicated)
