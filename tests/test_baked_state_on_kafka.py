"""Baked stateful services on Apache Kafka, run by their own command as a deployment runs them,
through the corners where state once went wrong (issue 35): a crash with a flush interval followed
by a redeploy exactly-once (scenario 1), a timer service's stores through many ticks (scenario 3),
and a zombie whose partition comes back to it after the new owner changed its state (scenario 5).
Each checks the service's detections against a single pass over the records."""

import collections
import importlib
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from detectorkit.devtools.processes import signal_session
from detectorkit.kafka import clients
from detectorkit.kafka.offset_store import commits
from detectorkit.kafka.topic_reader import read_messages
from detectorkit.metrics.aggregator import Aggregator
from detectorkit.samples import Sample
from detectorkit.state.codec import tag_of
from detectorkit.state.store import EVENT_TIME_KEY
from detectorkit.testing import KAFKA, create_test_topics, produce, read_all, wait_for

SESSION = 6  # seconds: the broker's minimum (group.min.session.timeout.ms)


@pytest.fixture(scope="module")
def real_kafka(kafka_broker_kind):
    if kafka_broker_kind not in (KAFKA, "external"):
        pytest.skip("crashes, redeploys and rebalances of stateful services are proven on Apache Kafka")


@pytest.fixture(scope="module")
def baked(cookies_session):
    """Bake and install services by detector kind, once for the module: name -> its package."""
    made = {}

    def bake(kind):
        if kind not in made:
            package = f"state_{kind}_{uuid.uuid4().hex[:6]}"
            extra = {"service_name": package.replace("_", "-"), "package_name": package, "detector_kind": kind}
            result = cookies_session.bake(extra_context=extra)
            assert result.exit_code == 0, result.exception
            project = pathlib.Path(result.project_path)
            pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", str(project)]
            subprocess.run(pip, check=True)
            sys.path.insert(0, str(project / "src"))  # its Config, for the reference
            made[kind] = (package, project)
        return made[kind][0]

    yield bake
    for _, project in made.values():
        sys.path.remove(str(project / "src"))
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", project.name], check=False)


