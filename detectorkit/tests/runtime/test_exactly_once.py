"""PROCESSING_GUARANTEE=exactly-once: the job killed (every process, as kill -9) at each point of a
task's commit sequence and started again, each time; a read_committed consumer of the output and
the dead-letter topic then sees every detection and every dead letter exactly once, with state too."""

import collections
import json
import os
import pathlib
import signal
import sys

import pytest

from detectorkit.runtime import crash_points
from detectorkit.samples import samples
from detectorkit.testing import create_test_topics, produce, read_all

from ..detectors import every_nth_reference
from ..jobs import COMMAND, HERE, Job, committed, job_env, run, wait_for
from ..models.spending import one_pass, spending, spending_model
from ..state.test_state_on_kafka import keyed

PARTITIONS = 4
RECORDS = 8_000
COUNT_COMMAND = [sys.executable, "-m", "detectorkit", "run", "--detector", "tests.detectors:COUNT"]
MODEL_COMMAND = [sys.executable, "-m", "detectorkit", "run", "--detector", "tests.detectors:MODEL"]


def outputs(bs, topics, committed_only=True):
    values = [json.loads(m["value"]) for m in read_all(bs, topics.output, committed_only=committed_only)]
    return collections.Counter((v["source"]["partition"], v["source"]["offset"]) for v in values)


def dead_letters(bs, topics, committed_only=True):
    records = read_all(bs, topics.dlq, committed_only=committed_only)
    return collections.Counter((int(m["headers"]["source_partition"]), int(m["headers"]["source_offset"])) for m in records)


def above_threshold(sent):
    return {(s.partition, s.offset) for s in sent if s.sample.kind == "valid" and s.sample.amount > 1000}


def malformed(sent, stateful):
    if stateful:  # the counting detector needs no field: only what is not a JSON object is refused
        return {(s.partition, s.offset) for s in sent if s.sample.kind in ("malformed_json", "not_an_object")}
    return {(s.partition, s.offset) for s in sent if s.sample.kind != "valid"}


def start(bs, name, kind, tmp_path=None):
    """Topics with records sent, the detections and dead letters one pass makes, the job's command
    and settings; `kind` stateless (a threshold), stateful (a count per key) or model (a model of
    windows' aggregates)."""
    topics = create_test_topics(bs, name, partitions=PARTITIONS)
    settings = {}
    if kind == "model":
        uri = spending_model(tmp_path / "model.onnx")
        sent = produce(bs, topics.input, spending(RECORDS))
        (expected, dead), command, settings = one_pass(sent, uri), MODEL_COMMAND, {"detector_model_uri": uri}
    elif kind == "stateful":
        sent = produce(bs, topics.input, keyed(RECORDS, seed=7))
        expected, dead, command = every_nth_reference(sent), malformed(sent, stateful=True), COUNT_COMMAND
    else:
        sent = produce(bs, topics.input, samples(RECORDS, seed=5, bad_every=50, high_share=0.2))
        expected, dead, command = above_threshold(sent), malformed(sent, stateful=False), COMMAND
    # Polls of 1,000 in two tasks of two partitions each: many commits, each task with a partition
    # committed before another (the point between two commits).
    env = job_env(bs, topics, starting_offsets="earliest", max_records_per_batch=1_000, group_session_timeout_seconds=6, slice_seconds=5, **settings)
    return topics, expected, dead, command, env


def crash(env, command, point, bs, topics):
    """A run killed at `point` the third time its workers reach it; returns the positions at the kill."""
    code, output = run({**env, "DETECTORKIT_CRASH_AT": f"{point}:3"}, timeout=240, command=command)
    assert code == -signal.SIGKILL, f"the job was to be killed at {point}, it ended with {code}:\n{output}"
    # Not stable: the kill may have left a transaction open with its offsets pending; the next
    # run's start aborts it (transactions.fence), a stable read here would wait out its timeout.
    return committed(bs, topics, range(PARTITIONS), stable=False)


