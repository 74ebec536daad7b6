"""How long records wait when the instances of a detector service are replaced or crash, with
records flowing at a steady rate: the figures behind the choice of group membership.

    python bench/handover.py                                   # every scenario, classic protocol, Apache Kafka
    python bench/handover.py deployment-dynamic statefulset    # some scenarios
    python bench/handover.py crash-dynamic --engine tansu      # a crash on the embedded broker
    python bench/handover.py deployment-dynamic --group-protocol consumer   # KIP-848 (Kafka 4.0+)

Scenarios (two instances of one core each on a 4-partition topic, except the crashes: one instance):
- deployment-static: a Deployment whose pods set INSTANCE_ID to the pod name: each new pod is a new
  static member; the old pod stops gracefully, and a static member does not leave the group, so its
  partitions wait for the session timeout. Order: start the new pod, wait until ready, stop the old.
- deployment-dynamic: a Deployment without INSTANCE_ID (dynamic members; a graceful stop leaves
  the group at once). Order: start the new pod, wait until ready, stop the old (maxSurge 1,
  maxUnavailable 0).
- statefulset: stable static ids; order: stop pod N, then start its replacement with the same INSTANCE_ID.
- crash-dynamic / crash-static: one instance killed with SIGKILL (driver, JVM and Python workers),
  restarted at once (a container restarted in its pod), with a new id / the same INSTANCE_ID; an
  instance that exits at start is restarted again after 10, 20, 40 s (the kubelet's back-off).

Each replacement (or crash) opens a window that ends `--settle` seconds after the last instance
involved is ready (and the old one has exited). Per window:
- gap: the longest time during which some input partition got no detection written: per partition,
  the largest distance between consecutive detections' write times (their Kafka timestamps) in the
  window, the window's edges included. With 25% of the records detected and 250 records/s per
  partition, a steady service's gap is the time between its writes.
- max latency: the longest a record produced in the window waited for its detection (input
  timestamp to output timestamp; for the steady window, records produced up to 3 s before its end).
- crashes also: from the kill to the first detection written after it, and to the new instance's
  /ready.
Steady-state figures (the same, over `--steady` seconds before the first replacement) are the
baseline. Every detection must arrive (none lost); duplicates are counted (a crash replays its
uncommitted batch).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

import psutil
from confluent_kafka import Consumer, Producer, TopicPartition

from detectorkit.devtools.pacing import Pacer
from detectorkit.kafka import clients

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
SCRIPTS = REPO / "scripts"
WORK = HERE / ".work" / "handover"
PARTITIONS = 4
HIGH_SHARE = 0.25  # above 1000, the baked detector's default threshold
SERVICE = "high-value-orders"  # the baked service's default name
ROLLING = ("deployment-static", "deployment-dynamic", "statefulset")
CRASHES = ("crash-dynamic", "crash-static")
SCENARIOS = ROLLING + CRASHES


class Feed(threading.Thread):
    """Records at a steady rate, keys spread over the partitions; a quarter are above the threshold."""

    def __init__(self, base: dict, topic: str, rate: float):
        super().__init__(daemon=True)
        self.producer = Producer(clients.producer(base, **{"linger.ms": 5}))
        self.topic, self.rate = topic, rate
        self.sent = 0
        self.high = 0
        self._halt = threading.Event()

    def run(self) -> None:
        rng = random.Random(11)
        pacer = Pacer(self.rate)
        while not self._halt.is_set():
            high = rng.random() < HIGH_SHARE
            amount = round(rng.uniform(1000.01, 5000), 2) if high else round(rng.uniform(0, 1000), 2)
            key = f"customer-{rng.randrange(10_000):05d}"
            value = json.dumps({"id": f"r-{self.sent}", "customer": key, "amount": amount, "currency": "EUR"})
            self.producer.produce(self.topic, key=key.encode(), value=value.encode())
            self.sent += 1
            self.high += high
            self.producer.poll(0)
            pacer.wait(self.sent)
        self.producer.flush(30)
        self.producer = None  # destroyed now, not after the broker has stopped (it would log refused connections)

    def stop(self) -> None:
        self._halt.set()
        self.join(60)


@dataclass
class Detection:
    written: float  # epoch s: the output record's timestamp
    produced: float  # epoch s: the input record's timestamp
    partition: int
    offset: int


class Tail(threading.Thread):
    """Every detection written, as it arrives."""

    def __init__(self, base: dict, topic: str):
        super().__init__(daemon=True)
        self.consumer = Consumer(clients.consumer(base, f"handover-tail-{uuid.uuid4().hex[:8]}"))
        self.consumer.assign([TopicPartition(topic, p, 0) for p in clients.topic_partitions(self.consumer, topic, 30)])
        self.found: list[Detection] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            for m in self.consumer.consume(10_000, timeout=0.1):
                if m.error() is None:
                    source = json.loads(m.value())["source"]
                    self.found.append(Detection(m.timestamp()[1] / 1000, source["timestamp_ms"] / 1000, source["partition"], source["offset"]))
        self.consumer.close()

    def unique(self) -> int:
        return len({(d.partition, d.offset) for d in self.found})

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


@dataclass
class Window:
    name: str
    start: float
    end: float
    notes: dict = field(default_factory=dict)


def gap(found: list[Detection], start: float, end: float) -> float:
    """The longest stretch in [start, end] during which some partition got no detection written."""
    worst = 0.0
    for p in range(PARTITIONS):
        times = sorted(d.written for d in found if d.partition == p and start <= d.written <= end)
        edges = [start, *times, end]
        worst = max(worst, max(b - a for a, b in zip(edges, edges[1:], strict=False)))
    return worst


def latencies(found: list[Detection], start: float, end: float) -> list[float]:
    return sorted(d.written - d.produced for d in found if start <= d.produced <= end)


def quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * (len(values) - 1)))] if values else float("nan")


class Lab:
    """A broker, the baked service, topics of its own per scenario, a feed and a tail."""

    def __init__(self, engine: str, broker_options: dict[str, str], service_cmd: str):
        self.engine, self.service_cmd = engine, service_cmd
        if engine == "kafka":
            from detectorkit.devtools.kafka_broker import KafkaBroker

            self.broker = KafkaBroker(overrides=broker_options).start()
        else:
            from detectorkit.devtools.embedded_broker import EmbeddedBroker

            self.broker = EmbeddedBroker().start()
        self.base = clients.base(self.broker.bootstrap_servers)

    def close(self) -> None:
        self.broker.stop()


class Scenario:
    def __init__(self, lab: Lab, name: str, settings: dict[str, str], rate: float):
        self.lab, self.name = lab, name
        prefix = f"{name}-{uuid.uuid4().hex[:6]}"
        self.run_dir = WORK / prefix
        self.run_dir.mkdir(parents=True)
        topics = self.topics = {"in": f"{prefix}.in", "out": f"{prefix}.out", "dlq": f"{prefix}.dlq", "metrics": f"{prefix}.metrics"}
        clients.create_topics(lab.base, {topics["in"]: PARTITIONS, topics["out"]: PARTITIONS, topics["dlq"]: 1, topics["metrics"]: 1})
        inherited = {
            k: v for k, v in os.environ.items() if not k.startswith(("DETECTOR_", "SPARK_", "KAFKA_", "GROUP_", "HEALTH_")) and k != "INSTANCE_ID"
        }
        self.env = {
            **inherited,
            "KAFKA_BOOTSTRAP_SERVERS": lab.broker.bootstrap_servers,
            "INPUT_TOPIC": topics["in"],
            "OUTPUT_TOPIC": topics["out"],
            "DLQ_TOPIC": topics["dlq"],
            "METRICS_TOPIC": topics["metrics"],
            "METRICS_INTERVAL_SECONDS": "1",
            "CONSUMER_GROUP": prefix,
            "STARTING_OFFSETS": "earliest",
            "SPARK_MASTER": "local[1]",
            "PYTHONUNBUFFERED": "1",
            **settings,
        }
        self.tail = Tail(lab.base, topics["out"])
        self.feed = Feed(lab.base, topics["in"], rate)
        self.windows: list[Window] = []
        self.log: list[str] = []

    def say(self, text: str) -> None:
        line = f"[{self.name} +{time.monotonic() - self.began:5.1f} s] {text}"
        self.log.append(line)
        print(line, flush=True)

    def start(self, name: str, instance_id: str | None) -> float:
        """scripts/start-instance.sh: returns when the instance is ready."""
        env = dict(self.env)
        if instance_id:
            env["INSTANCE_ID"] = instance_id
        done = subprocess.run(
            [str(SCRIPTS / "start-instance.sh"), str(self.run_dir), name, self.lab.service_cmd], env=env, capture_output=True, text=True, timeout=600
        )
        if done.returncode != 0:
            raise RuntimeError(f"{name} did not start: {done.stderr.strip()}")
        self.say(done.stdout.strip())
        return time.time()

    def stop(self, name: str) -> float:
        done = subprocess.run([str(SCRIPTS / "stop-instance.sh"), str(self.run_dir), name], env=self.env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"{name} did not stop cleanly: {done.stderr.strip()}")
        self.say(done.stdout.strip())
        return time.time()

    def kill(self, name: str) -> float:
        """SIGKILL to every process of the instance at once, as when its container is killed: the
        driver, the JVM and the Python workers (PySpark's daemons run in process groups of their
        own, so the instance's group alone would leave a task in flight writing on)."""
        pidfile = self.run_dir / f"{name}.pid"
        root = psutil.Process(int(pidfile.read_text()))
        processes = [root, *root.children(recursive=True)]
        for process in processes:
            try:
                process.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        killed = time.time()
        psutil.wait_procs(processes, timeout=10)
        pidfile.unlink()
        self.say(f"{name} killed: SIGKILL to its {len(processes)} processes (driver, JVM, Python workers)")
        return killed

    def wait_settled(self, instances: int, timeout: float = 180) -> None:
        """Until the group has settled: `instances` instances report owning partitions (their
        metric snapshots, every second), all partitions in all, and every partition's newest
        detection is recent and was written promptly. A newcomer's first, often empty, assignment
        is not the end of a rebalance."""
        from detectorkit.devtools.scale_report import readings
        from detectorkit.kafka.topic_reader import read_messages

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now, newest, latest = time.time(), {}, {}
            for d in self.tail.found[-2000:]:
                newest[d.partition] = d
            for r in readings((m.value() for m in read_messages(self.lab.base, self.topics["metrics"], timeout=30)), SERVICE):
                latest[r.instance] = r
            owners = [r.assigned for r in latest.values() if r.timestamp > now - 3 and r.assigned > 0]
            flowing = len(newest) == PARTITIONS and all(now - d.written < 1.5 and d.written - d.produced < 1.5 for d in newest.values())
            if flowing and len(owners) == instances and sum(owners) == PARTITIONS:
                return
            time.sleep(0.5)
        raise RuntimeError(f"the group did not settle on {instances} instances within {timeout:.0f} s")

    def cleanup(self) -> None:
        for pidfile in self.run_dir.glob("*.pid"):
            try:
                root = psutil.Process(int(pidfile.read_text()))
                for process in [*root.children(recursive=True), root]:
                    process.kill()
            except (psutil.NoSuchProcess, ValueError):
                pass

    def run(self, steady: float, settle: float) -> dict:
        self.began = time.monotonic()
        self.tail.start()
        self.feed.start()
        try:
            self.act(steady, settle)
        finally:
            self.feed.stop()
            expected = self.feed.high
            deadline = time.monotonic() + 120
            while self.tail.unique() < expected and time.monotonic() < deadline:
                time.sleep(0.2)  # the last records' detections are on their way
            self.cleanup()
            self.tail.stop()
        return self.summary(expected)

    def act(self, steady: float, settle: float) -> None:
        scenario = self.name
        if scenario in CRASHES:
            static = "detector-0" if scenario == "crash-static" else None
            self.start("a", static)
            self.wait_settled(1)
            steady_start = time.time()
            time.sleep(steady)  # the baseline window: records flowing through one settled instance
            self.windows.append(Window("steady", steady_start, time.time()))
            killed = self.kill("a")
            # As the kubelet does: restart at once, and again after 10, 20, 40 s... when it exits.
            for attempt, backoff in enumerate((0, 10, 20, 40, 80), 1):
                time.sleep(backoff)
                try:
                    ready = self.start("a", static)
                    break
                except RuntimeError as exc:
                    self.say(f"restart {attempt} failed: {str(exc).splitlines()[-1][:200]}")
            else:
                raise RuntimeError("the killed instance did not come back after 5 restarts")
            while not any(d.written > killed for d in self.tail.found):
                time.sleep(0.1)
            first = min(d.written for d in self.tail.found if d.written > killed)
            time.sleep(settle)
            notes = {"ready_s": ready - killed, "first_detection_s": first - killed, "restarts": attempt}
            self.windows.append(Window("crash", killed, time.time(), notes))
            return
        ids = {"a": "detector-0", "b": "detector-1"}
        static = scenario != "deployment-dynamic"
        for name in ("a", "b"):
            self.start(name, ids[name] if static else None)
        self.wait_settled(2)
        steady_start = time.time()
        time.sleep(steady)
        self.windows.append(Window("steady", steady_start, time.time()))
        for n, old in enumerate(("a", "b"), 1):
            self.wait_settled(2)
            began = time.time()
            if scenario == "statefulset":  # stop pod N, then start it again under the same name
                self.stop(old)
                self.start(old, ids[old])
            else:  # maxSurge 1, maxUnavailable 0: the new pod first, ready, then the old one stops
                new = f"{old}-2"
                self.start(new, f"{ids[old]}-2" if static else None)
                self.stop(old)
            done = time.time()
            time.sleep(settle)
            self.windows.append(Window(f"replacement {n}", began, time.time(), {"replacement_s": done - began}))

    def summary(self, expected: int) -> dict:
        found = self.tail.found
        copies: dict[tuple[int, int], list[float]] = {}
        for d in found:
            copies.setdefault((d.partition, d.offset), []).append(round(d.written, 3))
        rows = []
        for w in self.windows:
            # A steady window's last records are caught by what comes next: their wait is not steady.
            lat = latencies(found, w.start, w.end - 3 if w.name == "steady" else w.end)
            rows.append(
                {
                    "window": w.name,
                    "seconds": round(w.end - w.start, 1),
                    "gap_s": round(gap(found, w.start, w.end), 2),
                    "latency_p50_s": round(quantile(lat, 0.5), 2),
                    "latency_max_s": round(lat[-1], 2) if lat else None,
                    **{k: round(v, 1) for k, v in w.notes.items()},
                }
            )
        return {
            "scenario": self.name,
            "records": self.feed.sent,
            "detections_expected": expected,
            "detections_unique": self.tail.unique(),
            "detections_written_twice": len(found) - self.tail.unique(),
            "windows": rows,
            "log": self.log,
            # Each detection written more than once: where, and when each copy was written.
            "twice": [{"partition": p, "offset": o, "written": sorted(times)} for (p, o), times in sorted(copies.items()) if len(times) > 1],
        }


def table(results: list[dict], settings: dict) -> str:
    lines = [
        f"settings: {json.dumps(settings)}",
        "",
        "| scenario | window | gap (s) | latency p50 / max (s) | other | lost | twice |",
        "|---|---|---:|---:|---|---:|---:|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['scenario']} | failed: {r['error'][:150]} | | | | | |")
            continue
        lost = r["detections_expected"] - r["detections_unique"]
        for w in r["windows"]:
            other = ", ".join(f"{k} {w[k]}" for k in ("replacement_s", "ready_s", "first_detection_s", "restarts") if k in w)
            lines.append(
                f"| {r['scenario']} | {w['window']} | {w['gap_s']:.2f} | {w['latency_p50_s']:.2f} / {w['latency_max_s']:.2f} | "
                f"{other} | {lost} | {r['detections_written_twice']} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO", help=f"of {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--engine", choices=("kafka", "tansu"), default="kafka")
    parser.add_argument("--rate", type=float, default=1000.0, help="records per second")
    parser.add_argument("--steady", type=float, default=15.0, help="seconds of baseline before the first replacement")
    parser.add_argument("--settle", type=float, default=None, help="seconds after a replacement (default: session timeout + 15)")
    parser.add_argument("--session-timeout", type=float, default=None, help="GROUP_SESSION_TIMEOUT_SECONDS (default: the service's)")
    parser.add_argument("--group-protocol", choices=("classic", "consumer"), default="classic")
    parser.add_argument(
        "--broker-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an Apache Kafka server property, e.g. group.consumer.min.session.timeout.ms=6000",
    )
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.scenarios) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario {', '.join(unknown)}: choose from {', '.join(SCENARIOS)}")
    scenarios = args.scenarios or list(SCENARIOS)
    settings = {"GROUP_PROTOCOL": args.group_protocol}
    if args.session_timeout is not None:
        settings["GROUP_SESSION_TIMEOUT_SECONDS"] = f"{args.session_timeout:g}"
    from detectorkit.settings import Settings

    session = args.session_timeout or Settings.model_fields["group_session_timeout_seconds"].default
    settle = args.settle if args.settle is not None else session + 15
    broker_options = dict(option.split("=", 1) for option in args.broker_option)

    sys.path.insert(0, str(HERE))
    from common import ensure_service  # the same baked service as the benchmark

    service_cmd = ensure_service()
    lab = Lab(args.engine, broker_options, service_cmd)
    results = []
    try:
        for name in scenarios:
            scenario = Scenario(lab, name, settings, args.rate)
            try:
                results.append(scenario.run(args.steady, settle))
            except RuntimeError as exc:  # e.g. an instance that could not rejoin: a result too
                print(f"{name} failed: {exc}", flush=True)
                results.append({"scenario": name, "error": str(exc), "log": scenario.log})
            finally:
                scenario.cleanup()
    finally:
        lab.close()
    meta = {
        "engine": args.engine,
        "rate": args.rate,
        "partitions": PARTITIONS,
        "broker_options": broker_options,
        **settings,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print()
    print(table(results, meta))
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    lost = sum(r["detections_expected"] - r["detections_unique"] for r in results if "error" not in r)
    return 1 if lost or any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
