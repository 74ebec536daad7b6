"""The driver's parts without Spark or a broker: the plan settings become, the task result's one
schema, the batch committer's folding and commits, and the assignment's look at its input's id."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from detectorkit.kafka import broker_kind, clients, offset_store, transactions
from detectorkit.kafka.membership import CommitRefused
from detectorkit.kafka.planning import DataLossError
from detectorkit.metrics.registry import LATENCY_BUCKETS, JobMetrics
from detectorkit.runtime import task_result
from detectorkit.runtime.driver_checkpoint import DriverCheckpoint
from detectorkit.runtime.job_plan import Guarantee, JobPlan
from detectorkit.runtime.partition_owner import PartitionOwner
from detectorkit.runtime.processing import take_counts
from detectorkit.runtime.stage import as_stage
from detectorkit.runtime.task_context import PartitionSummary
from detectorkit.runtime.task_result import NO_PARTITION, TaskResult
from detectorkit.runtime.task_stores import TaskStores
from detectorkit.settings import Settings, SettingsError
from detectorkit.state.store import PartitionStore

from ..detectors import COUNT, SILENCE, THRESHOLD

KAFKA = broker_kind.profile(broker_kind.KAFKA)
TANSU = broker_kind.profile(broker_kind.TANSU)


def plan_of(detector, broker=KAFKA, master="local[2]", **options):
    options.setdefault("processing_guarantee", "at-least-once")
    settings = Settings(kafka_bootstrap_servers="b:9", state_flush_interval_seconds=5.0, **options).for_service(detector.name)
    return JobPlan.of(as_stage(detector), settings, broker, master)


def test_the_plan_decides_once_what_the_guarantee_and_the_broker_imply():
    stateful = plan_of(COUNT)
    assert stateful.guarantee is Guarantee.AT_LEAST_ONCE and stateful.flush_interval_seconds == 5.0 and stateful.flushes_per_interval
    assert stateful.claims_dir is not None and stateful.tick_seconds is None
    # Exactly-once commits a partition's changes with its offset in every transaction.
    exactly_once = plan_of(COUNT, processing_guarantee="exactly-once")
    assert exactly_once.flush_interval_seconds == 0 and exactly_once.state_isolation == "read_committed"
    # A broker that drops a commit's metadata has nowhere to say where the changelog is.
    assert plan_of(COUNT, broker=TANSU).flush_interval_seconds == 0
    stateless = plan_of(THRESHOLD)
    assert stateless.flush_interval_seconds == 0 and stateless.claims_dir is None
    assert plan_of(THRESHOLD, processing_guarantee="exactly-once").claims_dir is not None  # producers stay with their worker
    assert plan_of(COUNT, master="spark://cluster:7077").claims_dir is None  # tasks on other machines claim nothing here
    assert plan_of(SILENCE, timer_idle_grace_seconds=8).tick_seconds == 2.0
    # By default, exactly-once where the broker hides aborted transactions, else at-least-once.
    assert plan_of(COUNT, processing_guarantee="auto").guarantee is Guarantee.EXACTLY_ONCE
    assert plan_of(COUNT, broker=TANSU, processing_guarantee="auto").guarantee is Guarantee.AT_LEAST_ONCE
    # Long slices where a failed task fails its slice at once; on a cluster a lost executor's task
    # waits for the slice's end.
    assert plan_of(THRESHOLD).slice_seconds == 300 and plan_of(THRESHOLD, master="spark://cluster:7077").slice_seconds == 30
    assert plan_of(THRESHOLD, slice_seconds=7, master="spark://cluster:7077").slice_seconds == 7


def test_exactly_once_on_a_broker_that_shows_aborted_records_is_refused_in_one_line():
    with pytest.raises(SettingsError, match="needs Apache Kafka") as refused:
        plan_of(THRESHOLD, broker=TANSU, processing_guarantee="exactly-once")
    assert "\n" not in str(refused.value)


def test_a_task_result_crosses_its_one_schema_unchanged():
    results = [
        TaskResult(
            partition=3,
            next_offset=105,
            records=5,
            detections=2,
            dead_letters={"malformed_json": 1},
            latency_counts=[1] * (len(LATENCY_BUCKETS) + 1),
            latency_sum=0.25,
            processes=[{"kind": "python", "pid": 7}],
            state={"keys": 2.0, "bytes": 10.0},
            durable=104,
            went_back=True,
            error="TransactionError: rebalanced",
        ),
        TaskResult(partition=4, next_offset=9),
    ]
    batch = task_result.to_batch(results)
    assert batch.schema.names == [field.split(" ")[0] for field in task_result.SPARK_SCHEMA.split(", ")]
    back = task_result.rows_of([batch])
    assert back[0] == TaskResult(**{**results[0].__dict__, "latency_counts": list(results[0].latency_counts)})
    assert (back[1].state, back[1].durable, back[1].went_back, back[1].error, dict(back[1].dead_letters)) == (None, None, False, None, {})


class Member:
    """The group member as the committer sees it: records commits, or refuses them (a zombie)."""

    def __init__(self, refuse=False):
        self.commits, self.refuse = [], refuse

    def commit(self, offsets, metadata=None):
        if not offsets:
            return  # as GroupMember.commit
        if self.refuse:
            raise CommitRefused(type("Error", (), {"str": lambda self: "ILLEGAL_GENERATION"})())
        self.commits.append((dict(offsets), metadata))


class Ends:
    def end_offsets(self, partitions):
        return dict.fromkeys(partitions, 200)


def committer_of(plan, member, on_input_gone=None):
    return DriverCheckpoint(plan, JobMetrics(), member=member, ends=Ends(), on_input_gone=on_input_gone)


def test_a_batch_commits_only_what_this_instance_still_owns_with_where_the_changelog_is():
    member = Member()
    committer = committer_of(plan_of(COUNT), member)
    committer.allow({0, 1, 2})
    committer.starting_at({0: 10, 1: 20, 2: 30}, {0: offset_store.Commit(10, 8), 1: offset_store.Commit(20, None), 2: offset_store.Commit(30, 30)})
    committer.forbid({2})  # revoked while the batch ran
    results = [
        TaskResult(
            partition=0,
            next_offset=15,
            records=5,
            detections=1,
            durable=15,
            state={"keys": 1, "bytes": 1, "written": 1, "expired": 0, "restored": 0, "restore_seconds": 0},
        ),
        TaskResult(partition=1, next_offset=22, records=2),
        TaskResult(partition=2, next_offset=33, records=3),
    ]
    result = committer.finish(7, results, started=0.0)
    assert (result.records, result.detections) == (10, 1)
    # Partition 1's changelog still reflects the input up to where its last flush left it (its start).
    assert member.commits == [({0: 15, 1: 22}, {0: offset_store.durable_metadata(15), 1: offset_store.durable_metadata(20)})]
    assert committer.stats.batches == 1 and committer.stats.records == 10


def test_a_batch_some_of_whose_transactions_failed_is_counted_then_fails():
    member = Member()
    committer = committer_of(plan_of(THRESHOLD, processing_guarantee="exactly-once"), member)
    committer.allow({0, 1})
    results = [TaskResult(partition=0, next_offset=15, records=5, detections=2, error="TransactionError: fenced")]
    with pytest.raises(transactions.TransactionError, match="fenced"):
        committer.finish(1, results, started=0.0)
    assert committer.stats.records == 5 and committer.stats.batches == 0
    none_committed = [TaskResult(partition=NO_PARTITION, error="TransactionError: fenced")]
    with pytest.raises(transactions.TransactionError):
        committer.finish(2, none_committed, started=0.0)
    assert member.commits == []  # exactly-once: the tasks commit, never the driver


def test_a_zombies_refused_commit_leaves_the_batch_written_and_the_job_going():
    committer = committer_of(plan_of(THRESHOLD), Member(refuse=True))
    committer.allow({0})
    assert committer.finish(1, [TaskResult(partition=0, next_offset=3, records=3)], started=0.0).records == 3


def test_a_slices_end_whose_commit_fails_goes_on_and_the_stop_commits_it():
    """The broker away a moment as a slice ends: its output is flushed, so the job goes on (a restart
    would read the slice again) and the next commit, or the stop's, carries the positions."""

    class Flaky(Member):
        failing = 1

        def commit(self, offsets, metadata=None):
            if offsets and self.failing:
                self.failing -= 1
                raise KafkaException(KafkaError(KafkaError.REQUEST_TIMED_OUT))
            super().commit(offsets, metadata)

    member = Flaky()
    committer = committer_of(plan_of(THRESHOLD), member)
    committer.allow({0, 1})
    committer.starting_at({0: 0, 1: 0}, {0: offset_store.Commit(0, None), 1: offset_store.Commit(0, None)})
    result = committer.finish(1, [TaskResult(partition=0, next_offset=7, records=7), TaskResult(partition=1, next_offset=3, records=3)], 0.0)
    assert result.records == 10 and member.commits == []
    committer.settle()  # the query stopped: no slice moves them further
    assert member.commits == [({0: 7, 1: 3}, None)]
    committer.settle()
    assert len(member.commits) == 1  # owed no more
    # Owed, then handed over: the new owner's to commit, never this instance's.
    member.failing = 1
    committer.finish(2, [TaskResult(partition=0, next_offset=9, records=2)], 0.0)
    committer.forbid({0})
    committer.settle()
    assert len(member.commits) == 1


