"""A detector generated from the template, on a Spark standalone cluster of 1 master and 2 workers
(`detectorkit cluster`). The workers' Python environment has detectorkit's dependencies but neither
detectorkit nor the service: both reach the executors with the job. A worker killed mid-stream
loses nothing."""

import collections
import json
import os
import pathlib
import signal
import subprocess
import sys

import psutil
import pytest

from detectorkit.devtools.cluster import LocalCluster, make_workers_env
from detectorkit.samples import samples
from detectorkit.testing import create_test_topics, produce, read_all

from ..jobs import Job, command_lines, committed, job_env, wait_for

REPO = pathlib.Path(__file__).resolve().parents[3]
SERVICE, PACKAGE = "cluster-orders", "cluster_orders"
RECORDS, PARTITIONS = 6_000, 4


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """The template's threshold detector, baked and installed here (the driver's environment)."""
    from cookiecutter.main import cookiecutter

    project = cookiecutter(
        str(REPO),
        no_input=True,
        output_dir=str(tmp_path_factory.mktemp("bake")),
        extra_context={"service_name": SERVICE, "detector_kind": "threshold"},
    )
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", project], check=True)
    return [sys.executable, "-m", PACKAGE]


@pytest.fixture(scope="module")
def workers_python(tmp_path_factory):
    python = make_workers_env(tmp_path_factory.mktemp("workers") / "env")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for package in ("detectorkit", PACKAGE, "tests"):
        found = subprocess.run([str(python), "-c", f"import {package}"], env=env, cwd="/", capture_output=True)
        assert found.returncode != 0, f"the workers' environment must not have {package} for this test to mean anything"
    return str(python)


@pytest.fixture(scope="module")
def cluster(workers_python):
    path = os.environ.pop("PYTHONPATH", None)  # the workers import only what their environment has
    c = LocalCluster(workers=2, cores=1, memory="1g", python=workers_python).start()
    yield c
    c.stop()
    if path is not None:
        os.environ["PYTHONPATH"] = path


def expected(sent):
    return {(s.partition, s.offset) for s in sent if s.sample.kind == "valid" and s.sample.amount > 1000}


def detections(bs, topics):
    values = [json.loads(m["value"]) for m in read_all(bs, topics.output)]
    return collections.Counter((v["source"]["partition"], v["source"]["offset"]) for v in values)


def executor_pids(c: LocalCluster) -> set[int]:
    """The processes under the workers: executor JVMs and their Python workers."""
    pids = set()
    for worker in c.processes[1:]:
        try:
            pids |= {p.pid for p in psutil.Process(worker.pid).children(recursive=True)}
        except psutil.Error:
            continue
    return pids


