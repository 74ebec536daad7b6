"""What the benchmarks share: the baked detector service and the Kafka Streams peer they run,
contenders as processes, and the throughput run that measures one of them.

run.py dispatches to stateful.py, whose contenders are measured as run.py's are; with these here,
neither imports the other (stores.py and handover.py take the baked service and the machine's
description from here too).
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

import psutil
from confluent_kafka import Consumer, TopicPartition

from detectorkit.kafka import clients

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
WORK = HERE / ".work"
SERVICE = "high-value-orders"
PACKAGE = SERVICE.replace("-", "_")
THRESHOLD = 1000.0
PARTITIONS = 8
# The cores the detector service's Spark job uses (SPARK_MASTER's default, local[2]); the peers that
# can use several get as many.
CORES = 2

# ---- set-up --------------------------------------------------------------------------------------


def ensure_service() -> str:
    """Bake the template's default service and install it beside detectorkit; returns its command."""
    target = WORK / SERVICE
    if not (target / "pyproject.toml").exists():
        WORK.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "cookiecutter", str(REPO), "--no-input", "-f", "-o", str(WORK)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", str(target)], check=True)
    return str(pathlib.Path(sys.executable).parent / SERVICE)


def ensure_kafka_streams(main_class: str = "bench.Detector") -> list[str]:
    """The Kafka Streams peer, built with Maven (jars from Maven Central) once its sources change;
    returns the java command line of `main_class` (bench.Burst: the stateful one) before its arguments."""
    project = HERE / "contenders" / "kafka-streams"
    jar = project / "target" / "kafka-streams-detector-1.jar"
    sources = [project / "pom.xml", *(project / "src").rglob("*.java")]
    if not jar.exists() or any(s.stat().st_mtime > jar.stat().st_mtime for s in sources):
        subprocess.run(["mvn", "-q", "-B", "-f", str(project / "pom.xml"), "package", "dependency:copy-dependencies", "-DskipTests"], check=True)
    return ["java", "-cp", f"{jar}:{project / 'target' / 'lib'}/*", main_class]


# ---- measuring -----------------------------------------------------------------------------------


class TreeSampler(threading.Thread):
    """Peak memory and CPU time of a process and all its descendants.

    Memory is counted twice: the sum of resident set sizes, and the sum of proportional set sizes
    (PSS, Linux), which shares each page among the processes mapping it. PySpark forks its Python
    workers from one daemon, so their RSS counts the same copy-on-write pages again and again; PSS
    is the memory the tree really holds, and the figure the 2 GiB target is read against.
    """

    def __init__(self, pid: int, interval: float = 0.2):
        super().__init__(daemon=True)
        self.root = psutil.Process(pid)
        self.interval = interval
        self.peak_rss = 0
        self.peak_pss = 0
        self.pss = 0  # at the last sample
        # The last sample's PSS by kind of process, and how many of each (a forked Python worker
        # counted apart from the daemon it was forked from, whose command line it keeps).
        self.pss_by_kind: dict[str, tuple[int, int]] = {}
        # Each kind's PSS at the sample where the whole tree's was highest (where the peak was).
        self.at_peak_by_kind: dict[str, tuple[int, int]] = {}
        self.cpu = 0.0
        self._cpu_by_pid: dict[int, float] = {}
        self._name_by_pid: dict[int, str] = {}
        self._sys_by_pid: dict[int, float] = {}
        self._halt = threading.Event()

    def sample(self) -> None:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        rss = pss = 0
        by_kind: dict[str, tuple[int, int]] = {}
        for proc in procs:
            try:
                info = proc.memory_full_info() if hasattr(psutil.Process, "memory_full_info") else proc.memory_info()
                own = getattr(info, "pss", info.rss)
                rss += info.rss
                pss += own
                # Each time: Spark's launcher script execs the JVM in the same process.
                name = self._name_by_pid[proc.pid] = _kind_of(proc)
                kind = f"{name} (forked)" if self._name_by_pid.get(proc.ppid()) == name else name
                had, n = by_kind.get(kind, (0, 0))
                by_kind[kind] = (had + own, n + 1)
                t = proc.cpu_times()
                # Remember each process's own CPU: an exited worker's seconds still count.
                self._cpu_by_pid[proc.pid] = max(self._cpu_by_pid.get(proc.pid, 0.0), t.user + t.system)
                self._sys_by_pid[proc.pid] = max(self._sys_by_pid.get(proc.pid, 0.0), t.system)
            except psutil.Error:
                continue
        self.pss = pss
        self.pss_by_kind = by_kind
        if pss > self.peak_pss:
            self.at_peak_by_kind = by_kind
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_pss = max(self.peak_pss, pss)
        self.cpu = sum(self._cpu_by_pid.values())

    def by_kind(self) -> dict[str, float]:
        """CPU seconds so far (and of them, the kernel's), summed by kind of process
        (BENCH_CPU_BY_PROCESS=1 prints them)."""
        kinds: dict[str, float] = {}
        for pid, cpu in self._cpu_by_pid.items():
            kind = self._name_by_pid.get(pid, "?")
            kinds[kind] = kinds.get(kind, 0.0) + cpu
            kinds[kind + " (system)"] = kinds.get(kind + " (system)", 0.0) + self._sys_by_pid.get(pid, 0.0)
        return kinds

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self.sample()
        self._halt.set()


