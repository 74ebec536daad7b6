"""The detector job end to end on a broker, in this process with the shared SparkSession."""

import collections
import json
import os
import time

import pytest

from detectorkit.kafka import clients
from detectorkit.runtime.job import StreamJob
from detectorkit.runtime.supervisor import explain
from detectorkit.samples import KINDS, samples
from detectorkit.settings import Settings
from detectorkit.testing import create_test_topics, produce, read_all

from ..detectors import THRESHOLD, Config, UnpickledMarker
from ..jobs import committed, wait_for
from ..jobs import job_settings as settings


def detections_by_source(bootstrap, topic):
    values = [json.loads(m["value"]) for m in read_all(bootstrap, topic)]
    return collections.Counter((v["source"]["partition"], v["source"]["offset"]) for v in values)


def expected_detections(sent, threshold=Config().threshold):
    return {(s.partition, s.offset) for s in sent if s.sample.kind == "valid" and s.sample.amount > threshold}


def test_ten_thousand_records_with_bad_ones_lose_nothing(spark, kafka_bootstrap_servers):
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "e2e", partitions=4)
    sent = produce(bs, topics.input, samples(10_000, seed=11, bad_every=20))
    kinds = collections.Counter(s.sample.kind for s in sent)
    assert all(kinds[k] >= 100 for k in KINDS)  # every kind of bad record is really there

    job = StreamJob.of(THRESHOLD, settings(bs, topics, starting_offsets="earliest", max_records_per_batch=2_500), spark)
    job.start()
    wait_for(lambda: job.stats.records >= 10_000 or job.terminated(0), what="10,000 records")
    job.stop()
    assert job.error() is None
    assert job.stats.records == 10_000

    found = detections_by_source(bs, topics.output)
    assert set(found) == expected_detections(sent)
    assert set(found.values()) == {1}  # exactly once

    dead = read_all(bs, topics.dlq)
    by_source = {(int(m["headers"]["source_partition"]), int(m["headers"]["source_offset"])): m for m in dead}
    assert len(by_source) == len(dead)
    bad = {(s.partition, s.offset): s for s in sent if s.sample.kind != "valid"}
    assert set(by_source) == set(bad)
    for where, message in by_source.items():
        assert message["headers"]["error_type"] == bad[where].sample.kind
        assert message["value"] == bad[where].sample.value.decode()
        assert message["key"] == bad[where].sample.key.decode()
        assert message["headers"]["error_message"]
        assert message["headers"]["service"] == THRESHOLD.name

    valid = sum(1 for s in sent if s.sample.kind == "valid")
    assert valid + len(dead) == len(sent)  # input = output-eligible + dead letters
    assert committed(bs, topics, range(4)) == {p: sum(1 for s in sent if s.partition == p) for p in range(4)}


def test_latest_skips_records_produced_before_the_first_start(spark, kafka_bootstrap_servers):
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "latest", partitions=2)
    before = produce(bs, topics.input, samples(300, seed=1, bad_every=0, high_share=0.5))
    job = StreamJob.of(THRESHOLD, settings(bs, topics, starting_offsets="latest"), spark)
    job.start()
    # The job records where it starts as soon as it has chosen: then it is safe to produce.
    ends = {p: sum(1 for s in before if s.partition == p) for p in range(2)}
    wait_for(lambda: committed(bs, topics, range(2)) == ends, what="the starting offsets to be committed")
    after = produce(bs, topics.input, samples(200, seed=2, bad_every=0, high_share=0.5))
    wait_for(lambda: job.stats.records >= 200 or job.terminated(0), what="the new records")
    job.stop()
    assert job.stats.records == 200
    assert set(detections_by_source(bs, topics.output)) == expected_detections(after)


def test_earliest_processes_records_produced_before_the_first_start(spark, kafka_bootstrap_servers):
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "earliest", partitions=4)
    before = produce(bs, topics.input, samples(300, seed=3, bad_every=0, high_share=0.5))
    job = StreamJob.of(THRESHOLD, settings(bs, topics, starting_offsets="earliest"), spark)
    job.start()
    wait_for(lambda: job.stats.records >= 300 or job.terminated(0), what="the earlier records")
    # Caught up holds steadily while nothing arrives (STOP_AFTER_IDLE_SECONDS needs it to), even
    # though Spark polls the source every few milliseconds.
    wait_for(job.caught_up, timeout=30, what="the job to report caught up")
    samples_of_caught_up = []
    for _ in range(20):
        samples_of_caught_up.append(job.caught_up())
        time.sleep(0.05)  # sampling a status over a second: the sleep is the sampling period
    job.stop()
    assert all(samples_of_caught_up), samples_of_caught_up
    assert job.stats.records == 300
    assert set(detections_by_source(bs, topics.output)) == expected_detections(before)


