"""The job as a process: graceful stops, kill -9, restarts with fresh checkpoints, bad starts."""

import collections
import json
import re
import signal
import socket
import sys
import time

import pytest

from detectorkit.samples import samples
from detectorkit.testing import create_test_topics, produce, read_all

from ..jobs import COMMAND, Job, committed, job_env, run, wait_for

RECORDS = 20_000
PARTITIONS = 4


def detections(bs, topics):
    values = [json.loads(m["value"]) for m in read_all(bs, topics.output)]
    return collections.Counter((v["source"]["partition"], v["source"]["offset"]) for v in values)


def expected(sent):
    return {(s.partition, s.offset) for s in sent if s.sample.kind == "valid" and s.sample.amount > 1000}


def start_mid_stream(bs, name, **settings):
    topics = create_test_topics(bs, name, partitions=PARTITIONS)
    sent = produce(bs, topics.input, samples(RECORDS, seed=21, bad_every=100, high_share=0.2))
    # Small batches, so the stop lands mid-stream with many batches to go.
    env = job_env(bs, topics, starting_offsets="earliest", max_records_per_batch=1_000, **settings)
    job = Job(env)
    wait_for(
        lambda: 0 < sum(o or 0 for o in committed(bs, topics, range(PARTITIONS)).values()) or job.process.poll() is not None,
        timeout=180,
        what="a first committed batch",
    )
    assert job.process.poll() is None, job.output()
    return topics, sent, env, job


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_graceful_stop_and_restart_lose_and_duplicate_nothing(kafka_bootstrap_servers, signum):
    bs = kafka_bootstrap_servers
    # Slow calls: a slice's tasks would read the whole backlog before the stop reached them.
    topics, sent, env, job = start_mid_stream(bs, f"graceful{int(signum)}", detector_delay_seconds=0.2)
    if signum == signal.SIGINT:
        job.signal_group(signum)  # Ctrl-C in a terminal reaches the whole process group
    else:
        job.process.send_signal(signum)  # as a container runtime does
    assert job.wait(120) == 0, job.output()
    assert '"stop requested"' in job.output()
    positions = committed(bs, topics, range(PARTITIONS))
    at_stop = sum(positions.values())
    assert 0 < at_stop < RECORDS, "the stop must land mid-stream for this test to mean anything"
    # Everything written before the stop is committed: the output holds no record past the commit.
    assert len(detections(bs, topics)) == len({x for x in expected(sent) if x[1] < positions[x[0]]})

    if signum == signal.SIGINT:
        return  # the same stop as SIGTERM from here on; the restart is checked once, below

    code, output = run({**env, "STOP_AFTER_IDLE_SECONDS": "3", "DETECTOR_DELAY_SECONDS": "0"})  # a new temporary checkpoint directory
    assert code == 0, output
    found = detections(bs, topics)
    assert set(found) == expected(sent)
    assert set(found.values()) == {1}
    assert sum(committed(bs, topics, range(PARTITIONS)).values()) == RECORDS