class Service:
    """The baked service's own command in its own session (a container's processes: a kill reaches
    its JVM and Python workers), its log in a file."""

    def __init__(self, package, env):
        self.log = tempfile.NamedTemporaryFile(prefix=f"{package}-", suffix=".log", delete=False)
        command = [sys.executable, "-m", package]
        self.process = subprocess.Popen(command, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def output(self):
        return pathlib.Path(self.log.name).read_text(errors="replace")

    def events(self, name):
        lines = (line for line in self.output().splitlines() if line.startswith("{") and f'"{name}"' in line)
        return [entry for entry in map(json.loads, lines) if entry.get("event") == name]

    def owned(self):
        assigned = self.events("partitions assigned")
        return set(assigned[-1]["partitions"]) if assigned else set()

    def signal(self, signum):
        signal_session(self.process.pid, signum)  # the Python workers too, as a container's pause

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(180) == 0, self.output()[-4000:]

    def kill(self):
        if self.process.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
            self.process.wait(60)


def service_env(bs, topics, **settings):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DETECTOR_", "DETECTORKIT_CRASH_AT", "SPARK_"))}
    env.update(
        KAFKA_BOOTSTRAP_SERVERS=bs,
        INPUT_TOPIC=topics.input,
        OUTPUT_TOPIC=topics.output,
        DLQ_TOPIC=topics.dlq,
        CONSUMER_GROUP=topics.group,
        GROUP_SESSION_TIMEOUT_SECONDS=str(SESSION),
        # The runtime's default is exactly-once on Apache Kafka: each test says which it runs.
        PROCESSING_GUARANTEE="at-least-once",
    )
    env.update({k.upper(): str(v) for k, v in settings.items()})
    return env


def group_commits(bs, topics, partitions):
    """partition -> (committed offset, the offset the changelog reflects by the commit's marker)."""
    consumer = clients.new_consumer(clients.consumer(clients.base(bs), topics.group, **{"isolation.level": "read_committed"}))
    try:
        return {p: (c.offset or 0, c.durable) for p, c in commits(consumer, topics.input, partitions, 30).items()}
    finally:
        consumer.close()


def bursts(sent, config) -> collections.Counter:
    """(partition, offset, customer) of every record completing a burst, one record at a time over
    each partition's history: `min_records` of a customer within `window_seconds` of event time,
    then none for that customer for the window."""
    window_ms = config.window_seconds * 1000
    recent, flagged, found = collections.defaultdict(collections.deque), {}, collections.Counter()
    for s in sorted(sent, key=lambda s: (s.partition, s.offset)):
        if s.sample.kind != "valid":
            continue
        customer, t = s.sample.key.decode(), s.sample.timestamp_ms
        times = recent[customer]
        times.append(t)
        while t - times[0] > window_ms:
            times.popleft()
        if len(times) >= config.min_records and not (customer in flagged and t - flagged[customer] <= window_ms):
            found[(s.partition, s.offset, customer)] += 1
            flagged[customer] = t
    return found


def burst_detections(bs, topics):
    values = [json.loads(m["value"]) for m in read_all(bs, topics.output, committed_only=True)]
    return collections.Counter((d["source"]["partition"], d["source"]["offset"], d["detection"]["key"]) for d in values)


def record(customer, t, i):
    value = json.dumps({"id": f"r-{i}", "customer": customer, "amount": 10.0}).encode()
    return Sample(customer.encode(), value, "valid", timestamp_ms=t)


def backlog(start_ms, customers=400, minutes=20, seed=35):
    """Customers over `minutes` of event time, in time order as a normaliser writes them: records 5
    to 40 s apart, and now and then a burst of 4 to 7 records 0.5 to 5 s apart (some complete one,
    some fall short). Every 50th record is not JSON and goes to the dead letters."""
    rng = random.Random(seed)
    timed = []
    for c in range(customers):
        t = rng.randrange(60_000)
        while t < minutes * 60_000:
            for _ in range(rng.randrange(4, 8) if rng.random() < 0.3 else 1):
                timed.append((t, c))
                t += rng.randrange(500, 5_000)
            t += rng.randrange(5_000, 40_000)
    made = []
    for t, c in sorted(timed):
        sample = record(f"c-{c}", start_ms + t, len(made))
        if len(made) % 50 == 49:
            sample = Sample(sample.key, b'{"customer": ', "malformed_json", timestamp_ms=sample.timestamp_ms)
        made.append(sample)
    return made


def test_a_burst_service_crashed_with_a_flush_interval_then_redeployed_exactly_once_detects_every_burst(baked, kafka_bootstrap_servers, real_kafka):
    """Scenario 1: at-least-once with STATE_FLUSH_INTERVAL_SECONDS, killed (kill -9) while its group's
    commit is ahead of what the changelog holds; redeployed exactly-once and killed once more
    mid-backlog; a third instance finishes. The commit's marker is honoured whatever the settings
    are now: the records between the changelog and the commit are replayed into the state, so no
    burst that spans them is lost. Duplicates: only the first instance's batch in flight."""
    package = baked("burst")
    config = importlib.import_module(f"{package}.detector").Config()
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "crash-bursts", partitions=4)
    sent = produce(bs, topics.input, backlog((int(time.time()) - 7200) * 1000))
    expected = bursts(sent, config)
    assert len(expected) > 500
    # Polls of a few hundred records, two tasks (claiming their partitions): each store holds its
    # changes for the interval while the backlog is read.
    batches = {"starting_offsets": "earliest", "max_records_per_batch": 500}
    partitions = range(4)

    first = Service(package, service_env(bs, topics, state_flush_interval_seconds=5, **batches))
    try:

        def changelog_behind_the_commit():
            # After a flush (a marker above 0), as when the job was killed at offset 108 with 104 written.
            return any(durable and offset > durable for offset, durable in group_commits(bs, topics, partitions).values())

        wait_for(changelog_behind_the_commit, timeout=180, what="a commit ahead of the changelog")
        first.signal(signal.SIGKILL)
        first.process.wait(60)
    finally:
        first.kill()
    at_kill = group_commits(bs, topics, partitions)
    behind = {p: (offset, durable) for p, (offset, durable) in at_kill.items() if durable and offset > durable}
    assert behind, f"the changelog caught up with the commit before the kill: the test would prove nothing ({at_kill})"

    exactly_once = {"processing_guarantee": "exactly-once", **batches}
    second = Service(package, service_env(bs, topics, **exactly_once))
    try:
        done = sum(offset for offset, _ in at_kill.values())
        wait_for(
            lambda: sum(o for o, _ in group_commits(bs, topics, partitions).values()) >= done + 4_000 or second.process.poll() is not None,
            timeout=180,
            what="the exactly-once instance to commit a few batches",
        )
        assert second.process.poll() is None, second.output()[-4000:]
        second.signal(signal.SIGKILL)
        second.process.wait(60)
    finally:
        second.kill()

    third = Service(package, service_env(bs, topics, stop_after_idle_seconds=3, **exactly_once))
    try:
        assert third.process.wait(300) == 0, third.output()[-4000:]
    finally:
        third.kill()
    found = burst_detections(bs, topics)
    duplicated = {x for x, n in found.items() if n > 1}
    print(f"changelog behind the commit at the kill: {behind}; {len(expected)} bursts, {len(duplicated)} written twice")
    assert set(found) == set(expected), f"missing {sorted(set(expected) - set(found))[:5]}, extra {sorted(set(found) - set(expected))[:5]}"
    assert all(offset >= at_kill[p][0] for p, offset, _ in duplicated)  # only the killed at-least-once batch repeats
    assert max(found.values()) <= 2


