"""The benchmark: the generated detector service next to what a user could pick instead, on the same
broker in the same run.

    python bench/run.py                      # 1,000,000 records, 60 s of latency at 1,000 records/s
    python bench/run.py --records 20000 --latency-seconds 5     # the smoke run CI does

Contenders: (1) the detector service generated from the template, (2) a plain confluent-kafka loop
with the same pandas detector (the ceiling for Python here), (3) a Quix Streams application doing
the same detection, (4) the raw broker (produce and consume, no processing). Every figure is printed
with its ratio to (2), and written to bench/results/latest.{json,md}. Runs on the embedded broker
unless KAFKA_BOOTSTRAP_SERVERS is set.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field

import psutil
from confluent_kafka import Consumer, Producer, TopicPartition

from detectorkit.devtools.embedded_broker import EmbeddedBroker
from detectorkit.kafka import clients

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
WORK = HERE / ".work"
SERVICE = "high-value-orders"
PACKAGE = SERVICE.replace("-", "_")
THRESHOLD = 1000.0
PARTITIONS = 8


# ---- set-up --------------------------------------------------------------------------------------


def ensure_service() -> str:
    """Bake the template's default service and install it beside detectorkit; returns its command."""
    target = WORK / SERVICE
    if not (target / "pyproject.toml").exists():
        WORK.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "cookiecutter", str(REPO), "--no-input", "-f", "-o", str(WORK)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", str(target)], check=True)
    return str(pathlib.Path(sys.executable).parent / SERVICE)


def ensure_quix() -> str:
    """Quix Streams in a virtualenv of its own: it pins an older confluent-kafka than the project's."""
    venv = HERE / ".venv-quix"
    python = venv / "bin" / "python"
    if not python.exists() or subprocess.run([str(python), "-c", "import quixstreams"], capture_output=True).returncode:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "quixstreams==3.28.1"], check=True)
    return str(python)


