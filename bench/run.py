"""The benchmark: the generated detector service next to what a user could pick instead, on the same
broker in the same run.

    python bench/run.py                      # 1,000,000 records, 60 s of latency at 1,000 records/s
    python bench/run.py --records 20000 --latency-seconds 5     # the smoke run CI does
    python bench/run.py --stateful           # the stateful burst detector beside Kafka Streams (bench/stateful.py)

Contenders: (1) the detector service generated from the template, (2) a plain confluent-kafka loop
with the same pandas detector (the ceiling for Python here), in one process and in as many as the
service has cores, (3) a Quix Streams application doing the same detection, (4) Spark Structured
Streaming with Spark's own Kafka connector, (5) Kafka Streams, the talk's choice (a Java application
built with Maven), (6) the raw broker (produce and consume, no processing). Every figure is printed
with its ratio to (2), and written to bench/results/latest.{json,md}. Runs on Apache Kafka started
for the run (--engine tansu: the embedded broker; KAFKA_BOOTSTRAP_SERVERS: a running broker).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import stateful
from common import (
    CORES,
    HERE,
    PACKAGE,
    PARTITIONS,
    THRESHOLD,
    Contender,
    OutputTail,
    TreeSampler,
    broker_for,
    ensure_kafka_streams,
    ensure_service,
    launch,
    machine,
    machine_line,
    ratio,
    stop,
    throughput_run,
    topics_of,
    wait_until,
)
from confluent_kafka import Consumer, Producer, TopicPartition
from density import density_run

from detectorkit.devtools.brokers import ENGINES
from detectorkit.kafka import clients

COPIES = str(HERE / "contenders" / "copies.py")

# ---- set-up --------------------------------------------------------------------------------------


def ensure_quix() -> str:
    """Quix Streams in a virtualenv of its own: it pins an older confluent-kafka than the project's."""
    venv = HERE / ".venv-quix"
    python = venv / "bin" / "python"
    if not python.exists() or subprocess.run([str(python), "-c", "import quixstreams"], capture_output=True).returncode:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "quixstreams==3.28.1"], check=True)
    return str(python)