def test_a_commit_refused_for_good_fails_the_slice():
    class Denied(Member):
        def commit(self, offsets, metadata=None):
            raise KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED, "Broker: Group authorization failed"))

    committer = committer_of(plan_of(THRESHOLD), Denied())
    committer.allow({0})
    with pytest.raises(KafkaException, match="authorization failed"):
        committer.finish(1, [TaskResult(partition=0, next_offset=3, records=3)], 0.0)


def test_a_slices_checkpoints_commit_as_it_goes_with_where_the_changelog_is_and_never_move_the_group_back():
    member = Member()
    committer = committer_of(plan_of(COUNT), member)
    committer.allow({0, 1, 2})
    committer.starting_at({0: 10, 1: 20, 2: 30}, {0: offset_store.Commit(10, 8), 1: offset_store.Commit(20, None), 2: offset_store.Commit(30, 30)})
    committer.commit_reported({0: 12, 1: 20, 2: 31}, {0: 12})  # 1 has not moved: nothing to commit
    assert member.commits == [({0: 12, 2: 31}, {0: offset_store.durable_metadata(12), 2: offset_store.durable_metadata(30)})]
    committer.forbid({2})  # handed over: its slice goes on reporting until it ends
    committer.commit_reported({0: 12, 1: 25, 2: 40}, {})
    assert member.commits[-1] == ({1: 25}, {1: offset_store.durable_metadata(20)})
    # The slice ends where it last reported; a report that arrives late is older than that.
    committer.finish(1, [TaskResult(partition=0, next_offset=16, records=6, durable=16), TaskResult(partition=1, next_offset=25, records=5)], 0.0)
    assert member.commits[-1] == ({0: 16, 1: 25}, {0: offset_store.durable_metadata(16), 1: offset_store.durable_metadata(20)})
    before = len(member.commits)
    committer.commit_reported({0: 14, 1: 25}, {0: 14})
    assert len(member.commits) == before
    committer.finish(2, [TaskResult(partition=0, next_offset=15, records=0)], 0.0)
    assert len(member.commits) == before  # nor a slice's end whose task was retried from an older position


