"""Slices (SLICE_SECONDS): tasks that read, detect, write and commit until a deadline give what
batches give, write detections while the slice still runs, and end early for a stop or a
rebalance, committing what they wrote."""

import collections
import json
import signal
import sys
import time

import psutil
import pytest

from detectorkit.kafka.access import KafkaAccess
from detectorkit.runtime.job import StreamJob
from detectorkit.samples import samples
from detectorkit.testing import create_test_topics, produce, read_all

from ..detectors import COUNT, THRESHOLD, Config, every_nth_reference
from ..jobs import Job, command_lines, committed, job_env, wait_for
from ..jobs import job_settings as settings
from ..state.test_state_on_kafka import keyed

KAFKA_ONLY = ("kafka", "external")


def detections(bs, topic):
    values = [json.loads(m["value"]) for m in read_all(bs, topic, committed_only=True)]
    return collections.Counter((v["source"]["partition"], v["source"]["offset"]) for v in values)


def expected(sent, threshold=Config().threshold):
    return {(s.partition, s.offset) for s in sent if s.sample.kind == "valid" and s.sample.amount > threshold}


def ends(sent, partitions):
    return {p: sum(1 for s in sent if s.partition == p) for p in range(partitions)}


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_a_sliced_job_detects_dead_letters_and_commits_what_batches_do(spark, kafka_bootstrap_servers, kafka_broker_kind, guarantee):
    if guarantee == "exactly-once" and kafka_broker_kind not in KAFKA_ONLY:
        pytest.skip("exactly-once needs Apache Kafka")
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "slices", partitions=4)
    sent = produce(bs, topics.input, samples(6_000, seed=41, bad_every=20))
    job = StreamJob.of(THRESHOLD, settings(bs, topics, starting_offsets="earliest", slice_seconds=2, processing_guarantee=guarantee), spark)
    job.start()
    wait_for(lambda: job.stats.records >= 6_000 or job.terminated(0), what="6,000 records")
    job.stop()
    assert job.error() is None
    assert job.stats.records == 6_000
    found = detections(bs, topics.output)
    assert set(found) == expected(sent) and set(found.values()) == {1}
    dead = read_all(bs, topics.dlq, committed_only=True)
    assert {(int(m["headers"]["source_partition"]), int(m["headers"]["source_offset"])) for m in dead} == {
        (s.partition, s.offset) for s in sent if s.sample.kind != "valid"
    }
    assert committed(bs, topics, range(4)) == ends(sent, 4)


def test_a_slice_writes_detections_and_commits_while_it_runs_and_a_stop_ends_it_early(spark, kafka_bootstrap_servers):
    """A slice of ten minutes: records produced while it runs are detected and committed within it
    (no batch has ended), and a stop ends it at its next checkpoint with its positions committed."""
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "slice-stop", partitions=2)
    job = StreamJob.of(THRESHOLD, settings(bs, topics, starting_offsets="earliest", slice_seconds=600), spark)
    job.start()
    wait_for(job.caught_up, what="the slice reading")
    sent = produce(bs, topics.input, samples(400, seed=42, bad_every=0, high_share=0.5))
    wait_for(lambda: len(detections(bs, topics.output)) == len(expected(sent)), timeout=60, what="the detections, mid-slice")
    # At-least-once: the driver commits where the tasks' checkpoints got, not only at a slice's end.
    wait_for(lambda: committed(bs, topics, range(2)) == ends(sent, 2), timeout=30, what="the group's offsets, mid-slice")
    # The metrics too count what the checkpoints wrote: they stood still until the slice's end.
    counted = lambda: (job.stats.records, job.metrics.records_read._value.get(), job.metrics.detections._value.get())  # noqa: E731
    wait_for(lambda: counted() == (400, 400, len(expected(sent))), timeout=30, what="the metrics, mid-slice")
    assert job.stats.batches == 0  # the slice still runs
    began = time.monotonic()
    job.stop()
    assert time.monotonic() - began < 30  # not the ten minutes
    assert job.error() is None and job.stats.records == 400
    assert committed(bs, topics, range(2)) == ends(sent, 2)

    more = produce(bs, topics.input, samples(300, seed=43, bad_every=0, high_share=0.5))
    job = StreamJob.of(THRESHOLD, settings(bs, topics, starting_offsets="earliest", slice_seconds=600), spark)
    job.start()
    wait_for(lambda: len(detections(bs, topics.output)) == len(expected(sent + more)), timeout=60, what="the second run's detections")
    wait_for(lambda: committed(bs, topics, range(2)) == ends(sent + more, 2), timeout=30, what="the second run's offsets")
    # A worker lost in local mode fails its slice at once (Spark retries no task there) and the
    # query starts again: what comes next is read long before the ten minutes are up, which is
    # what lets local slices be long by default (runtime.job_plan.slice_seconds).
    for worker in _slice_workers():
        worker.kill()
    last = produce(bs, topics.input, samples(200, seed=44, bad_every=0, high_share=0.5))
    wait_for(lambda: len(detections(bs, topics.output)) == len(expected(sent + more + last)), timeout=90, what="the detections after a worker died")
    job.stop()
    found = detections(bs, topics.output)
    assert set(found) == expected(sent + more + last) and set(found.values()) == {1}


