"""Running the test detector as its own process, the way a deployment runs a service."""

import os
import pathlib
import signal
import subprocess
import sys
import tempfile

from detectorkit.devtools.processes import signal_session
from detectorkit.kafka import clients
from detectorkit.kafka.offset_store import OffsetStore
from detectorkit.testing import wait_for  # noqa: F401 - the tests take it from here

HERE = pathlib.Path(__file__).parent
COMMAND = [sys.executable, "-m", "detectorkit", "run", "--detector", "tests.detectors:THRESHOLD"]
# The runtime's default runs exactly-once on Apache Kafka: a test about the guarantee says which it
# runs; the others keep the path they were written for, whichever broker the suite runs on.
AT_LEAST_ONCE = {"processing_guarantee": "at-least-once"}


def job_settings(bootstrap_servers, topics, **extra):
    """Settings of a job in this process on the test's topics and group."""
    from detectorkit.settings import Settings

    return Settings(
        kafka_bootstrap_servers=bootstrap_servers,
        input_topic=topics.input,
        output_topic=topics.output,
        dlq_topic=topics.dlq,
        consumer_group=topics.group,
        **{**AT_LEAST_ONCE, **extra},
    )


def job_env(bootstrap_servers, topics, **settings):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DETECTOR_", "NOTIFIER_", "SPARK_"))}
    env.update(
        {
            "PYTHONPATH": os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH")) if p),
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers,
            "INPUT_TOPIC": topics.input,
            "OUTPUT_TOPIC": topics.output,
            "DLQ_TOPIC": topics.dlq,
            "CONSUMER_GROUP": topics.group,
        }
    )
    env.update({k.upper(): str(v) for k, v in {**AT_LEAST_ONCE, **settings}.items()})
    return env


class Job:
    """A job process with its output in files (a pipe nobody reads would block it)."""

    def __init__(self, env, command=COMMAND):
        self.log = tempfile.NamedTemporaryFile(prefix="job-", suffix=".log", delete=False)
        # Its own session, so a kill reaches the JVM and the Python workers too, as in a container.
        self.process = subprocess.Popen(command, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, timeout=300):
        return self.process.wait(timeout=timeout)

    def output(self):
        return pathlib.Path(self.log.name).read_text(errors="replace")

    def signal_group(self, signum):
        """Every process of the job's session, as a container's are (the Python workers too)."""
        signal_session(self.process.pid, signum)


def run(env, timeout=300, command=COMMAND):
    job = Job(env, command)
    try:
        code = job.wait(timeout)
    except subprocess.TimeoutExpired:
        job.signal_group(signal.SIGKILL)  # a job left running would hold a broker's groups and a core
        raise
    return code, job.output()


def committed(bootstrap_servers, topics, partitions, stable=True):
    """The group's committed offsets; `stable=False` does not wait for a pending transaction's
    (one a killed job left open) and gives the offsets committed before it."""
    isolation = "read_committed" if stable else "read_uncommitted"
    store = OffsetStore(clients.consumer(clients.base(bootstrap_servers), topics.group, **{"isolation.level": isolation}), topics.input)
    try:
        return store.committed(partitions)
    finally:
        store.close()


def aggregator_command(bootstrap_servers, metrics_topic, port=0, *extra):
    """`detectorkit aggregate` on `metrics_topic`, aggregating every second (the tests' pace)."""
    return [
        sys.executable, "-m", "detectorkit", "aggregate",
        "--bootstrap-servers", bootstrap_servers,
        "--metrics-topic", metrics_topic,
        "--aggregate-topic", f"{metrics_topic}-agg",
        "--port", str(port),
        "--interval-seconds", "1",
        *extra,
    ]  # fmt: skip


def command_lines(processes) -> list[str]:
    """The command lines of the psutil processes still running: one may exit (or be a zombie not yet
    reaped) between the listing and the reading, and is left out."""
    import psutil

    lines = []
    for process in processes:
        try:
            lines.append(" ".join(process.cmdline()))
        except psutil.Error:
            continue
    return lines