def test_error_policy_stops_with_a_clear_message(spark, kafka_bootstrap_servers):
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "error", partitions=2)
    produce(bs, topics.input, samples(10, bad_every=0))
    job = StreamJob.of(THRESHOLD, settings(bs, topics, starting_offsets="error"), spark)
    job.start()
    deadline = time.monotonic() + 120
    while not job.terminated(0.2) and time.monotonic() < deadline:
        pass
    job.close()
    assert job.query is None  # nothing was read
    reason = job.error()
    assert reason.startswith("NoCommittedOffsetsError:")
    assert topics.group in reason and "STARTING_OFFSETS=latest or earliest" in reason
    assert "\n" not in reason


def test_committed_offsets_are_the_restart_point(spark, kafka_bootstrap_servers):
    """Two runs, each with a new, empty checkpoint directory: the second resumes from Kafka."""
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "resume", partitions=2)
    first = produce(bs, topics.input, samples(400, seed=5, bad_every=0, high_share=0.5))
    job = StreamJob.of(THRESHOLD, settings(bs, topics, starting_offsets="earliest"), spark)
    job.start()
    wait_for(lambda: job.stats.records >= 400 or job.terminated(0), what="the first run")
    job.stop()
    second = produce(bs, topics.input, samples(300, seed=6, bad_every=0, high_share=0.5))
    job = StreamJob.of(THRESHOLD, settings(bs, topics, starting_offsets="earliest"), spark)
    job.start()
    wait_for(lambda: job.stats.records >= 300 or job.terminated(0), what="the second run")
    job.stop()
    assert job.stats.records == 300
    found = detections_by_source(bs, topics.output)
    assert set(found) == expected_detections(first + second) and set(found.values()) == {1}


def test_the_python_workers_start_with_the_stage_while_the_group_join_runs(spark, kafka_bootstrap_servers, tmp_path):
    """A session's first Python job pays for starting its workers and their imports (6.5 s on 2
    cores); the job starts them at once, unpickling the task's stage and config there, so its first
    batch does not wait for them. Here no record ever arrives, so no batch runs at all."""
    topics = create_test_topics(kafka_bootstrap_servers, "warm", partitions=2)
    marker = tmp_path / "unpickled-by"
    job = StreamJob.of(THRESHOLD, settings(kafka_bootstrap_servers, topics), spark, config=UnpickledMarker(str(marker)))
    job.start()
    try:
        wait_for(lambda: marker.exists() or job.terminated(0), timeout=60, what="a Python worker to unpickle the task")
        assert job.error() is None
        assert job.stats.batches == 0
        assert str(os.getpid()) not in marker.read_text().split()
    finally:
        job.stop()


class FailedQuery:
    """A streaming query that has died with an error, as Spark leaves it."""

    isActive = False
    stopped = False

    def exception(self):
        return Exception("detectorkit.kafka.planning.DataLossError: topic 'in' was deleted while the job read it")

    def stop(self):
        self.stopped = True


def test_a_query_that_died_is_never_dropped_silently_when_its_partitions_go():
    """The group may take the partitions away (lost, when the input topic is deleted) before the
    job has seen its query die of the same deletion: the job must still fail with the query's
    error, not sit there owning nothing (a race seen once in 30 runs of the deleted-topic test)."""
    job, assignment = driver_parts(THRESHOLD)
    assignment.runner.query = query = FailedQuery()
    assignment.running = frozenset({0, 1})
    assignment.release({0, 1}, lost=True)
    assert query.stopped
    assert job.terminated(0)
    assert job.error() == "DataLossError: topic 'in' was deleted while the job read it"


def driver_parts(stage, start_query=None, owned=(), **options):
    """A job's driver parts without Spark or a broker: its plan, committer, query runner and the
    owner of its partitions, whose group gives it `owned` at once."""
    from detectorkit.runtime.driver_checkpoint import DriverCheckpoint
    from detectorkit.runtime.partition_owner import PartitionOwner
    from detectorkit.runtime.query_runner import QueryRunner

    job = StreamJob.of(stage, Settings(kafka_bootstrap_servers="127.0.0.1:9", kafka_broker_kind="kafka", **options), spark=None, config=Config())
    plan = job.make_plan()
    state = job.state_context()
    assignment = PartitionOwner(
        plan,
        {},
        QueryRunner(None, plan, run_batch=None, serve=lambda: None),
        DriverCheckpoint(plan, job.metrics),
        job.supervisor,
        job.metrics,
        job.progress,
        job._leaving,
        start_query=start_query,
        member=Member(job._leaving, owned),
        ends=None,
        state_topic=None if state is None else state.topic,
    )
    return job, assignment