@pytest.mark.parametrize("kind", ["stateless", "stateful", "model"])
def test_kill_9_at_every_point_of_the_commit_sequence_writes_everything_exactly_once(transactional_kafka, kind, tmp_path):
    """The points are reached inside a slice's loop, at each commit interval's checkpoint."""
    bs = transactional_kafka
    topics, expected, expected_dead, command, env = start(bs, "eos-kill", kind, tmp_path)
    env["PROCESSING_GUARANTEE"] = "exactly-once"
    # A checkpoint after about every poll: a slice reads on between checkpoints, and at the
    # default interval the third reach of a point comes after the backlog.
    env.update(SLICE_COMMIT_INTERVAL_SECONDS="0.01")
    moved = []
    for point in crash_points.POINTS:
        before = sum(o or 0 for o in committed(bs, topics, range(PARTITIONS), stable=False).values())
        after = sum(o or 0 for o in crash(env, command, point, bs, topics).values())
        moved.append(after - before)
    # The kills landed mid-stream: the killed runs committed some records, and every kill but
    # the last left records to read (the last may land as the stream's last partitions commit).
    assert sum(moved) > 0 and sum(moved[:-1]) < RECORDS, f"the kills must land mid-stream (records committed by each run: {moved})"

    code, output = run({**env, "STOP_AFTER_IDLE_SECONDS": "3"}, timeout=240, command=command)
    assert code == 0, output
    assert sum(committed(bs, topics, range(PARTITIONS)).values()) == RECORDS
    found = outputs(bs, topics)
    assert expected and set(found) == expected  # nothing lost, and with state: nothing shifted
    assert set(found.values()) == {1}  # nothing twice
    dead = dead_letters(bs, topics)
    assert set(dead) == expected_dead
    assert all(n == 1 for n in dead.values())
    assert dead or kind == "stateful"  # (the stateful run's records are all valid)
    # The killed runs did write detections or dead letters that never became visible: aborted, not
    # just never written. (Either counts: where the third reach of a point falls, its transaction
    # may hold dead letters and no detection.)
    written = sum(outputs(bs, topics, committed_only=False).values()) + sum(dead_letters(bs, topics, committed_only=False).values())
    assert written > sum(found.values()) + sum(dead.values()), "no kill left an aborted write behind; the test proved nothing"


def test_a_task_that_fails_after_its_outputs_is_planned_again_without_a_duplicate(transactional_kafka):
    bs = transactional_kafka
    topics, expected, _, command, env = start(bs, "eos-fail", "stateless")
    env = {**env, "PROCESSING_GUARANTEE": "exactly-once", "STOP_AFTER_IDLE_SECONDS": "3"}
    code, output = run({**env, "DETECTORKIT_CRASH_AT": "before-commit:2:raise"}, timeout=240, command=command)
    assert code == 0, output
    assert "failure injected at before-commit" in output  # the task did fail, after writing its outputs
    found = outputs(bs, topics)
    assert set(found) == expected
    assert set(found.values()) == {1}
    assert sum(outputs(bs, topics, committed_only=False).values()) > len(found)  # its outputs were aborted


def test_a_transaction_left_open_past_its_timeout_is_aborted_said_so_and_planned_again(transactional_kafka):
    bs = transactional_kafka
    topics, expected, _, command, env = start(bs, "eos-timeout", "stateless")
    env = {**env, "PROCESSING_GUARANTEE": "exactly-once", "STOP_AFTER_IDLE_SECONDS": "3", "TRANSACTION_TIMEOUT_SECONDS": "2"}
    # A task stalls after its outputs, inside its transaction, past the timeout (the test broker
    # aborts timed-out transactions within a second of their timeout).
    code, output = run({**env, "DETECTORKIT_CRASH_AT": "before-commit:2:stall5"}, timeout=240, command=command)
    assert code == 0, output
    assert "timed out while" in output and "past TRANSACTION_TIMEOUT_SECONDS (2 s)" in output, output
    found = outputs(bs, topics)
    assert set(found) == expected
    assert set(found.values()) == {1}
    assert sum(outputs(bs, topics, committed_only=False).values()) > len(found)  # the timed-out outputs were aborted