def test_what_a_slices_tasks_report_is_counted_as_it_comes_and_its_end_adds_only_the_rest():
    committer = committer_of(plan_of(THRESHOLD, slice_seconds=30), Member())
    committer.allow({0})
    buckets = [0] * (len(LATENCY_BUCKETS) + 1)
    buckets[2] = 3
    committer.count_reported({"records": 40, "detections": 3, "dead_letters": {"malformed_json": 1}, "latency_counts": buckets, "latency_sum": 0.3})
    metrics = committer.metrics
    counted = lambda: (metrics.records_read._value.get(), metrics.detections._value.get(), committer.stats.records)  # noqa: E731
    assert counted() == (40, 3, 40) and committer.stats.batches == 0  # while the slice runs
    result = committer.finish(0, [TaskResult(partition=0, next_offset=42, records=2)], started=0.0)
    assert counted() == (42, 3, 42) and committer.stats.dead_letters == {"malformed_json": 1}
    assert (result.records, result.detections) == (42, 3)  # the slice's log line: all of it
    assert committer.finish(1, [TaskResult(partition=0, next_offset=42)], started=0.0).records == 0  # taken by the last


def test_a_slices_state_is_in_the_metrics_while_it_runs_and_each_restore_counted_once():
    """The State row of the dashboard: a slice's tasks report their stores at each checkpoint, not
    only at the slice's end (seen empty through a 30 s slice); a store's restore is reported once."""
    committer = committer_of(plan_of(COUNT, slice_seconds=30), Member())
    committer.allow({0})
    stores = TaskStores({0: PartitionStore(COUNT.state, 0)}, {0: 10}, {0: (7, 0.25)}, set())
    ctx = SimpleNamespace(state=SimpleNamespace(topic="svc.state"))
    summaries = {0: PartitionSummary()}
    metrics = committer.metrics
    for _checkpoint in range(2):  # two of a slice's checkpoints
        stores.send_changes(ctx, None, 0, summaries, send=False)
        committer.count_reported(take_counts(summaries))
        assert summaries[0].state == {}  # taken: the slice's end carries none of it again
    keys = [s for family in metrics.state_keys.collect() for s in family.samples]
    assert [(s.labels, s.value) for s in keys] == [({"partition": "0"}, 0.0)]
    assert metrics.state_restored_records._value.get() == 7 and metrics.state_restore._sum.get() == 0.25