def test_kill_9_and_restart_lose_nothing_and_replay_only_the_uncommitted_batch(kafka_bootstrap_servers):
    """At-least-once commits at each checkpoint of a slice's tasks: what they wrote since is what comes twice."""
    bs = kafka_bootstrap_servers
    # A slice calls the detector on each poll's pieces (~60 calls a chunk of 1,000 here) and
    # checkpoints every 0.1 s by default: checkpoints every 5 s and a small delay leave each task
    # writing a chunk's detections (~3 s) for seconds before its next checkpoint, and the driver's
    # commit of it.
    topics, sent, env, job = start_mid_stream(bs, "kill9", detector_delay_seconds=0.05, slice_seconds=12, slice_commit_interval_seconds=5)

    def batch_in_flight_has_written():
        ends = committed(bs, topics, range(PARTITIONS))
        return any(offset >= ends[p] for p, offset in detections(bs, topics))

    # Kill while a batch has written detections but not committed: the case that duplicates.
    wait_for(batch_in_flight_has_written, timeout=120, what="a batch in flight with output")
    job.signal_group(signal.SIGKILL)
    job.wait(60)
    at_kill = committed(bs, topics, range(PARTITIONS))
    assert 0 < sum(at_kill.values()) < RECORDS
    # Detections written by the batch in flight but never committed will be written again.
    written = detections(bs, topics)
    uncommitted = {x for x in written if x[1] >= at_kill[x[0]]}

    code, output = run({**env, "STOP_AFTER_IDLE_SECONDS": "3", "DETECTOR_DELAY_SECONDS": "0"})
    assert code == 0, output
    found = detections(bs, topics)
    assert set(found) == expected(sent)  # nothing lost
    duplicated = {x for x, n in found.items() if n > 1}
    assert uncommitted, "the kill must land while a batch is half written for this test to mean anything"
    assert duplicated == uncommitted
    assert max(found.values()) <= 2
    print(
        f"kill -9: {len(duplicated)} duplicate detection(s), all from the batch in flight "
        f"({RECORDS - sum(at_kill.values())} records not yet committed at the kill)"
    )


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_broker_exits_non_zero_within_the_timeout():
    topics = type("T", (), {"input": "in", "output": "out", "dlq": "dlq", "group": "g"})
    env = job_env(f"127.0.0.1:{closed_port()}", topics, connect_timeout_seconds=3)
    started = time.monotonic()
    code, output = run(env, timeout=120)
    elapsed = time.monotonic() - started
    assert code == 2
    assert "cannot reach Kafka at 127.0.0.1" in output and "within 3 s" in output
    assert elapsed < 3 + 20  # the timeout plus interpreter start, not Spark's


def test_invalid_setting_stops_at_start_with_one_line():
    topics = type("T", (), {"input": "in", "output": "out", "dlq": "dlq", "group": "g"})
    code, output = run(job_env("127.0.0.1:1", topics, starting_offsets="newest"), timeout=60)
    assert code == 2
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert errors == [line for line in errors if "STARTING_OFFSETS='newest'" in line] and len(errors) == 1
    assert "Traceback" not in output


def test_settings_from_an_env_file_reach_the_job_and_the_environment_wins(tmp_path):
    topics = type("T", (), {"input": "in", "output": "out", "dlq": "dlq", "group": "g"})
    env_file = tmp_path / ".env"
    env_file.write_text("STARTING_OFFSETS=newest\nMAX_RECORDS_PER_BATCH=-1\n")
    env = job_env("127.0.0.1:1", topics)
    env["STARTING_OFFSETS"] = "earliest"
    code, output = run(env, timeout=60, command=[*COMMAND, "--env-file", str(env_file)])
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "MAX_RECORDS_PER_BATCH='-1'" in errors[0] and "newest" not in errors[0], output


def test_missing_input_topic_is_a_clear_error(kafka_bootstrap_servers):
    topics = type("T", (), {"input": "no-such-topic-here", "output": "out", "dlq": "dlq", "group": "g"})
    code, output = run(job_env(kafka_bootstrap_servers, topics, connect_timeout_seconds=5), timeout=60)
    assert code == 2
    assert "topic 'no-such-topic-here' does not exist" in output and "CREATE_TOPICS=true" in output


def test_topics_as_code_creates_no_topic_and_names_each_missing_one(kafka_bootstrap_servers):
    """TOPICS_AS_CODE=true (topics from Strimzi's KafkaTopic): a missing topic stops the job at start
    with one line, the stateful job's changelog included, and the job creates none of them."""
    from detectorkit.kafka import clients

    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "as-code", partitions=2)
    metrics = f"metrics.{topics.group}"
    env = job_env(bs, topics, topics_as_code="true", metrics_topic=metrics, connect_timeout_seconds=10)
    command = [sys.executable, "-m", "detectorkit", "run", "--detector", "tests.detectors:COUNT"]

    def refusal():
        code, output = run(env, timeout=120, command=command)
        errors = [line for line in output.splitlines() if line.startswith("error:")]
        assert code == 2 and len(errors) == 1 and "TOPICS_AS_CODE=true" in errors[0] and "Traceback" not in output, output
        return errors[0]

    assert f"topic(s) {metrics} do not exist" in refusal()
    clients.create_topics(clients.base(bs), {metrics: 1})
    line = refusal()
    changelog = re.search(r"changelog topic '([^']+)' does not exist", line)
    assert changelog and "with 2 partitions (the input's) and cleanup.policy=compact" in line, line
    made = set(clients.new_admin(clients.base(bs)).list_topics(timeout=10).topics)
    assert changelog.group(1) not in made and metrics in made