def session_processes(sid):
    """Pids of every process of a session: a job's driver and JVM, and its Python workers, which
    PySpark's daemon puts in a process group of their own."""
    pids = []
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # after the state: ppid, pgrp, session
            pids.append(int(stat.parent.name))
    return pids


def signal_session(job, signum):
    for pid in session_processes(job.process.pid):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def test_a_paused_instance_that_resumes_after_its_partitions_moved_is_fenced_and_nothing_of_it_shows(transactional_kafka):
    bs = transactional_kafka
    topics, expected, _, command, env = start(bs, "eos-zombie", "stateful")
    env.update(PROCESSING_GUARANTEE="exactly-once")
    # A's calls are slow, so it is paused (every process of it, as a frozen VM or a long GC pause)
    # in the middle of a transaction with outputs written.
    zombie = Job({**env, "DETECTOR_DELAY_SECONDS": "2", "STOP_AFTER_IDLE_SECONDS": "3"}, command)
    jobs = [zombie]

    def writing_in_a_transaction():
        written = outputs(bs, topics, committed_only=False)
        ends = committed(bs, topics, range(PARTITIONS))
        return sum(o or 0 for o in ends.values()) > 0 and any(offset >= (ends[p] or 0) for p, offset in written)

    def paused_in_a_transaction():
        """Paused once it writes a batch; resumed and tried again when the batch committed before the
        pause took hold (a task of one partition commits right after its output)."""
        wait_for(writing_in_a_transaction, timeout=180, what="the first instance writing a batch in a transaction")
        signal_session(zombie, signal.SIGSTOP)
        if writing_in_a_transaction():
            return True
        signal_session(zombie, signal.SIGCONT)
        return False

    try:
        wait_for(paused_in_a_transaction, timeout=300, what="a pause in the middle of a transaction")
        at_pause = committed(bs, topics, range(PARTITIONS))
        # The partitions move to another instance once the paused one misses its session timeout.
        successor = Job({**env, "STOP_AFTER_IDLE_SECONDS": "3"}, command)
        jobs.append(successor)
        done = lambda: sum(o or 0 for o in committed(bs, topics, range(PARTITIONS)).values()) == RECORDS  # noqa: E731
        wait_for(done, timeout=180, what="the successor to finish")
        signal_session(zombie, signal.SIGCONT)
        assert successor.wait(180) == 0, successor.output()
        assert zombie.wait(180) == 0, zombie.output()
    finally:
        signal_session(zombie, signal.SIGCONT)
        for job in jobs:
            if job.process.poll() is None:
                job.signal_group(signal.SIGKILL)
    assert sum(o or 0 for o in at_pause.values()) < RECORDS
    found = outputs(bs, topics)
    assert set(found) == expected
    assert set(found.values()) == {1}
    written = outputs(bs, topics, committed_only=False)
    assert sum(written.values()) > sum(found.values()), "the paused instance had written nothing in its transaction; the test proved nothing"
    assert "fenced" in zombie.output() or "rebalanced" in zombie.output(), zombie.output()


def test_the_same_kill_with_at_least_once_writes_some_detections_twice(transactional_kafka):
    """The scenario above, at-least-once: the kill after the outputs are flushed, before the
    offsets are committed, replays those outputs. (What exactly-once is for, shown failing without it.)"""
    bs = transactional_kafka
    topics, expected, _, command, env = start(bs, "alo-kill", "stateless")
    crash(env, command, "before-commit", bs, topics)
    code, output = run({**env, "STOP_AFTER_IDLE_SECONDS": "3"}, timeout=240, command=command)
    assert code == 0, output
    found = outputs(bs, topics)
    assert set(found) == expected
    assert max(found.values()) == 2


def test_exactly_once_on_the_embedded_broker_is_refused_at_start_with_one_line():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "DETECTOR_", "SPARK_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH")) if p)
    env["PROCESSING_GUARANTEE"] = "exactly-once"
    code, output = run(env, timeout=180)
    assert code == 2, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output
    assert "PROCESSING_GUARANTEE=exactly-once needs Apache Kafka" in errors[0]
    assert "Traceback" not in output