class Member:
    """The group, as the job's serving loop sees it: `owned` given at once, then the job leaves."""

    fatal = None
    joined = True
    changed_at = 0.0

    def __init__(self, leaving, owned, polls=3):
        self.leaving, self.owned, self.polls = leaving, frozenset(owned), polls

    def poll(self, timeout):
        self.polls -= 1
        if self.polls < 0:
            self.leaving.set()

    def member_id(self):
        return "member-1"


def test_a_stateful_job_given_partitions_its_changelog_lacks_stops_at_once_in_one_line(monkeypatch):
    """Partitions added to the input while a stateful job runs: the group gives them to it, and
    their state would be restored from changelog partitions that do not exist (a timeout, five
    restarts, then a misleading error). The job stops at the assignment, before any query starts."""
    from types import SimpleNamespace

    from detectorkit.state import changelog

    from ..detectors import COUNT

    started = []
    job, assignment = driver_parts(
        COUNT, start_query=lambda owned, start, metadata: started.append(owned), owned=range(8), input_topic="in", consumer_group="g"
    )
    requests = []

    def list_topics(timeout):
        requests.append(timeout)
        topics = {"in": 8, "g.state": 4}  # partitions added to the input since the changelog was made
        return SimpleNamespace(topics={t: SimpleNamespace(partitions=dict.fromkeys(range(n)), error=None) for t, n in topics.items()})

    monkeypatch.setattr(changelog.clients, "new_admin", lambda conf: SimpleNamespace(list_topics=list_topics))
    assignment.start_offsets = lambda owned: dict.fromkeys(owned, 0)
    assignment.serve()
    assert job.terminated(0)
    assert started == []
    error = job.error()
    assert error.startswith("SettingsError: input topic 'in' now has 8 partitions but state changelog 'g.state' has 4: ")
    assert "\n" not in error and "State(name=...)" in error and "add partitions" not in error
    assert restarts(job) == {}
    assert len(requests) == 1


def test_a_job_told_to_stop_while_it_takes_an_assignment_starts_no_query_for_it():
    """A graceful stop during a rebalance: the group gives partitions to an instance that is leaving
    (it is a member until it closes), and the stop comes while the job reads their start offsets.
    A query started then plans its first batch while the stop waits for it (seen once in CI: Spark's
    Python source runner timed out opening its socket, and the instance did not stop in 300 s)."""
    started = []
    job, assignment = driver_parts(THRESHOLD, start_query=lambda owned, start, metadata: started.append(owned), owned={3})

    def start_offsets(owned):
        job._leaving.set()  # stop() is called now
        return dict.fromkeys(owned, 0)

    assignment.start_offsets = start_offsets
    assignment.serve()
    assert started == []
    assert job.error() is None and restarts(job) == {}


WORKER_TIMEOUT = "RuntimeError: Python worker failed to connect back."


def restarts(job):
    return {labels["error"]: value for labels, value in samples_of(job, "detector_query_restarts_total")}


def samples_of(job, name):
    return [(s.labels, s.value) for metric in job.metrics.registry.collect() for s in metric.samples if s.name == name]


def test_a_query_that_fails_to_start_is_restarted_and_a_failed_commit_tried_again_losing_nothing(spark, kafka_bootstrap_servers):
    """Spark's Python worker not connecting back in time (seen when the diamond's four jobs start
    side by side on 2 cores) killed the job; now the query starts again from the group's offsets."""
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "transient", partitions=2)
    job = StreamJob.of(THRESHOLD, settings(bs, topics, query_restart_backoff_seconds=0.1), spark)
    failures = {"start": 1, "commit": 1}

    def failing_once(step, real):
        def call(*args):
            if failures[step] and (step == "start" or args[0]):
                failures[step] -= 1
                raise RuntimeError(WORKER_TIMEOUT.split(": ", 1)[1])
            return real(*args)

        return call

    job._start_query = failing_once("start", job._start_query)
    job.start()
    try:
        wait_for(lambda: job.is_reading() or job.terminated(0), what="the query to start on its second try")
        job._member.commit = failing_once("commit", job._member.commit)
        sent = produce(bs, topics.input, samples(1_000, seed=23, bad_every=0, high_share=0.2))
        wait_for(lambda: job.stats.records >= 1_000 or job.terminated(0), what="every record, after the failed batch")
    finally:
        job.stop()
    assert job.error() is None
    assert failures == {"start": 0, "commit": 0}
    # A failed commit of a slice's positions is tried again by the next commit, or the stop's: no restart.
    assert restarts(job) == {"RuntimeError": 1.0}
    found = detections_by_source(bs, topics.output)
    assert set(found) == expected_detections(sent) and set(found.values()) == {1}
    assert committed(bs, topics, range(2)) == {p: sum(1 for s in sent if s.partition == p) for p in range(2)}