def _slice_workers() -> list[psutil.Process]:
    """This process's Python workers running a slice's task: the worker daemon's children."""
    spawned = psutil.Process().children(recursive=True)
    daemons = [p for p in spawned if any("worker_daemon" in c for c in command_lines([p]))]
    workers = [w for d in daemons for w in d.children()]
    assert workers, command_lines(spawned)
    return workers


def test_a_stateful_sliced_job_counts_as_one_pass_and_a_slice_whose_deadline_passes_mid_write_repeats_nothing(spark, kafka_bootstrap_servers):
    """Every third record of a key, over slices of a second whose chunks take longer than that
    to process: the deadline passes while a chunk is written, and the slice ends after it."""
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "slice-count", partitions=2)
    sent = produce(bs, topics.input, keyed(600))
    s = settings(bs, topics, starting_offsets="earliest", slice_seconds=1)
    job = StreamJob.of(COUNT, s, spark, config=COUNT.config(delay_seconds=1.5))
    job.start()
    wait_for(lambda: job.stats.records >= 600 or job.terminated(0), timeout=180, what="600 records")
    job.stop()
    assert job.error() is None and job.stats.records == 600
    found = detections(bs, topics.output)
    assert set(found) == every_nth_reference(sent) and set(found.values()) == {1}
    assert committed(bs, topics, range(2)) == ends(sent, 2)


def test_a_rebalance_mid_slice_hands_partitions_over_after_the_slices_checkpoint(kafka_bootstrap_servers, kafka_broker_kind, tmp_path):
    """A second instance joins while the first runs a ten-minute slice: the first ends it, commits,
    and the group moves; between them every record is detected once."""
    if kafka_broker_kind not in KAFKA_ONLY:
        pytest.skip("group rebalances are proven on Apache Kafka (Tansu's take tens of seconds)")
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "slice-rebalance", partitions=4)
    env = job_env(bs, topics, starting_offsets="earliest", slice_seconds=600)
    command = [sys.executable, "-m", "detectorkit", "run", "--detector", "tests.detectors:THRESHOLD"]
    first = Job(env, command)
    second = None
    try:
        sent = produce(bs, topics.input, samples(1_000, seed=45, bad_every=0, high_share=0.3))
        wait_for(lambda: len(detections(bs, topics.output)) == len(expected(sent)), timeout=120, what="the first instance's detections")
        second = Job(env, command)
        wait_for(lambda: second.output().count('"partitions assigned"') >= 1 and first.output().count('"partitions assigned"') >= 2, timeout=120,
                 what="the rebalance")  # fmt: skip
        assert '"partitions released"' in first.output()
        more = produce(bs, topics.input, samples(1_000, seed=46, bad_every=0, high_share=0.3))
        wait_for(lambda: len(detections(bs, topics.output)) == len(expected(sent + more)), timeout=120, what="both instances' detections")
        # No Python data source plans a slice: no session process looks them up.
        spawned = command_lines(psutil.Process(first.process.pid).children(recursive=True))
        assert any("worker_daemon" in c for c in spawned) and not any("lookup_data_sources" in c for c in spawned), spawned
    finally:
        for job in (first, second):
            if job is not None and job.process.poll() is None:
                job.process.send_signal(signal.SIGTERM)  # the driver: it stops its JVM itself
        for job in (first, second):
            if job is not None:
                assert job.wait(120) == 0, job.output()[-3000:]
    found = detections(bs, topics.output)
    assert set(found) == expected(sent + more) and set(found.values()) == {1}, collections.Counter(found.values())
    assert committed(bs, topics, range(4)) == ends(sent + more, 4)
    # The hand-over waited for a checkpoint, not for the slice's ten minutes.
    released = [json.loads(line) for line in first.output().splitlines() if '"partitions released"' in line]
    assert released and all(r["handover_seconds"] < 30 for r in released), released