def ensure_spark_kafka_jars() -> str:
    """Spark's Kafka connector and what it needs beyond the pyspark wheel's own jars, fetched with
    Maven from Maven Central (bench/contenders/spark-kafka/pom.xml); a comma-separated spark.jars."""
    import pyspark

    project = HERE / "contenders" / "spark-kafka"
    jars = project / "target" / "jars"
    if not jars.is_dir() or (project / "pom.xml").stat().st_mtime > jars.stat().st_mtime:
        subprocess.run(["mvn", "-q", "-B", "-f", str(project / "pom.xml"), "dependency:copy-dependencies"], check=True)
        jars.touch()

    def artifact(path: pathlib.Path) -> str:
        return re.sub(r"-\d[\w.]*\.jar$", "", path.name)

    provided = {artifact(j) for j in (pathlib.Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return ",".join(str(j) for j in sorted(jars.glob("*.jar")) if artifact(j) not in provided)


def sample_values(count: int, seed: int = 42) -> list[tuple[bytes, bytes, bool]]:
    """About 100-byte JSON records; 5% have an amount above the threshold."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        high = rng.random() < 0.05
        amount = round(rng.uniform(1000.01, 5000), 2) if high else round(rng.uniform(0, 1000), 2)
        key = f"c{rng.randrange(100_000):05d}".encode()
        value = json.dumps({"id": i, "customer": key.decode(), "amount": amount, "currency": "EUR", "channel": "web", "country": "DE"}).encode()
        out.append((key, value, high))
    return out


# ---- measuring -----------------------------------------------------------------------------------


EXACTLY_ONCE_SERVICE = "detector service, exactly-once (this project)"


def contenders(service_cmd: str, quix_python: str, bootstrap: str, in_topic: str, prefix: str) -> list[Contender]:
    """The processing contenders, each with an output topic and a consumer group of its own."""

    def names(slug: str) -> tuple[str, str]:
        return f"{prefix}.{slug}.out", f"{prefix}-{slug}"

    out, group = names("service")
    service_env = {
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "INPUT_TOPIC": in_topic,
        "OUTPUT_TOPIC": out,
        "DLQ_TOPIC": f"{out}.dlq",
        "CONSUMER_GROUP": group,
        "STARTING_OFFSETS": "earliest",
        "METRICS_TOPIC": f"{prefix}.metrics",
        "LOG_LEVEL": "WARNING",
        # Beside Kafka Streams' default; the exactly-once contender says so (the runtime's default on Apache Kafka).
        "PROCESSING_GUARANTEE": "at-least-once",
    }
    service = Contender("detector service (this project)", out, [service_cmd], service_env)
    out, group = names("plain")
    plain = Contender(
        "plain confluent-kafka loop",
        out,
        [sys.executable, str(HERE / "contenders" / "plain_loop.py"), bootstrap, in_topic, out, group, f"{PACKAGE}.detector:DETECTOR"],
    )
    out, group = names("plain-processes")
    processes = Contender(
        f"multi-process plain loop ({CORES} processes, one group)",
        out,
        [
            sys.executable,
            COPIES,
            str(CORES),
            sys.executable,
            str(HERE / "contenders" / "plain_loop.py"),
            bootstrap,
            in_topic,
            out,
            group,
            f"{PACKAGE}.detector:DETECTOR",
        ],
    )
    # Scale on this machine: as many instances of one core as the single instance has cores, one
    # group, so both spend the same cores.
    out, group = names("service-instances")
    instances_env = {**service_env, "OUTPUT_TOPIC": out, "DLQ_TOPIC": f"{out}.dlq", "CONSUMER_GROUP": group, "SPARK_MASTER": "local[1]"}
    instances = Contender(
        f"detector service, {CORES} instances of 1 core (one group)", out, [sys.executable, COPIES, str(CORES), service_cmd], instances_env
    )
    out, group = names("quix")
    quix = Contender("Quix Streams", out, [quix_python, str(HERE / "contenders" / "quix_app.py"), bootstrap, in_topic, out, group, str(THRESHOLD)])
    out, group = names("spark-kafka")
    spark_kafka = Contender(
        "Spark's Kafka connector (spark-sql-kafka, mapInArrow, foreachBatch commits)",
        out,
        [
            sys.executable,
            str(HERE / "contenders" / "spark_kafka.py"),
            bootstrap,
            in_topic,
            out,
            group,
            f"{PACKAGE}.detector:DETECTOR",
            str(CORES),
            ensure_spark_kafka_jars(),
        ],
    )
    out, group = names("kafka-streams")
    streams = Contender(
        "Kafka Streams (the talk's choice)", out, [*ensure_kafka_streams(), bootstrap, in_topic, out, group, str(THRESHOLD), str(CORES)]
    )
    # Exactly-once, each beside its at-least-once self: the service's transaction per partition per
    # batch, Kafka Streams' exactly_once_v2 (a transaction per commit, every 100 ms by default).
    out, group = names("service-eos")
    eos_env = {**service_env, "OUTPUT_TOPIC": out, "DLQ_TOPIC": f"{out}.dlq", "CONSUMER_GROUP": group, "PROCESSING_GUARANTEE": "exactly-once"}
    service_eos = Contender(EXACTLY_ONCE_SERVICE, out, [service_cmd], eos_env)
    out, group = names("kafka-streams-eos")
    streams_args = [bootstrap, in_topic, out, group, str(THRESHOLD), str(CORES), "exactly_once_v2"]
    streams_eos = Contender("Kafka Streams, exactly_once_v2", out, [*ensure_kafka_streams(), *streams_args])
    return [service, service_eos, instances, plain, processes, quix, spark_kafka, streams, streams_eos]


def selected(all_contenders: list[Contender], only: list[str] | None) -> list[Contender]:
    return [c for c in all_contenders if not only or any(c.name.lower().startswith(w.lower()) for w in only)]


def runnable(all_contenders: list[Contender], engine: str | None) -> list[Contender]:
    """Spark's Kafka connector plans up to ListOffsets(latest), which the embedded broker answers
    wrong (one record per partition was all it read there): it runs on Apache Kafka only."""
    if engine != "tansu":
        return all_contenders
    # Exactly-once is refused on the embedded broker (its read_committed shows aborted records).
    return [c for c in all_contenders if not c.name.startswith("Spark's") and c.name != EXACTLY_ONCE_SERVICE and "exactly_once" not in c.name]


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


def paced(producer: Producer, topic: str, records: list[tuple[bytes, bytes, bool]], rate: int) -> None:
    step = 0.01  # produce in 10 ms slices: smooth enough at 1,000 records/s
    per_step = max(1, int(rate * step))
    started = time.perf_counter()
    for i in range(0, len(records), per_step):
        for key, value, _ in records[i : i + per_step]:
            producer.produce(topic, key=key, value=value)
        producer.poll(0)
        delay = started + (i // per_step + 1) * step - time.perf_counter()
        if delay > 0:
            time.sleep(delay)  # pacing the producer, not waiting for a result
    producer.flush(30)


# A record every contender detects: trickled in until a contender's first detection comes out.
WARM = (b"warm", json.dumps({"id": -1, "customer": "warm", "amount": 5000.0, "currency": "EUR"}).encode())


def await_first_detection(producer: Producer, in_topic: str, tail: OutputTail, proc: subprocess.Popen, what: str, timeout: float = 240) -> None:
    """Ready means a detection came out; warm-up records trickle in until then."""
    ready = wait_until(
        lambda: (producer.produce(in_topic, key=WARM[0], value=WARM[1]), producer.flush(5)) and tail.count > 0,
        timeout=timeout,
        proc=proc,
        what=what,
    )
    if not ready:
        raise RuntimeError(f"{what} produced no detection within {timeout:g} s")


def latency_run(c: Contender, base: dict, in_topic: str, out_topic: str, rate: int, seconds: float, logs: pathlib.Path, warmup: float) -> dict:
    tail = OutputTail(base, out_topic)
    tail.start()
    proc = launch(c, logs / f"latency-{c.name.split()[0].lower()}.log")
    producer = Producer(clients.producer(base, **{"linger.ms": 1}))
    try:
        await_first_detection(producer, in_topic, tail, proc, c.name)
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
        "name": c.name,
        "rate": rate,
        "received": len(values),
        "expected": expected,
        "latencies_ms": sorted(values),
        "p50_ms": percentile(values, 0.5),
        "p99_ms": percentile(values, 0.99),
        "max_ms": max(values) if values else float("nan"),
    }


def by_process_table(contenders: list[tuple[str, dict]]) -> list[str]:
    """A table of each contender's PSS per kind of process (bench.common.TreeSampler's)."""
    lines = ["| contender | process | processes | PSS |", "|---|---|---:|---:|"]
    for name, by_process in contenders:
        for kind, p in by_process.items():
            if p["pss_bytes"] >= 2**20:  # not a process that was ending (its command line already gone)
                lines.append(f"| {name} | `{kind}` | {p['processes']} | {p['pss_bytes'] / 2**20:,.0f} MiB |")
    return lines


def markdown(result: dict, charts: list[str] = ()) -> str:
    p = result["params"]
    lines = [
        f"# Benchmark results ({result['machine']['date']})",
        "",
        f"{machine_line(result)} The service and the peers that can use several cores get {p['cores']}.",
        "",
        f"## Throughput: {p['records']:,} records of ~{p['record_bytes']} bytes, {PARTITIONS} partitions, ~5% detections",
        "",
        "| contender | records/s | × plain loop | × multi-process loop | peak memory (PSS) | peak RSS sum | CPU s per 1M records "
        "(steady) | CPU s per 1M records (total) | first detection after launch | complete |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in result["throughput"]:
        lines.append(
            f"| {r['name']} | {r['records_per_s']:,.0f} | {r['ratio_to_plain']:.2f} | {r['ratio_to_processes']:.2f} | "
            f"{r.get('peak_memory_bytes', 0) / 2**20:,.0f} MiB | {r.get('peak_rss_sum_bytes', 0) / 2**20:,.0f} MiB | "
            f"{r.get('steady_cpu_seconds_per_million', float('nan')):.1f} | {r.get('cpu_seconds_per_million', float('nan')):.1f} | "
            f"{r.get('first_detection_s', float('nan')):.1f} s | {'yes' if r['complete'] else 'NO'} |"
        )
    lines += [
        "",
        f"## Latency: each rate for {p['latency_seconds']:g} s after {p['warmup_seconds']:g} s of warm-up, producer timestamp to detection received",
        "",
        "| rate | contender | p50 ms | p99 ms | max ms | p50 × plain loop | p99 × plain loop | detections |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in result["latency"]:
        lines.append(
            f"| {r['rate']:,}/s | {r['name']} | {r['p50_ms']:,.0f} | {r['p99_ms']:,.0f} | {r['max_ms']:,.0f} | "
            f"{r['p50_ratio_to_plain']:.2f} | {r['p99_ratio_to_plain']:.2f} | {r['received']}/{r['expected']} |"
        )
    at_peak = [r for r in result["throughput"] if r.get("peak_pss_by_process") and r["name"] in (SERVICE_NAME, STREAMS)]
    if at_peak:
        lines += ["", "Where the peak PSS was, per kind of process, at the sample where the whole tree's was highest:", ""]
        lines += by_process_table([(r["name"], r["peak_pss_by_process"]) for r in at_peak])
    if result.get("density"):
        lines += [
            "",
            f"## Idle density: {result['density'][0]['instances']} instances of each side by side, idle, each its own group on one input topic",
            "",
            "| contender | PSS per idle instance | CPU per idle instance | instances that fit in this machine's memory |",
            "|---|---:|---:|---:|",
        ]
        for d in result["density"]:
            lines.append(
                f"| {d['name']} | {d['idle_pss_bytes'] / 2**20:,.0f} MiB | {d['idle_cpu_cores'] * 100:.1f}% of a core | {d['fit_in_memory']:,} |"
            )
        lines += ["", "Where the first idle instance's memory is, per kind of process (mean PSS over the samples):", ""]
        lines += by_process_table([(d["name"], d.get("idle_pss_by_process", {})) for d in result["density"]])
    lines += ["", "## Targets (the detector service, ratios within this run)", "", "| target | measured | met |", "|---|---:|---|"]
    for t in result["targets"]:
        lines.append(f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else 'NO'} |")
    if charts:
        lines += ["", "## Charts", "", *(f"![{name}]({name})" for name in charts)]
    return "\n".join(lines) + "\n"


def targets(result: dict) -> list[dict]:
    """The issue's targets for the detector service, each judged on this run's figures."""
    # The first of each kind: "detector" is the single instance, not the two of the scale line.
    by: dict[str, dict] = {}
    for r in result["throughput"]:
        by.setdefault(r["name"].split()[0], r)
    service, plain = by.get("detector"), by.get("plain")
    low_rate = min(result["params"]["rates"])
    lat: dict[str, dict] = {}
    for r in result["latency"]:
        if r["rate"] == low_rate:
            lat.setdefault(r["name"].split()[0], r)

    def check(target: str, value: float, limit: float, at_most: bool, unit: str = "×") -> dict:
        met = value == value and (value <= limit if at_most else value >= limit)
        return {"target": target, "measured": f"{value:.2f}{unit}" if unit == "×" else f"{value:,.0f} {unit}", "met": bool(met)}

    out = exactly_once_targets(result, check) + kafka_streams_targets(result, check)
    if not service or not plain or service["name"] == EXACTLY_ONCE_SERVICE:
        return out
    out += [
        check(
            "CPU per record in steady state ≤ 1.5× the plain loop's",
            ratio(service["steady_cpu_seconds_per_million"], plain["steady_cpu_seconds_per_million"]),
            1.5,
            True,
        )
    ]
    if "Spark's" in by:
        out.append(check("throughput ≥ the Spark-connector job's", ratio(service["records_per_s"], by["Spark's"]["records_per_s"]), 1.0, False))
    out.append(check("throughput ≥ 0.8× the multi-process loop's", service["ratio_to_processes"], 0.8, False))
    if "detector" in lat and "plain" in lat:
        out.append(check(f"p99 latency at {low_rate:,} records/s ≤ 2× the plain loop's", lat["detector"]["p99_ratio_to_plain"], 2.0, True))
    out.append(check("peak PSS under 1 GiB", service["peak_memory_bytes"] / 2**20, 1024, True, unit="MiB"))
    out.append(check("first detection ≤ 2.5× the plain loop's time", ratio(service["first_detection_s"], plain["first_detection_s"]), 2.5, True))
    return out


STREAMS = "Kafka Streams (the talk's choice)"
SERVICE_NAME = "detector service (this project)"


def kafka_streams_targets(result: dict, check) -> list[dict]:
    """Issue #54's, against Kafka Streams in the same run: latency at most theirs at each rate,
    throughput at least 1.5x theirs, peak PSS within 1.3x theirs, launch to first detection within
    2x theirs, an idle instance within 2.5x theirs."""
    named = {r["name"]: r for r in result["throughput"]}
    mine, theirs = named.get(SERVICE_NAME), named.get(STREAMS)
    if not mine or not theirs:
        return []
    out = []
    for rate in result["params"]["rates"]:
        at = {r["name"]: r for r in result["latency"] if r["rate"] == rate}
        if SERVICE_NAME in at and STREAMS in at:
            for q in ("p50", "p99"):
                value = ratio(at[SERVICE_NAME][f"{q}_ms"], at[STREAMS][f"{q}_ms"])
                out.append(check(f"{q} latency at {rate:,} records/s ≤ Kafka Streams'", value, 1.0, True))
    out.append(check("throughput ≥ 1.5× Kafka Streams'", ratio(mine["records_per_s"], theirs["records_per_s"]), 1.5, False))
    out.append(check("peak PSS ≤ 1.3× Kafka Streams'", ratio(mine["peak_memory_bytes"], theirs["peak_memory_bytes"]), 1.3, True))
    out.append(check("first detection ≤ 2× Kafka Streams' time", ratio(mine["first_detection_s"], theirs["first_detection_s"]), 2.0, True))
    idle = {d["name"]: d for d in result.get("density", [])}
    if SERVICE_NAME in idle and STREAMS in idle:
        mine_idle, theirs_idle = idle[SERVICE_NAME], idle[STREAMS]
        out.append(check("idle PSS ≤ 2.5× Kafka Streams'", ratio(mine_idle["idle_pss_bytes"], theirs_idle["idle_pss_bytes"]), 2.5, True))
        measured = f"{mine_idle['fit_in_memory']} against {theirs_idle['fit_in_memory']} Kafka Streams applications"
        out.append({"target": f"idle services that fit in {mine_idle['memory_bytes'] / 2**30:.0f} GiB (reported)", "measured": measured, "met": True})
    return out


def exactly_once_targets(result: dict, check) -> list[dict]:
    """Issue #20's: exactly-once at most 10% below the service's own at-least-once throughput and
    ahead of Kafka Streams' exactly_once_v2 (CPU reported); issue #54's: its latency at most
    exactly_once_v2's at each rate."""
    named = {r["name"]: r for r in result["throughput"]}
    eos, alo = named.get(EXACTLY_ONCE_SERVICE), named.get("detector service (this project)")
    streams_eos = named.get("Kafka Streams, exactly_once_v2")
    if not eos:
        return []
    out = []
    if alo:
        out.append(check("exactly-once throughput ≥ 0.9× at-least-once's", ratio(eos["records_per_s"], alo["records_per_s"]), 0.9, False))
        cpu = ratio(eos["steady_cpu_seconds_per_million"], alo["steady_cpu_seconds_per_million"])
        out.append({"target": "exactly-once CPU per record / at-least-once's (reported)", "measured": f"{cpu:.2f}×", "met": True})
    if streams_eos:
        ahead = ratio(eos["records_per_s"], streams_eos["records_per_s"])
        out.append(check("exactly-once throughput ≥ Kafka Streams exactly_once_v2's", ahead, 1.0, False))
        cpu = ratio(eos["steady_cpu_seconds_per_million"], streams_eos["steady_cpu_seconds_per_million"])
        out.append({"target": "exactly-once CPU per record / Kafka Streams exactly_once_v2's (reported)", "measured": f"{cpu:.2f}×", "met": True})
    for rate in result["params"]["rates"]:
        at = {r["name"]: r for r in result["latency"] if r["rate"] == rate}
        if EXACTLY_ONCE_SERVICE in at and "Kafka Streams, exactly_once_v2" in at:
            mine, theirs = at[EXACTLY_ONCE_SERVICE], at["Kafka Streams, exactly_once_v2"]
            for q in ("p50", "p99"):
                value = ratio(mine[f"{q}_ms"], theirs[f"{q}_ms"])
                out.append(check(f"exactly-once {q} latency at {rate:,} records/s ≤ Kafka Streams exactly_once_v2's", value, 1.0, True))
    return out


def draw_charts(result: dict, out: pathlib.Path) -> list[str]:
    """PNG charts next to the results: the latency distribution per contender and rate, and
    throughput and CPU per record per contender. None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    names = []
    rates = sorted({r["rate"] for r in result["latency"]})
    if rates:  # a throughput-only run has no latency to draw
        fig, axes = plt.subplots(1, len(rates), figsize=(6 * len(rates), 4.5), squeeze=False)
        for ax, rate in zip(axes[0], rates, strict=True):
            runs = [r for r in result["latency"] if r["rate"] == rate and r.get("latencies_ms")]
            ax.boxplot([r["latencies_ms"] for r in runs], whis=(1, 99), showfliers=False)
            ax.set_xticks(range(1, len(runs) + 1), [r["name"].split(" (")[0] for r in runs], rotation=30, ha="right", fontsize=8)
            ax.set_yscale("log")
            ax.set_ylabel("ms, producer to detection (1st-99th percentile)")
            ax.set_title(f"latency at {rate:,} records/s")
        fig.tight_layout()
        fig.savefig(out / "latency.png", dpi=110)
        plt.close(fig)
        names.append("latency.png")
    runs = [r for r in result["throughput"] if r.get("detections") is not None]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [r["name"].split(" (")[0] for r in runs]
    left.bar(labels, [r["records_per_s"] for r in runs])
    left.set_ylabel("records/s")
    left.set_title("throughput")
    right.bar(labels, [r.get("steady_cpu_seconds_per_million", float("nan")) for r in runs])
    right.set_ylabel("CPU s per 1M records, steady state")
    right.set_title("CPU per record")
    for ax in (left, right):
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=110)
    plt.close(fig)
    names.append("throughput.png")
    return names


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--stateful" in argv:  # a benchmark of its own, with its own options (bench/stateful.py --help)
        return stateful.main([a for a in argv if a != "--stateful"])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stateful", action="store_true", help="run the stateful benchmark instead (bench/stateful.py; its own options)")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument(
        "--rate",
        "--rates",
        dest="rates",
        type=int,
        nargs="+",
        default=[1_000, 10_000],
        help="records per second of the latency runs, one run per rate",
    )
    parser.add_argument("--latency-seconds", type=float, default=60.0)
    parser.add_argument("--warmup-seconds", type=float, default=10.0, help="unmeasured paced traffic before each latency run")
    parser.add_argument("--out", type=pathlib.Path, default=HERE / "results", help="where latest.json and latest.md go")
    parser.add_argument("--only", nargs="*", default=None, help="run only contenders whose name starts with these words")
    parser.add_argument(
        "--latency-only",
        nargs="*",
        default=None,
        help="latency runs only for contenders whose name starts with these words (the smoke run's shortcut)",
    )
    parser.add_argument(
        "--density",
        type=int,
        default=3,
        help="instances of the service and of Kafka Streams started side by side, idle, for the density figure (0: none)",
    )
    parser.add_argument(
        "--density-settle-seconds", type=float, default=75.0, help="idle time before the density samples (Spark ends idle workers after 60 s)"
    )
    parser.add_argument("--density-sample-seconds", type=float, default=10.0)
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="kafka",
        help="the broker started for the run: kafka (Apache Kafka, default) or tansu (embedded); KAFKA_BOOTSTRAP_SERVERS uses a running one instead",
    )
    args = parser.parse_args(argv)

    service_cmd, quix_python = ensure_service(), ensure_quix()
    broker, bootstrap, where = broker_for(args.engine)
    logs = pathlib.Path(tempfile.mkdtemp(prefix="bench-logs-"))
    engine = args.engine if broker else None
    if engine == "tansu":
        print("Spark's Kafka connector is left out on the embedded broker (its ListOffsets(latest) is wrong)", flush=True)
    print(f"broker {bootstrap} ({where}); contender logs in {logs}", flush=True)
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
        for c in selected(runnable(contenders(service_cmd, quix_python, bootstrap, in_topic, f"bench.{run_id}.t"), engine), args.only):
            clients.create_topics(base, topics_of(c))
            r = throughput_run(c, base, c.output_topic, args.records, expected, logs)
            print(f"throughput {c.name}: {r['records_per_s']:,.0f} records/s, {r['detections']}/{r['expected']} detections", flush=True)
            throughput.append(r)
        timed = selected(selected(runnable(contenders(service_cmd, quix_python, bootstrap, "", ""), engine), args.only), args.latency_only)
        runs = [(rate, c) for rate in args.rates for c in timed]
        for n, (rate, c) in enumerate(runs):
            # Each latency run gets fresh topics: a new input, so no backlog from another contender.
            in_t = f"bench.{run_id}.l{n}.in"
            c = next(x for x in contenders(service_cmd, quix_python, bootstrap, in_t, f"bench.{run_id}.l{n}") if x.name == c.name)
            clients.create_topics(base, {in_t: PARTITIONS, **topics_of(c)})
            r = latency_run(c, base, in_t, c.output_topic, rate, args.latency_seconds, logs, args.warmup_seconds)
            print(
                f"latency at {rate:,}/s {c.name}: p50 {r['p50_ms']:,.0f} ms, p99 {r['p99_ms']:,.0f} ms ({r['received']}/{r['expected']})", flush=True
            )
            latency.append(r)
        density = []
        if args.density:
            d_in = f"bench.{run_id}.density.in"
            clients.create_topics(base, {d_in: PARTITIONS})
            for name in (SERVICE_NAME, STREAMS):
                if not selected([Contender(name, "", [])], args.only):
                    continue

                def make(i: int, name=name, d_in=d_in):
                    return next(x for x in contenders(service_cmd, quix_python, bootstrap, d_in, f"bench.{run_id}.d{i}") if x.name == name)

                d = density_run(
                    name, make, base, d_in, args.density, logs,
                    launch=launch, stop=stop, until_ready=await_first_detection, tail_of=OutputTail, sampler_of=TreeSampler, topics_of=topics_of,
                    settle_s=args.density_settle_seconds, sample_s=args.density_sample_seconds,
                )  # fmt: skip
                print(f"density {name}: {d['idle_pss_bytes'] / 2**20:,.0f} MiB per idle instance, {d['fit_in_memory']} fit", flush=True)
                density.append(d)
    finally:
        if broker is not None:
            broker.stop()

    throughput.append(
        {
            "name": "raw broker (produce / consume, no processing)",
            "complete": consumed == args.records,
            "records_per_s": consume_rate,
            "produce_records_per_s": produce_rate,
            "detections": None,
            "expected": None,
        }
    )
    plain_t = next((r["records_per_s"] for r in throughput if r["name"].startswith("plain")), float("nan"))
    multi_t = next((r["records_per_s"] for r in throughput if r["name"].startswith("multi-process")), float("nan"))
    for r in throughput:
        r["ratio_to_plain"] = ratio(r["records_per_s"], plain_t)
        r["ratio_to_processes"] = ratio(r["records_per_s"], multi_t)
    for r in latency:
        plain_l = next((x for x in latency if x["name"].startswith("plain") and x["rate"] == r["rate"]), None)
        r["p50_ratio_to_plain"] = ratio(r["p50_ms"], plain_l["p50_ms"] if plain_l else float("nan"))
        r["p99_ratio_to_plain"] = ratio(r["p99_ms"], plain_l["p99_ms"] if plain_l else float("nan"))
    result = {
        "machine": machine(),
        "broker": where,
        "params": {
            "records": args.records,
            "record_bytes": round(statistics.mean(len(v) for _, v, _ in values[:1000])),
            "rates": args.rates,
            "latency_seconds": args.latency_seconds,
            "warmup_seconds": args.warmup_seconds,
            "partitions": PARTITIONS,
            "cores": CORES,
            "density_settle_seconds": args.density_settle_seconds,
        },
        "throughput": throughput,
        "latency": latency,
        "density": density,
    }
    result["targets"] = targets(result)
    args.out.mkdir(parents=True, exist_ok=True)
    charts = draw_charts(result, args.out)
    for r in latency:
        r.pop("latencies_ms", None)  # drawn; too many to keep in the JSON
    (args.out / "latest.json").write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(result, charts)
    (args.out / "latest.md").write_text(table)
    print()
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