def test_a_failure_that_persists_stops_the_job_with_its_error_in_one_line(spark, kafka_bootstrap_servers):
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "persistent", partitions=1)
    job = StreamJob.of(THRESHOLD, settings(bs, topics, query_restart_attempts=2, query_restart_backoff_seconds=0.1), spark)

    def never(owned, start, metadata):
        raise RuntimeError(WORKER_TIMEOUT.split(": ", 1)[1])

    job._start_query = never
    job.start()
    assert job.terminated(60)
    job.close()
    assert job.error() == f"{WORKER_TIMEOUT} (the query failed 3 times in a row; QUERY_RESTART_ATTEMPTS=2)"
    assert restarts(job) == {"RuntimeError": 2.0}


@pytest.mark.parametrize(
    ("reason", "permanent"),
    [
        ("DataLossError: partition t-0 no longer exists", True),
        ("TopicAccessError: topic 'in': Broker: Topic authorization failed", True),
        ('KafkaException: KafkaError{code=_AUTHENTICATION,val=-169,str="SASL authentication error: Authentication failed"}', True),
        ("NoCommittedOffsetsError: group g has no committed offsets", True),
        (WORKER_TIMEOUT, False),
        ("DeliveryError: 3 records not delivered: Local: Message timed out", False),
    ],
)
def test_only_errors_a_restart_cannot_mend_stop_the_job_at_once(reason, permanent):
    from detectorkit.runtime.supervisor import is_permanent

    assert is_permanent(reason) is permanent


@pytest.mark.parametrize("bad", ["not_an_int"])
def test_explain_picks_our_error_out_of_a_spark_stack(bad):
    text = (
        "[STREAM_FAILED] Query terminated with exception: Traceback (most recent call last):\n"
        '  File "x.py", line 3, in read\n'
        "detectorkit.kafka.planning.DataLossError: partition t-0 no longer exists. Set FAIL_ON_DATA_LOSS=false to skip ahead.\n"
        "\tat org.apache.spark.Foo(Foo.scala:1)\n"
    )
    assert explain(RuntimeError(text)) == "DataLossError: partition t-0 no longer exists. Set FAIL_ON_DATA_LOSS=false to skip ahead."
    assert explain(RuntimeError(f"ValueError: invalid literal for int() with base 10: '{bad}'")).startswith("ValueError:")


def test_partitions_added_to_the_topic_are_picked_up(spark, kafka_bootstrap_servers, kafka_broker_kind):
    from confluent_kafka.admin import AdminClient, NewPartitions

    from detectorkit.testing import TANSU

    if kafka_broker_kind == TANSU:
        pytest.skip("the embedded broker (Tansu) has no CreatePartitions; the planning is unit-tested")
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "grow", partitions=2)
    job = StreamJob.of(THRESHOLD, settings(bs, topics, starting_offsets="earliest"), spark)
    job.start()
    first = produce(bs, topics.input, samples(100, seed=8, bad_every=0, high_share=0.5))
    wait_for(lambda: job.stats.records >= 100 or job.terminated(0), what="records on the first partitions")
    admin = AdminClient({"bootstrap.servers": bs})
    admin.create_partitions([NewPartitions(topics.input, 4)])[topics.input].result()
    later = produce(bs, topics.input, samples(400, seed=9, bad_every=0, high_share=0.5))
    assert {s.partition for s in later} >= {2, 3}
    wait_for(lambda: job.stats.records >= 500 or job.terminated(0), what="records on the new partitions")
    job.stop()
    assert set(detections_by_source(bs, topics.output)) == expected_detections(first + later)