def test_only_a_slices_first_attempt_takes_its_partitions_as_committed_where_the_last_slice_left_them():
    # A retried attempt's forerunner may have committed further before it failed: it reads them back.
    from detectorkit.kafka.source_options import SourceOptions
    from detectorkit.runtime import slices

    source = SourceOptions(topic="in", access=KafkaAccess({"bootstrap.servers": "127.0.0.1:9"}, "g"))
    spec = slices.plan(source, {0: 10, 1: 5}, 1, 5.0, 0.1, None, ("127.0.0.1", 9), "t", frozenset({1, 7}))
    assert spec.known == {1}  # a partition no longer this instance's is not carried
    assert slices.known_committed(spec, attempt=0) == {1}
    assert slices.known_committed(spec, attempt=1) == frozenset()


def _spec(seconds, interval):
    from detectorkit.kafka.source_options import SourceOptions
    from detectorkit.runtime import slices

    source = SourceOptions(topic="in", access=KafkaAccess({"bootstrap.servers": "127.0.0.1:9"}, "g"))
    return slices.plan(source, {0: 0}, 1, seconds, interval, None, ("127.0.0.1", 9), "t")


def test_the_tasks_of_a_slice_end_together_at_the_end_the_driver_planned():
    # A task that started later ended later: the partitions of those that had ended went unread until the last.
    import dataclasses

    from detectorkit.runtime.slices import ends_at

    spec = dataclasses.replace(_spec(30.0, 0.1), tick=1_000_000)
    first = ends_at(spec, 50.0, 1_000.3)  # on its own monotonic clock, 0.3 s after the driver planned it
    second = ends_at(spec, 50.7, 1_001.0)
    assert first == pytest.approx(50.0 + 29.7) and second == pytest.approx(first)
    # A task that starts past half of it, or whose clock is off, still runs half a slice; never more than one.
    assert ends_at(spec, 50.0, 1_025.0) == pytest.approx(65.0)
    assert ends_at(spec, 50.0, 900.0) == pytest.approx(80.0)


def _writer(task):
    """The worker's at-least-once writer over a sink that keeps what it is sent."""
    from detectorkit.runtime.writers import AtLeastOnceWriter

    from .test_processing import FakeSink

    writer = AtLeastOnceWriter(task)
    writer._sink = FakeSink()
    writer._sink.flush = lambda timeout: None
    return writer


class _FakeReader:
    """A fake of kafka.position_reader's reader: its subclass polls; where it is, as the real one keeps it."""

    def mark(self):
        return dict(self.position), set(self.at_end)

    def rewind(self, mark):
        self.position, self.at_end = dict(mark[0]), set(mark[1])


class _FakeClock:
    """The slice loop's clock (its `time` module), moved by hand."""

    now = 0.0

    def monotonic(self):
        return self.now

    def time(self):
        return 1_000.0 + self.now

    @classmethod
    def installed(cls, monkeypatch):
        from detectorkit.runtime import slices

        clock = cls()
        monkeypatch.setattr(slices, "time", clock)
        return clock