def _kind_of(proc: psutil.Process) -> str:
    """A process's kind, for a CPU breakdown: its program and the module or main class it runs."""
    try:
        cmd = proc.cmdline()
    except psutil.Error:
        return "?"
    if not cmd:
        return "?"
    program = pathlib.Path(cmd[0]).name
    if program == "java":
        # Its main class (or jar): the first argument that is not an option or an option's value.
        args = iter(cmd[1:])
        for a in args:
            if a in ("-cp", "-classpath", "--class-path"):
                next(args, None)
            elif a == "-jar":
                return f"java -jar {pathlib.Path(next(args, '?')).name}"[:80]
            elif not a.startswith("-"):
                return f"java {a}"[:80]
        return "java"
    module = next((cmd[i + 1] for i, a in enumerate(cmd[:-1]) if a == "-m"), None)
    main = next((a for a in cmd[1:] if not a.startswith("-") and ("." in a or "/" in a)), "")
    return f"{program} {module or main}"[:80]


class OutputTail(threading.Thread):
    """Reads an output topic from the start; remembers when each detection arrived."""

    def __init__(self, base: dict, topic: str):
        super().__init__(daemon=True)
        self.consumer = Consumer(clients.consumer(base, f"bench-tail-{uuid.uuid4().hex[:8]}"))
        partitions = clients.topic_partitions(self.consumer, topic, 30)
        self.consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        self.count = 0
        # When the detections arrived here: output timestamps cannot be used, since a peer may
        # copy the input record's timestamp to its output (Quix Streams does).
        self.first_ms: float | None = None
        self.last_ms: float | None = None
        self.latencies_ms: list[tuple[int, float]] = []  # (source timestamp, receive - source)
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            for m in self.consumer.consume(10_000, timeout=0.05):
                if m.error() is not None:
                    continue
                now_ms = time.time() * 1000
                self.first_ms = self.first_ms or now_ms
                self.last_ms = now_ms
                self.count += 1
                source_ts = json.loads(m.value())["source"]["timestamp_ms"]
                self.latencies_ms.append((source_ts, now_ms - source_ts))
        self.consumer.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


@dataclass
class Contender:
    name: str
    output_topic: str
    command: list[str]
    env: dict = field(default_factory=dict)


def topics_of(c: Contender) -> dict[str, int]:
    """The topics a contender writes to. The service's metrics topic too: its reports are part of
    what it costs (a missing topic made every report wait for metadata and fail)."""
    topics = {c.output_topic: PARTITIONS, f"{c.output_topic}.dlq": 1}
    if "METRICS_TOPIC" in c.env:
        topics[c.env["METRICS_TOPIC"]] = 1
    return topics