def crash_count(service, point):
    """How often the service's Python workers reached a crash point (runtime.crash_points counts in a file)."""
    files = list(pathlib.Path(tempfile.gettempdir()).glob(f"detectorkit-crash-{service.process.pid}-*-{point}"))
    return max((int(f.read_text() or 0) for f in files), default=0)


def test_a_zombies_stale_store_given_back_to_it_catches_up_with_the_new_owners_changes(baked, kafka_bootstrap_servers, real_kafka):
    """Scenario 5, at-least-once. The zombie's task stalls before its output (a GC pause, a frozen VM)
    and the whole instance is paused past the session timeout; the other instance takes the
    partition and, from the records after it, writes the state of customers half-way through a
    burst. Resumed, the zombie finishes its batch, writes its stale state after the new owner's
    and cannot commit. Then the other instance stops, the partition comes back to the zombie with
    its stale store, and the bursts' last records arrive: each burst needs all five records in the
    state, the ones the new owner saw included."""
    package = baked("burst")
    config = importlib.import_module(f"{package}.detector").Config()
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "zombie-bursts", partitions=2)
    customers = [f"c-{c}" for c in range(40)]
    base = (int(time.time()) - 3600) * 1000
    sent = []

    def phase(offset_seconds, records_each):
        """`records_each` records of every customer, 1 s apart, from `offset_seconds` of event time."""
        made = [
            record(c, base + (offset_seconds + i) * 1000, len(sent) + n * records_each + i)
            for i in range(records_each)
            for n, c in enumerate(customers)
        ]
        sent.extend(produce(bs, topics.input, made))

    def all_committed():
        return sum(o for o, _ in group_commits(bs, topics, range(2)).values()) == len(sent)

    phase(0, 1)
    survivor = Service(package, service_env(bs, topics, starting_offsets="earliest"))
    zombie = None
    try:
        wait_for(lambda: survivor.owned() == {0, 1} and all_committed(), timeout=180, what="the first instance to read everything")
        # The zombie's first task stalls before its output, long enough to pause it there. One core:
        # one Python worker, which keeps the stale store and runs the zombie's every task.
        zombie = Service(package, service_env(bs, topics, spark_master="local[1]", detectorkit_crash_at="before-produce:1:stall10"))
        wait_for(lambda: len(zombie.owned()) == 1 and len(survivor.owned()) == 1, timeout=180, what="the partitions to split")
        (stale,) = zombie.owned()
        phase(10, 1)  # one record each: the zombie's task holds its partition's
        wait_for(lambda: crash_count(zombie, "before-produce") >= 1, timeout=60, what="the zombie's task to stall")
        zombie.signal(signal.SIGSTOP)
        wait_for(lambda: survivor.owned() == {0, 1}, timeout=SESSION + 60, what="the group to move on without the zombie")
        phase(20, 2)  # the survivor reads the zombie's batch again and these, and writes their state
        wait_for(all_committed, timeout=120, what="the survivor to commit")
        rejoined = len(zombie.events("partitions assigned"))
        zombie.signal(signal.SIGCONT)
        refused = "offsets not committed: the group gave these partitions to another member"
        skipped = "not committing partitions this instance no longer owns"
        wait_for(lambda: zombie.events(refused) or zombie.events(skipped), timeout=120, what="the zombie's commit to be refused")
        wait_for(lambda: len(zombie.events("partitions assigned")) > rejoined, timeout=120, what="the zombie to rejoin")
        restored = len(zombie.events("state restored"))
        survivor.stop()
        wait_for(lambda: zombie.owned() == {0, 1}, timeout=120, what="the zombie to get every partition")
        phase(30, 2)  # the bursts' last two records: five within 60 s
        wait_for(all_committed, timeout=120, what="the zombie to commit")
        given_back = [e for e in zombie.events("state restored")[restored:] if e["partition"] == stale]
        zombie.stop()
    finally:
        survivor.kill()
        if zombie is not None:
            zombie.kill()
    found = burst_detections(bs, topics)
    expected = bursts(sent, config)
    late = late_writes(bs, topics, stale)
    print(f"the zombie's stale partition {stale}: {late} late writes in its changelog; its store given back: {given_back}")
    assert {c for _, _, c in expected} == set(customers)  # every customer's burst, completed in the last phase
    assert set(found) == set(expected)
    assert set(found.values()) == {1}
    assert late, "the zombie's stale state did not land after the new owner's: the test would prove nothing"
    assert any(e["rebuilt"] or e["changelog_records"] for e in given_back), "the zombie's store was taken as current: the test would prove nothing"