class _FakeLink:
    """A fake of runtime.slice_control's link: its subclass reports; a driver always heard."""

    silence = 0.0

    def silent_for(self):
        return self.silence


def test_a_slice_checkpoints_what_it_first_reads_at_once_not_a_commit_interval_later():
    # Records that arrived between two slices have waited for the next one to start already.
    from detectorkit.runtime import slices

    from .test_processing import arrow, ctx

    class Reader(_FakeReader):
        position, at_end = {3: 100}, set()

        def poll(self, wait, max_records):
            if self.position[3] > 100:
                time.sleep(min(wait, 0.01))  # nothing more: as a consumer's wait
                return None
            self.position[3] = 102
            return arrow([b'{"amount": 5000.0, "customer": "c"}', b'{"amount": 1.0, "customer": "c"}'])

    class Link(_FakeLink):
        reports = []

        def ended(self):
            return bool(self.reports)

        def report(self, positions, at_end, durable, counts):
            self.reports.append((time.monotonic(), dict(positions), counts))

    link, started = Link(), time.monotonic()
    spec = _spec(60.0, interval=30.0)
    task = ctx()
    writer = _writer(task)
    slices._Loop(task, spec, Reader(), writer, None, {}, {3: 100}, link).run()
    (at, positions, counts), *_ = link.reports
    assert positions == {3: 102} and at - started < 10
    assert (counts["records"], counts["detections"], sum(counts["latency_counts"])) == (2, 1, 1)  # for the driver's metrics
    assert [value for _, _, value, _ in writer._sink.sent if b"5000" in value]  # the detection was written first


def test_a_slice_checkpoints_every_commit_interval_from_one_checkpoints_start_to_the_next(monkeypatch):
    # Counted from each checkpoint's end, the checkpoint's own time was added to every record's wait.
    from detectorkit.runtime import slices

    from .test_processing import arrow, ctx

    clock = _FakeClock.installed(monkeypatch)

    class Reader(_FakeReader):
        position, at_end = {3: 0}, set()

        def poll(self, wait, max_records):
            clock.now += 0.01  # a record comes every 10 ms
            offset = self.position[3]
            self.position[3] = offset + 1
            return arrow([b'{"amount": 1.0, "customer": "c"}'], first_offset=offset)

    class Link(_FakeLink):
        reports = []

        def ended(self):
            return len(self.reports) >= 6

        def report(self, positions, at_end, durable, counts):
            self.reports.append(clock.now)

    def commit(ends):
        clock.now += 0.05  # each checkpoint takes half the interval

    task = ctx()
    writer = _writer(task)
    writer.commit = commit
    slices._Loop(task, _spec(60.0, interval=0.1), Reader(), writer, None, {}, {3: 0}, Link()).run()
    reports = Link.reports[:-1]  # the last: the slice's end
    periods = [b - a for a, b in zip(reports, reports[1:], strict=False)]
    assert len(periods) == 5 and all(p == pytest.approx(0.1, abs=0.011) for p in periods), periods  # within a poll


@pytest.mark.parametrize("still", ["task", "driver"])
def test_a_task_or_driver_that_stood_still_past_half_the_session_timeout_ends_the_slice_and_leaves_what_was_polled_then(monkeypatch, still):
    # A paused instance (SIGSTOP, a frozen VM), or its driver alone (its executors elsewhere, or
    # its own process group: pyspark's daemon makes one), may have lost its partitions meanwhile:
    # the task went on writing what the new owner writes too, until the driver ended the slice.
    import dataclasses

    from detectorkit.runtime import slices

    from .test_processing import arrow, ctx

    clock = _FakeClock.installed(monkeypatch)

    class Reader(_FakeReader):
        position, at_end = {3: 0}, set()

        def poll(self, wait, max_records):
            offset = self.position[3]
            clock.now += 6.0 if offset == 2 and still == "task" else 0.01  # paused in the third poll
            if offset == 2 and still == "driver":
                Link.silence = 6.0  # its beats stopped
            self.position[3] = offset + 1
            return arrow([b'{"amount": 5000.0, "customer": "c"}'], first_offset=offset)

    class Link(_FakeLink):
        reports = []

        def ended(self):
            return len(self.reports) >= 10

        def report(self, positions, at_end, durable, counts):
            self.reports.append(dict(positions))

    task = ctx()
    writer = _writer(task)
    spec = dataclasses.replace(_spec(60.0, interval=0.001), pause_seconds=5.0)
    assert slices._Loop(task, spec, Reader(), writer, None, {}, {3: 0}, Link()).run() is None
    assert Link.reports[-1] == {3: 2}  # the third record is the next owner's to read
    assert len(writer._sink.sent) == 2