def test_restarts_on_a_kept_checkpoint_dir_lose_and_duplicate_nothing(kafka_bootstrap_servers, tmp_path):
    """A user keeps CHECKPOINT_DIR across deploys and stops the job twice while records flow.
    The group's committed offsets must be the position every time, never Spark's commit log."""
    import threading

    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "keptcheckpoint", partitions=PARTITIONS)
    env = job_env(
        bs, topics, starting_offsets="earliest", max_records_per_batch=500, checkpoint_dir=str(tmp_path / "checkpoints"), instance_id="kept-1"
    )
    sent = []
    done = threading.Event()

    def upstream():
        seed = 100
        while not done.is_set():
            sent.extend(produce(bs, topics.input, samples(200, seed=seed, bad_every=50, high_share=0.3)))
            seed += 1
            done.wait(0.05)  # a steady trickle, not a wait for a condition

    feeder = threading.Thread(target=upstream, daemon=True)
    feeder.start()
    try:
        for restart in range(2):
            job = Job(env)
            before = sum(o or 0 for o in committed(bs, topics, range(PARTITIONS)).values())

            def progressed(job=job, before=before):
                return sum(o or 0 for o in committed(bs, topics, range(PARTITIONS)).values()) > before + 1_000 or job.process.poll() is not None

            wait_for(progressed, timeout=180, what=f"progress before stop {restart + 1}")
            job.process.send_signal(signal.SIGTERM)
            assert job.wait(120) == 0, job.output()
            assert (tmp_path / "checkpoints").is_dir()
    finally:
        done.set()
        feeder.join()
    code, output = run({**env, "STOP_AFTER_IDLE_SECONDS": "3"})
    assert code == 0, output
    found = detections(bs, topics)
    assert set(found) == expected(sent)
    duplicated = sum(n - 1 for n in found.values())
    assert duplicated == 0, f"{duplicated} detection(s) written twice across the restarts"
    assert sum(committed(bs, topics, range(PARTITIONS)).values()) == len(sent)
    assert not any((tmp_path / "checkpoints").iterdir())  # a graceful stop leaves no checkpoint behind


def test_health_endpoint_is_ready_while_reading_and_not_live_when_batches_stall(kafka_bootstrap_servers):
    import urllib.error
    import urllib.request

    from detectorkit.devtools.embedded_broker import free_port

    port = free_port()

    def status(path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None  # not listening yet

    # Only valid records, so the detector runs once a task: sleeping 2 s a call, every batch takes
    # 2 s. With 1 s allowed and records waiting, the job is not live mid-batch.
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "health", partitions=PARTITIONS)
    produce(bs, topics.input, samples(4_000, seed=22, bad_every=0))
    env = job_env(
        bs,
        topics,
        starting_offsets="earliest",
        max_records_per_batch=500,
        detector_delay_seconds=2,
        health_port=port,
        health_host="127.0.0.1",
        health_stall_seconds=1,
        metrics_interval_seconds=0.5,
    )
    job = Job(env)
    wait_for(lambda: status("/ready") == 200 or job.process.poll() is not None, timeout=120, what="/ready")
    assert status("/ready") == 200
    wait_for(lambda: status("/live") == 503, timeout=60, what="/live to fail while a slow batch holds records back")
    job.process.send_signal(signal.SIGTERM)
    assert job.wait(120) == 0, job.output()
    assert '"health endpoint"' in job.output()