def launch(c: Contender, log_path: pathlib.Path) -> subprocess.Popen:
    env = {**os.environ, **c.env, "PYTHONUNBUFFERED": "1"}
    log = open(log_path, "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(c.command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    try:  # whatever the job left behind (JVM, workers)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_until(condition, timeout: float, proc: subprocess.Popen | None = None, what: str = "") -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the contender exited with {proc.returncode}")
        time.sleep(0.1)
    return condition()


def throughput_run(c: Contender, base: dict, out_topic: str, records: int, expected: int, logs: pathlib.Path) -> dict:
    tail = OutputTail(base, out_topic)
    tail.start()
    launched = time.time()
    proc = launch(c, logs / f"throughput-{c.name.split()[0].lower()}.log")
    sampler = TreeSampler(proc.pid)
    sampler.start()
    at_first: list[tuple[float, int]] = []  # (CPU seconds, detections) when the first detection came out
    kinds_at_first: dict[str, float] = {}

    def progress() -> bool:
        if not at_first and tail.count > 0:
            sampler.sample()
            at_first.append((sampler.cpu, tail.count))
            kinds_at_first.update(sampler.by_kind())
        return tail.count >= expected

    try:
        done = wait_until(progress, timeout=max(180, records / 2_000), proc=proc, what=c.name)
    finally:
        sampler.stop()
        stop(proc)
        tail.stop()
    span_s = ((tail.last_ms or 0) - (tail.first_ms or 0)) / 1000
    if os.environ.get("BENCH_CPU_BY_PROCESS"):
        for kind, cpu in sorted(sampler.by_kind().items(), key=lambda kv: -kv[1]):
            print(f"  {c.name.split()[0]} steady CPU {cpu - kinds_at_first.get(kind, 0.0):7.2f} s (total {cpu:7.2f}) {kind}", flush=True)
    # Steady state: the CPU spent after the first detection, per record processed after it (the
    # detections are spread evenly over the records, so their share stands for the records').
    steady = float("nan")
    if at_first and expected > at_first[0][1]:
        cpu_first, count_first = at_first[0]
        steady = (sampler.cpu - cpu_first) / (records * (expected - count_first) / expected) * 1_000_000
    return {
        "name": c.name,
        "complete": done and tail.count == expected,
        "detections": tail.count,
        "expected": expected,
        "records_per_s": records / span_s if span_s > 0 else float("nan"),
        "first_detection_s": (tail.first_ms / 1000 - launched) if tail.first_ms else float("nan"),
        "peak_memory_bytes": sampler.peak_pss,
        "peak_pss_by_process": {k: {"pss_bytes": b, "processes": n} for k, (b, n) in sorted(sampler.at_peak_by_kind.items())},
        "peak_rss_sum_bytes": sampler.peak_rss,
        "cpu_seconds_per_million": sampler.cpu / records * 1_000_000,
        "steady_cpu_seconds_per_million": steady,
    }


def machine() -> dict:
    import pyspark

    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def broker_for(engine: str):
    """(the broker started for the run, or None; its bootstrap servers; how the results name it):
    KAFKA_BOOTSTRAP_SERVERS if set, else a broker of `engine` started here."""
    from detectorkit.devtools.brokers import start_broker

    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if bootstrap:
        return None, bootstrap, "KAFKA_BOOTSTRAP_SERVERS"
    broker = start_broker(engine)
    return broker, broker.bootstrap_servers, {"kafka": "Apache Kafka", "tansu": "embedded Tansu"}[engine]


def machine_line(result: dict) -> str:
    """The results' line on the machine, its software and the broker."""
    m = result["machine"]
    return (
        f"Machine: {m['cpus']} CPUs, {m['memory_bytes'] / 2**30:.0f} GiB, {m['platform']}, Python {m['python']}, "
        f"PySpark {m['pyspark']}; broker: {result['broker']}."
    )


def ratio(value: float, peer: float) -> float:
    return value / peer if peer and peer == peer else float("nan")