def test_a_slices_next_positions_keep_a_reader_that_went_back_and_a_topic_created_again_starts_over():
    from detectorkit.runtime.slices import SlicePositions
    from detectorkit.runtime.task_result import NO_PARTITION, TaskResult

    positions = SlicePositions({0: 106, 1: 94, 2: 50})
    positions.began()
    # The input topic was created again under this slice: partition 0's reader found itself past the
    # new end and went back to its start; 1 and 2 went on from their old positions.
    ended = [TaskResult(partition=0, next_offset=40, went_back=True), *(TaskResult(partition=p, next_offset=o) for p, o in ((1, 120), (2, 60)))]
    positions.ended([*ended, TaskResult(partition=NO_PARTITION)], exactly_once=True)
    # Kept behind where it was planned: from 106 it went past the new end, and back, each slice.
    assert positions.next == {0: 40, 1: 120, 2: 60} and positions.known == {0, 1, 2}
    assert positions.input_checked(None) is None  # not there at that moment: nothing known yet
    # The driver sees the new id: 1 and 2 start over; 0's reader is on the new topic already.
    assert positions.input_checked(True) == {0: 40, 1: 0, 2: 0} and positions.known == frozenset()
    assert positions.input_checked(False) is None and positions.next == {0: 40, 1: 0, 2: 0}
    # A failed task's partition stays where it was planned.
    positions.began()
    positions.ended([TaskResult(partition=1, next_offset=5, error="TransactionError: fenced")], exactly_once=True)
    assert positions.next[1] == 0 and positions.known == frozenset()


def test_a_tasks_link_hears_its_drivers_beats_and_the_word_to_end_and_counts_the_silence_when_they_stop():
    import socket

    from detectorkit.runtime.slice_control import ALIVE, END, SliceControl
    from detectorkit.runtime.slice_control import Link as ControlLink
    from detectorkit.testing import wait_for

    control = SliceControl(beat_seconds=0.05)
    control.begin("t")
    link = ControlLink(control.address, "t", 5.0)
    connected = time.monotonic()
    try:
        # Past six beats' time, the driver was heard within the last four.
        wait_for(lambda: not link.ended() and time.monotonic() - connected > 0.3 and link.silent_for() < 0.2, timeout=5, what="beats")
        # The driver stands still (its serving thread stops beating, as when its process is paused).
        control._beat_seconds = 60.0
        wait_for(lambda: not link.ended() and link.silent_for() >= 0.3, timeout=5, what="the silence to be counted")
        control.end("t")
        wait_for(link.ended, timeout=5, what="the word to end")
    finally:
        link.close()
        control.close()
    # The word in two reads, after beats; and a driver gone ends it too.
    server = socket.create_server(("127.0.0.1", 0))
    split, gone = ControlLink(server.getsockname(), "t", 5.0), ControlLink(server.getsockname(), "t", 5.0)
    (driver, _), (closed, _) = server.accept(), server.accept()
    server.close()
    sent = time.monotonic()
    driver.sendall(ALIVE * 3 + END[:2])
    # Read (heard since they were sent), and not taken for the word.
    wait_for(lambda: not split.ended() and split.silent_for() < time.monotonic() - sent, timeout=5, what="the beats read")
    driver.sendall(END[2:])
    wait_for(split.ended, timeout=5, what="the word to end, split")
    closed.close()
    wait_for(gone.ended, timeout=5, what="the end of the connection")
    for s in (split, gone, driver):
        s.close()