def test_spark_submit_runs_the_generated_detector_with_its_own_master(kafka_bootstrap_servers, service, cluster):
    # One Python for the driver and the executors, with everything installed: as one image for both.
    import pyspark

    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "submit", partitions=PARTITIONS)
    sent = produce(bs, topics.input, samples(2_000, seed=32, bad_every=100, high_share=0.2))
    env = job_env(bs, topics, starting_offsets="earliest", stop_after_idle_seconds=3)
    main = subprocess.run(
        [sys.executable, "-c", f"import {PACKAGE}.__main__ as m; print(m.__file__)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    submit = pathlib.Path(pyspark.__file__).parent / "bin" / "spark-submit"
    command = [str(submit), "--master", cluster.master_url, "--conf", f"spark.pyspark.python={sys.executable}", main]
    before = set(cluster.executor_logs())
    code = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert code.returncode == 0, code.stdout[-3000:] + code.stderr[-3000:]
    assert set(detections(bs, topics)) == expected(sent)
    assert set(cluster.executor_logs()) - before, "the job must have run on the cluster's executors, not in local mode"


def test_generated_detector_on_a_two_worker_cluster_loses_nothing_when_a_worker_dies(kafka_bootstrap_servers, service, cluster, workers_python):
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "cluster", partitions=PARTITIONS)
    records = list(samples(RECORDS, seed=31, bad_every=100, high_share=0.2))
    half = RECORDS // 2
    sent = produce(bs, topics.input, records[:half])
    # Runs until told to stop: a stop when idle could come while the dead worker's task waits to be
    # retried, before it has read what arrived after the kill.
    env = job_env(
        bs,
        topics,
        starting_offsets="earliest",
        max_records_per_batch=400,
        spark_master=cluster.master_url,
        pyspark_python=workers_python,
        stop_after_idle_seconds=0,
        metrics_interval_seconds=1,
    )
    env.pop("PYTHONPATH")
    before = set(cluster.executor_logs())
    job = Job(env, command=service)
    seen = set()

    def done():
        return sum(o or 0 for o in committed(bs, topics, range(PARTITIONS)).values())

    def on_both_workers():
        seen.update(executor_pids(cluster))
        assert job.process.poll() is None, job.output()[-5000:]
        return done() > 0 and len(set(cluster.executor_logs()) - before) == 2

    wait_for(on_both_workers, timeout=240, what="the job's first commits, with executors on both workers")
    cluster.kill_worker(0)  # a machine lost mid-stream: its executor, its Python workers and its running task
    at_kill = done()
    sent += produce(bs, topics.input, records[half:])

    def all_committed():
        seen.update(executor_pids(cluster))
        assert job.process.poll() is None, job.output()[-5000:]
        return done() == RECORDS

    wait_for(all_committed, timeout=300, what="every record committed after the worker died")
    job.process.send_signal(signal.SIGTERM)
    assert job.wait(60) == 0, job.output()[-5000:]

    assert at_kill <= half, "the worker must die before the second half arrives for this test to mean anything"
    found = detections(bs, topics)
    assert set(found) == expected(sent)  # nothing lost (a retried task may write some twice)

    # The executors' logs follow detectorkit's log4j2.properties from the workers' conf: no INFO.
    logs = [p.read_text(errors="replace") for p in set(cluster.executor_logs()) - before]
    assert logs and not any(" INFO " in text for text in logs), logs[0][-2000:]
    # The task processes the job counted are the executors' (on the workers), not the driver's.
    stopped = next(json.loads(line) for line in job.output().splitlines() if '"job stopped"' in line)
    reported = {p["pid"]: p for p in stopped["task_processes"]}
    assert {p["kind"] for p in reported.values()} == {"python", "jvm"}
    assert set(reported) <= seen, (reported, seen)
    assert sum(p["cpu_seconds"] for p in reported.values()) > 0
    print(
        f"worker killed with {at_kill:,} of {RECORDS:,} records committed; {sum(n > 1 for n in found.values())} detection(s) "
        f"written twice by retried tasks; task processes {sorted((p['kind'], p['pid']) for p in reported.values())}"
    )


def test_the_generated_detectors_backtest_runs_on_the_cluster(kafka_bootstrap_servers, service, cluster, workers_python, tmp_path):
    """`<service> backtest --spark` with SPARK_MASTER at the cluster: a task per partition on its
    executors, whose environment has neither detectorkit nor the service (both shipped)."""
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "cluster-backtest", partitions=PARTITIONS)
    sent = produce(bs, topics.input, samples(2_000, seed=33, bad_every=100, high_share=0.2))
    env = job_env(bs, topics, spark_master=cluster.master_url, pyspark_python=workers_python)
    env.pop("PYTHONPATH")
    out = tmp_path / "found.jsonl"
    before = set(cluster.executor_logs())
    done = subprocess.run([*service, "backtest", "--spark", "--out", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = [json.loads(line)["source"] for line in out.read_text().splitlines()]
    assert {(s["partition"], s["offset"]) for s in found} == expected(sent) and len(found) == len(expected(sent))
    assert f"{len(sent):,} records read" in done.stdout
    assert set(cluster.executor_logs()) - before, "the backtest must have run on the cluster's executors, not in local mode"
    assert committed(bs, topics, range(PARTITIONS)) == dict.fromkeys(range(PARTITIONS))  # no group of the service's moved

    # The same records as a file the executors read by its URI: the same detections, other offsets
    # (the file's keys spread over partitions of its own).
    history = tmp_path / "history.jsonl"
    history.write_bytes(b"".join(s.sample.value + b"\n" for s in sent))
    files_out = tmp_path / "from-files.jsonl"
    command = [*service, "backtest", "--spark", "--files", history.as_uri(), "--key-field", "customer", "--partitions", "3", "--out", str(files_out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    from_files = [json.loads(line)["source"] for line in files_out.read_text().splitlines()]
    assert len(from_files) == len(expected(sent)) and {s["partition"] for s in from_files} == {0, 1, 2}
    assert f"{len(sent):,} records read" in done.stdout


def test_cluster_command_prints_the_master_url_and_stops_every_process_on_sigterm():
    command = [sys.executable, "-m", "detectorkit", "cluster", "--workers", "1", "--port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("spark://127.0.0.1:"), process.stderr.read()
        spawned = psutil.Process(process.pid).children(recursive=True)
        assert any("deploy.worker.Worker" in line for line in command_lines(spawned))
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, process.stderr.read()
        _, alive = psutil.wait_procs(spawned, timeout=30)
        assert not alive, alive
    finally:
        if process.poll() is None:
            process.kill()