def test_unreachable_metrics_topic_never_stops_the_job(spark, kafka_bootstrap_servers, capfd):
    import socket

    from detectorkit.metrics.snapshot import parse

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "nometrics", partitions=2)
    job = StreamJob.of(
        THRESHOLD, settings(bs, topics, starting_offsets="earliest", metrics_bootstrap_servers=closed, metrics_interval_seconds=0.5), spark
    )
    job.start()
    sent = produce(bs, topics.input, samples(200, seed=12, bad_every=0, high_share=0.5))
    wait_for(lambda: job.stats.records >= 200 or job.terminated(0), what="records processed without metrics")
    # Undelivered snapshots time out after 5 s: then the counter and the log say so.
    wait_for(lambda: job.metrics.report_errors._value.get() > 0, timeout=30, what="the report error counter")
    assert not job.terminated(0)
    job.stop()
    assert set(detections_by_source(bs, topics.output)) == expected_detections(sent)
    logged = capfd.readouterr()
    assert "metrics snapshot not delivered; the job goes on" in logged.out + logged.err
    # What would have been reported is a well-formed snapshot with the job's counts.
    from detectorkit.metrics.snapshot import from_registry

    snap = parse(from_registry(job.metrics.registry, "svc", "i", 1.0, 2.0).to_json())
    read = [s for f in snap.families for s in f.samples if s[0] == "detector_records_read_total"]
    assert read == [("detector_records_read_total", {}, 200.0)]


def test_a_stop_that_times_out_closes_nothing_under_the_running_batch(spark, kafka_bootstrap_servers):
    import threading

    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "stoptimeout", partitions=2)
    produce(bs, topics.input, samples(100, seed=13, bad_every=0))
    # An existing metrics topic: the final report is quick, so close() comes while the batch runs.
    metrics_topic = f"metrics.{topics.group}"
    clients.create_topics(clients.base(bs), {metrics_topic: 1})
    job = StreamJob.of(THRESHOLD, settings(bs, topics, starting_offsets="earliest", metrics_topic=metrics_topic), spark)
    in_batch = threading.Event()
    closed_under_batch = []
    process = job._process

    def slow_batch(frame, batch_id, started):
        in_batch.set()
        try:
            time.sleep(3)  # a batch slower than the stop's patience
            return process(frame, batch_id, started)
        finally:
            in_batch.clear()

    job._process = slow_batch
    query = job.start()
    member = job._member
    close = member.close
    member.close = lambda: (closed_under_batch.append(in_batch.is_set()), close())
    # Spark's query.stop() returns before the batch callback has when spark.sql.streaming.stopTimeout
    # runs out; here it returns at once, and the real stop goes on beside it.
    real_stop = query.stop
    stopping = threading.Thread(target=real_stop)
    query.stop = stopping.start
    wait_for(in_batch.is_set, what="a batch in flight")
    job.stop(timeout=0.5)
    stopping.join()
    assert not query.isActive
    assert closed_under_batch == [False]


def test_a_stopped_job_leaves_no_kafka_connection_in_the_workers(spark, kafka_bootstrap_servers):
    import os

    import psutil

    bs = kafka_bootstrap_servers
    port = int(bs.rsplit(":", 1)[1])
    me = psutil.Process(os.getpid())

    def worker_connections():
        found = set()
        for proc in me.children(recursive=True):
            try:
                found |= {(proc.pid, c.laddr) for c in proc.net_connections(kind="tcp") if c.raddr and c.raddr.port == port}
            except psutil.Error:
                continue
        return found

    # Clients cached by earlier tests' jobs may still be within their own idle time: only the
    # connections this job opens are its own.
    earlier = worker_connections()
    topics = create_test_topics(bs, "idleclients", partitions=2)
    sent = produce(bs, topics.input, samples(300, seed=14, bad_every=0, high_share=0.5))
    job = StreamJob.of(THRESHOLD, settings(bs, topics, starting_offsets="earliest"), spark, client_idle_seconds=1.0)
    job.start()
    wait_for(lambda: job.stats.records >= 300 or job.terminated(0), what="the records")
    assert worker_connections() - earlier  # its reading consumer (its group is new) is connected while it runs
    job.stop()
    assert set(detections_by_source(bs, topics.output)) == expected_detections(sent)
    # Workers outlive the query; their clients must not. (Spark kills a worker idle for a minute:
    # within 30 s only the clients' own idle close can empty them.)
    wait_for(lambda: not worker_connections() - earlier, timeout=30, what="the workers' Kafka clients to close")