def test_a_slices_driver_knows_its_input_was_created_again_by_its_id(monkeypatch):
    # A slice goes on from the last one's positions: on a topic created again they are the old topic's.
    ids = iter(["a", "a", None, "b", "b", "c", None])
    monkeypatch.setattr(clients, "topic_id", lambda admin, topic, timeout: next(ids))

    def assignment(**options):
        plan = plan_of(THRESHOLD, **options)
        a = PartitionOwner(plan, {}, None, None, None, None, None, threading.Event(), start_query=None, member=None, ends=None)
        a._admin = object()
        return a

    skipping = assignment(fail_on_data_loss=False)
    # Its first id; the same; gone for a moment (the readers say so); back as another topic; the same again.
    assert [skipping.input_recreated() for _ in range(5)] == [False, False, None, True, False]
    failing = assignment()
    failing._input_id = "b"
    with pytest.raises(DataLossError, match="deleted and created again.*FAIL_ON_DATA_LOSS=false"):
        failing.input_recreated()
    with pytest.raises(DataLossError, match="was deleted while the job read it.*FAIL_ON_DATA_LOSS=false"):
        failing.input_recreated()  # not there: no slice would start, so the job stops


def test_an_input_created_again_is_committed_from_its_start_though_behind_the_old_topics_positions():
    member = Member()
    committer = committer_of(plan_of(COUNT), member)
    committer.allow({0, 1})
    committer.starting_at({0: 10, 1: 20}, {0: offset_store.Commit(10, 10), 1: offset_store.Commit(20, 20)})
    committer.commit_reported({0: 100, 1: 120}, {0: 100, 1: 120})
    committer.restart_at({0: 0, 1: 0})
    assert member.commits[-1] == ({0: 0, 1: 0}, {0: offset_store.durable_metadata(0), 1: offset_store.durable_metadata(0)})
    committer.commit_reported({0: 5, 1: 7}, {0: 5, 1: 7})
    assert member.commits[-1] == ({0: 5, 1: 7}, {0: offset_store.durable_metadata(5), 1: offset_store.durable_metadata(7)})


def test_a_slices_commit_that_finds_the_input_gone_ends_the_slice():
    # Its readers, told nothing by librdkafka, would go on into a topic created again meanwhile.

    class Gone(Member):
        def commit(self, offsets, metadata=None):
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))

    ended = []
    committer = committer_of(plan_of(THRESHOLD, fail_on_data_loss=False), Gone(), on_input_gone=lambda: ended.append(True))
    committer.allow({0})
    committer.commit_reported({0: 5}, {})
    assert ended == [True]


@pytest.mark.unit
def test_a_slice_begun_just_after_a_stop_asked_for_the_end_is_ended_too():
    """A batch that passed its check of the stop before the stop came begins its slice after the
    first word to end: the stop says it again while it waits, so that slice ends at its next
    checkpoint instead of running to its deadline (300 s in local mode), which outlasted the stop's
    timeout and had the batch cancelled, its output never committed (seen in CI: a static member's
    graceful stop replayed its last slice)."""
    from detectorkit.runtime.query_runner import QueryRunner
    from detectorkit.runtime.slice_control import SliceControl

    control = SliceControl()
    stop_began, ended_in_time = threading.Event(), []

    def run_batch(frame, batch_id):
        stop_began.wait(5)
        control.begin("late")  # after the stop's first word
        deadline = time.monotonic() + 5  # the slice's deadline, were it not told to end
        while "late" not in control._ended and time.monotonic() < deadline:
            time.sleep(0.01)
        ended_in_time.append("late" in control._ended)

    runner = QueryRunner(None, plan_of(THRESHOLD), run_batch=run_batch, serve=lambda: None, interrupt=lambda: (control.end(), stop_began.set()))
    runner.query = SimpleNamespace(stop=lambda: None)
    batch = threading.Thread(target=runner._on_batch, args=(0, None, 0))
    batch.start()
    cancelled = []
    try:
        while not runner._lock.locked():
            time.sleep(0.01)
        runner.stop(timeout=2.0, on_cancel=lambda: cancelled.append(True))
    finally:
        batch.join(10)
        control.close()
    assert ended_in_time == [True] and not cancelled