def sample_values(count: int, seed: int = 42) -> list[tuple[bytes, bytes, bool]]:
    """About 100-byte JSON records; 5% have an amount above the threshold."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        high = rng.random() < 0.05
        amount = round(rng.uniform(1000.01, 5000), 2) if high else round(rng.uniform(0, 1000), 2)
        key = f"c{rng.randrange(100_000):05d}".encode()
        value = json.dumps({"id": i, "customer": key.decode(), "amount": amount, "currency": "EUR", "channel": "web",
                            "country": "DE"}).encode()
        out.append((key, value, high))
    return out


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
        self.cpu = 0.0
        self._cpu_by_pid: dict[int, float] = {}
        self._halt = threading.Event()

    def sample(self) -> None:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        rss = pss = 0
        for proc in procs:
            try:
                info = proc.memory_full_info() if hasattr(psutil.Process, "memory_full_info") else proc.memory_info()
                rss += info.rss
                pss += getattr(info, "pss", info.rss)
                t = proc.cpu_times()
                # Remember each process's own CPU: an exited worker's seconds still count.
                self._cpu_by_pid[proc.pid] = max(self._cpu_by_pid.get(proc.pid, 0.0), t.user + t.system)
            except psutil.Error:
                continue
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_pss = max(self.peak_pss, pss)
        self.cpu = sum(self._cpu_by_pid.values())

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self.sample()
        self._halt.set()


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


def contenders(service_cmd: str, quix_python: str, bootstrap: str, in_topic: str, prefix: str) -> list[Contender]:
    """The three processing contenders, each with an output topic and a consumer group of its own."""

    def names(slug: str) -> tuple[str, str]:
        return f"{prefix}.{slug}.out", f"{prefix}-{slug}"

    out, group = names("service")
    service_env = {"KAFKA_BOOTSTRAP_SERVERS": bootstrap, "INPUT_TOPIC": in_topic, "OUTPUT_TOPIC": out,
                   "DLQ_TOPIC": f"{out}.dlq", "CONSUMER_GROUP": group, "STARTING_OFFSETS": "earliest",
                   "METRICS_TOPIC": f"{prefix}.metrics", "LOG_LEVEL": "WARNING"}
    service = Contender("detector service (this project)", out, [service_cmd], service_env)
    out, group = names("plain")
    plain = Contender("plain confluent-kafka loop", out, [sys.executable, str(HERE / "contenders" / "plain_loop.py"), bootstrap,
                                                          in_topic, out, group, f"{PACKAGE}.detector:DETECTOR"])
    out, group = names("quix")
    quix = Contender("Quix Streams", out, [quix_python, str(HERE / "contenders" / "quix_app.py"), bootstrap, in_topic, out, group,
                                           str(THRESHOLD)])
    return [service, plain, quix]


def selected(all_contenders: list[Contender], only: list[str] | None) -> list[Contender]:
    return [c for c in all_contenders if not only or any(c.name.lower().startswith(w.lower()) for w in only)]


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


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


# ---- the runs ------------------------------------------------------------------------------------


def produce(base: dict, topic: str, records: list[tuple[bytes, bytes, bool]]) -> float:
    producer = Producer(clients.producer(base))
    started = time.perf_counter()
    for key, value, _ in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(120)
    return len(records) / (time.perf_counter() - started)


def raw_consume(base: dict, topic: str, expected: int) -> tuple[float, int]:
    consumer = Consumer(clients.consumer(base, f"bench-raw-{uuid.uuid4().hex[:8]}"))
    consumer.assign([TopicPartition(topic, p, 0) for p in clients.topic_partitions(consumer, topic, 30)])
    seen, first, last = 0, None, None
    deadline = time.monotonic() + 300
    while seen < expected and time.monotonic() < deadline:
        batch = [m for m in consumer.consume(10_000, timeout=0.5) if m.error() is None]
        if batch:
            first = first or time.perf_counter()
            last = time.perf_counter()
            seen += len(batch)
    consumer.close()
    return (seen / (last - first) if first and last and last > first else float("nan")), seen


def throughput_run(c: Contender, base: dict, out_topic: str, records: int, expected: int, logs: pathlib.Path) -> dict:
    tail = OutputTail(base, out_topic)
    tail.start()
    launched = time.time()
    proc = launch(c, logs / f"throughput-{c.name.split()[0].lower()}.log")
    sampler = TreeSampler(proc.pid)
    sampler.start()
    try:
        done = wait_until(lambda: tail.count >= expected, timeout=max(180, records / 2_000), proc=proc, what=c.name)
    finally:
        sampler.stop()
        stop(proc)
        tail.stop()
    span_s = ((tail.last_ms or 0) - (tail.first_ms or 0)) / 1000
    return {
        "name": c.name,
        "complete": done and tail.count == expected,
        "detections": tail.count,
        "expected": expected,
        "records_per_s": records / span_s if span_s > 0 else float("nan"),
        "first_detection_s": (tail.first_ms / 1000 - launched) if tail.first_ms else float("nan"),
        "peak_memory_bytes": sampler.peak_pss,
        "peak_rss_sum_bytes": sampler.peak_rss,
        "cpu_seconds_per_million": sampler.cpu / records * 1_000_000,
    }


def paced(producer: Producer, topic: str, records: list[tuple[bytes, bytes, bool]], rate: int) -> None:
    step = 0.01  # produce in 10 ms slices: smooth enough at 1,000 records/s
    per_step = max(1, int(rate * step))
    started = time.perf_counter()
    for i in range(0, len(records), per_step):
        for key, value, _ in records[i:i + per_step]:
            producer.produce(topic, key=key, value=value)
        producer.poll(0)
        delay = started + (i // per_step + 1) * step - time.perf_counter()
        if delay > 0:
            time.sleep(delay)  # pacing the producer, not waiting for a result
    producer.flush(30)


def latency_run(c: Contender, base: dict, in_topic: str, out_topic: str, rate: int, seconds: float, logs: pathlib.Path,
                warmup: float) -> dict:
    tail = OutputTail(base, out_topic)
    tail.start()
    proc = launch(c, logs / f"latency-{c.name.split()[0].lower()}.log")
    producer = Producer(clients.producer(base, **{"linger.ms": 1}))
    warm = [(b"warm", json.dumps({"id": -1, "customer": "warm", "amount": 5000.0, "currency": "EUR"}).encode(), True)]
    try:
        # Ready means a detection came out; warm-up records trickle in until then.
        ready = wait_until(lambda: (producer.produce(in_topic, key=warm[0][0], value=warm[0][1]), producer.flush(5))
                           and tail.count > 0, timeout=240, proc=proc, what=c.name)
        if not ready:
            raise RuntimeError(f"{c.name} produced no detection within 240 s")
        # Latency is a steady-state figure (start-up is reported as time to first detection): the
        # same paced stream runs for a warm-up first, unmeasured, for every contender alike.
        paced(producer, in_topic, sample_values(int(rate * warmup), seed=6), rate)
        phase_start_ms = time.time() * 1000
        records = sample_values(int(rate * seconds), seed=7)
        paced(producer, in_topic, records, rate)
        expected = sum(1 for *_, high in records if high)
        measured = lambda: [lat for ts, lat in tail.latencies_ms if ts >= phase_start_ms]  # noqa: E731
        wait_until(lambda: len(measured()) >= expected, timeout=120, proc=proc, what=c.name)
        values = measured()
    finally:
        stop(proc)
        tail.stop()
    return {
        "name": c.name, "received": len(values), "expected": expected,
        "p50_ms": percentile(values, 0.5), "p99_ms": percentile(values, 0.99), "max_ms": max(values) if values else float("nan"),
    }


def machine() -> dict:
    import pyspark

    return {
        "platform": platform.platform(), "cpus": os.cpu_count(), "memory_bytes": psutil.virtual_memory().total,
        "processor": platform.processor() or platform.machine(), "python": platform.python_version(),
        "pyspark": pyspark.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def ratio(value: float, peer: float) -> float:
    return value / peer if peer and peer == peer else float("nan")


def markdown(result: dict) -> str:
    p = result["params"]
    lines = [f"# Benchmark results ({result['machine']['date']})", "",
             f"Machine: {result['machine']['cpus']} CPUs, {result['machine']['memory_bytes'] / 2**30:.0f} GiB, "
             f"{result['machine']['platform']}, Python {result['machine']['python']}, PySpark {result['machine']['pyspark']}; "
             f"broker: {result['broker']}.", "",
             f"## Throughput: {p['records']:,} records of ~{p['record_bytes']} bytes, {PARTITIONS} partitions, ~5% detections", "",
             "| contender | records/s | × plain loop | peak memory (PSS) | peak RSS sum | CPU s per 1M records | first detection after launch "
             "| complete |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["throughput"]:
        lines.append(f"| {r['name']} | {r['records_per_s']:,.0f} | {r['ratio_to_plain']:.2f} | "
                     f"{r.get('peak_memory_bytes', 0) / 2**20:,.0f} MiB | {r.get('peak_rss_sum_bytes', 0) / 2**20:,.0f} MiB | "
                     f"{r.get('cpu_seconds_per_million', float('nan')):.1f} | "
                     f"{r.get('first_detection_s', float('nan')):.1f} s | {'yes' if r['complete'] else 'NO'} |")
    lines += ["", f"## Latency: {p['rate']:,} records/s for {p['latency_seconds']:g} s after {p['warmup_seconds']:g} s of warm-up, "
              "producer timestamp to detection received", "",
              "| contender | p50 ms | p99 ms | max ms | p50 × plain loop | p99 × plain loop | detections |", "|---|---:|---:|---:|---:|---:|---|"]
    for r in result["latency"]:
        lines.append(f"| {r['name']} | {r['p50_ms']:,.0f} | {r['p99_ms']:,.0f} | {r['max_ms']:,.0f} | {r['p50_ratio_to_plain']:.2f} | "
                     f"{r['p99_ratio_to_plain']:.2f} | {r['received']}/{r['expected']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=1_000, help="records per second in the latency run")
    parser.add_argument("--latency-seconds", type=float, default=60.0)
    parser.add_argument("--warmup-seconds", type=float, default=10.0, help="unmeasured paced traffic before each latency run")
    parser.add_argument("--out", type=pathlib.Path, default=HERE / "results", help="where latest.json and latest.md go")
    parser.add_argument("--only", nargs="*", default=None, help="run only contenders whose name starts with these words")
    args = parser.parse_args(argv)

    service_cmd, quix_python = ensure_service(), ensure_quix()
    broker = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        broker = EmbeddedBroker().start()
        bootstrap = broker.bootstrap_servers
    logs = pathlib.Path(tempfile.mkdtemp(prefix="bench-logs-"))
    print(f"broker {bootstrap} ({'embedded Tansu' if broker else 'KAFKA_BOOTSTRAP_SERVERS'}); contender logs in {logs}", flush=True)
    base = clients.base(bootstrap)
    run_id = uuid.uuid4().hex[:6]
    try:
        values = sample_values(args.records)
        expected = sum(1 for *_, high in values if high)
        in_topic = f"bench.in.{run_id}"
        clients.create_topics(base, {in_topic: PARTITIONS})
        produce_rate = produce(base, in_topic, values)
        consume_rate, consumed = raw_consume(base, in_topic, args.records)
        print(f"raw broker: produce {produce_rate:,.0f} records/s, consume {consume_rate:,.0f} records/s", flush=True)

        throughput, latency = [], []
        for c in selected(contenders(service_cmd, quix_python, bootstrap, in_topic, f"bench.{run_id}.t"), args.only):
            clients.create_topics(base, {c.output_topic: PARTITIONS, f"{c.output_topic}.dlq": 1})
            r = throughput_run(c, base, c.output_topic, args.records, expected, logs)
            print(f"throughput {c.name}: {r['records_per_s']:,.0f} records/s, {r['detections']}/{r['expected']} detections", flush=True)
            throughput.append(r)
        for n, c in enumerate(selected(contenders(service_cmd, quix_python, bootstrap, "", ""), args.only)):
            # Each latency run gets fresh topics: a new input, so no backlog from another contender.
            in_t = f"bench.{run_id}.l{n}.in"
            c = next(x for x in contenders(service_cmd, quix_python, bootstrap, in_t, f"bench.{run_id}.l{n}") if x.name == c.name)
            clients.create_topics(base, {in_t: PARTITIONS, c.output_topic: PARTITIONS, f"{c.output_topic}.dlq": 1})
            r = latency_run(c, base, in_t, c.output_topic, args.rate, args.latency_seconds, logs, args.warmup_seconds)
            print(f"latency {c.name}: p50 {r['p50_ms']:,.0f} ms, p99 {r['p99_ms']:,.0f} ms ({r['received']}/{r['expected']})", flush=True)
            latency.append(r)
    finally:
        if broker is not None:
            broker.stop()

    throughput.append({"name": "raw broker (produce / consume, no processing)", "complete": consumed == args.records,
                       "records_per_s": consume_rate,
                       "produce_records_per_s": produce_rate, "detections": None, "expected": None})
    plain_t = next((r["records_per_s"] for r in throughput if r["name"].startswith("plain")), float("nan"))
    for r in throughput:
        r["ratio_to_plain"] = ratio(r["records_per_s"], plain_t)
    plain_l = next((r for r in latency if r["name"].startswith("plain")), None)
    for r in latency:
        r["p50_ratio_to_plain"] = ratio(r["p50_ms"], plain_l["p50_ms"] if plain_l else float("nan"))
        r["p99_ratio_to_plain"] = ratio(r["p99_ms"], plain_l["p99_ms"] if plain_l else float("nan"))
    result = {
        "machine": machine(), "broker": "embedded Tansu" if broker else "KAFKA_BOOTSTRAP_SERVERS",
        "params": {"records": args.records, "record_bytes": round(statistics.mean(len(v) for _, v, _ in values[:1000])),
                   "rate": args.rate, "latency_seconds": args.latency_seconds, "warmup_seconds": args.warmup_seconds,
                   "partitions": PARTITIONS},
        "throughput": throughput, "latency": latency,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latest.json").write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(result)
    (args.out / "latest.md").write_text(table)
    print()
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