def late_writes(bs, topics, partition):
    """How many of the changelog partition's records are older than one of their key's before them
    (a zombie's late write), by the input offset each reflects."""
    admin = clients.new_admin(clients.base(bs))
    (changelog,) = [t for t in admin.list_topics(timeout=30).topics if t.startswith(f"{topics.group}.")]
    newest, late = {}, 0
    for message in read_messages(clients.base(bs), changelog, partitions=[partition]):
        tag = tag_of(message.headers(), message.value())
        if message.key() == EVENT_TIME_KEY.encode() or tag is None:
            continue
        late += tag < newest.get(message.key(), -1)
        newest[message.key()] = max(tag, newest.get(message.key(), -1))
    return late


def state_reads(bs, metrics_topic, after):
    """(restores and catch-ups, changelog records read back, input records replayed) as the
    metrics-aggregator sums them from the service's snapshots, once one taken after `after` (a
    wall-clock time) has arrived."""
    aggregator = Aggregator(ttl_seconds=3600)

    def fresh():
        for message in read_messages(clients.base(bs), metrics_topic, timeout=10):
            aggregator.apply(message.key(), message.value())
        return aggregator.stream_time > after

    wait_for(fresh, timeout=60, what="a metrics snapshot")
    names = ("detector_state_restore_seconds_count", "detector_state_restored_records_total", "detector_state_replayed_records_total")
    series = [s for totals in aggregator.totals().values() for s in totals.items()]
    return tuple(sum(v for (name, _), v in series if name == wanted) for wanted in names)


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_a_timer_services_stores_are_read_back_once_through_many_ticks(baked, kafka_bootstrap_servers, real_kafka, guarantee):
    """Scenario 3: a kept store was current only until the source's next tick (every 0.5 s here),
    so every partition caught up from the changelog at every tick. Through ~60 ticks, records of
    fresh customers arriving and going quiet (each fires its silence in a tick), the baked silence
    service's stores are read back at its start only, by the metrics an SRE reads."""
    package = baked("silence")
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "tick-silences", partitions=2)
    metrics_topic = f"metrics.{uuid.uuid4().hex[:8]}"
    clients.create_topics(clients.base(bs), {metrics_topic: 1})
    settings = {"timer_idle_grace_seconds": 1, "detector_silence_seconds": 2, "metrics_topic": metrics_topic, "metrics_interval_seconds": 1}
    service = Service(package, service_env(bs, topics, processing_guarantee=guarantee, **settings))
    sent = []

    def trickle(seconds, seed):
        """A few records of fresh customers every half second, stamped now: each goes quiet and fires in a tick."""
        rng = random.Random(seed)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            made = [f"q-{seed}-{len(sent) + i}" for i in range(rng.randrange(1, 4))]
            sent.extend(produce(bs, topics.input, (Sample(c.encode(), json.dumps({"customer": c}).encode(), "valid") for c in made)))
            time.sleep(0.5)  # the pace of the records, not a wait for a condition

    def silences():
        values = [json.loads(m["value"]) for m in read_all(bs, topics.output, committed_only=True)]
        return collections.Counter(d["detection"]["key"] for d in values)

    try:
        wait_for(lambda: service.owned() == {0, 1}, timeout=120, what="the service to start")
        trickle(5, seed=1)
        wait_for(lambda: len(silences()) >= len(sent) or service.process.poll() is not None, timeout=90, what="the first silences")
        before = state_reads(bs, metrics_topic, time.time())
        trickle(30, seed=2)
        wait_for(lambda: len(silences()) >= len(sent) or service.process.poll() is not None, timeout=90, what="every silence")
        after = state_reads(bs, metrics_topic, time.time())
        service.stop()
    finally:
        service.kill()
    print(f"{guarantee}: (restores, changelog records read, records replayed) after the first silences {before}, 30 s later {after}")
    assert silences() == {s.sample.key.decode(): 1 for s in sent}
    assert after == before
