"""`detectorkit diamond` (`make diamond`): the whole diamond on one machine.

raw records -> normaliser -> records.normalized -> two detectors generated from the template
(threshold, burst) -> detections -> notifier -> notifications, each a streaming job of its own
(a process, as a deployment runs it), the metrics-aggregator serving /metrics the whole time, and
a live per-job summary from it. At the end: the first notifications and a reconciliation of every
stage against what the generator planted.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime

from detectorkit.devtools.broker_net import free_port
from detectorkit.devtools.brokers import ENGINES, start_broker
from detectorkit.devtools.pacing import Pacer
from detectorkit.kafka import clients
from detectorkit.kafka.topic_reader import read_topic
from detectorkit.samples import raw_samples

RAW, NORMALISED, DETECTIONS, NOTIFICATIONS = "records.raw", "records.normalized", "detections", "notifications"
METRICS = "metrics"
DETECTORS = (("high-value-orders", "threshold"), ("order-bursts", "burst"))
# --join-detector: a third detector deployed into the running diamond, with an output of its own so
# that the notifier's reconciliation stays about the first two.
JOINING, JOINING_OUTPUT = ("late-orders", "threshold"), "detections.late"
WINDOW_SECONDS = 3600.0


@dataclass
class Job:
    name: str
    command: list[str]
    env: dict[str, str]
    log: pathlib.Path
    process: subprocess.Popen | None = None

    def start(self) -> Job:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(self.command, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def stop(self, timeout: float = 120.0) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait()


@dataclass
class Diamond:
    work: pathlib.Path
    bootstrap: str
    template: pathlib.Path
    spark_master: str = "local[1]"
    jobs: list[Job] = field(default_factory=list)
    aggregator_port: int = 0
    final_metrics: dict = field(default_factory=dict)  # the aggregate when the diamond had drained
    # Each job's SLICE_SECONDS.
    slice_seconds: float = 5.0

    def env(self, job: str | None = None, **settings: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DETECTOR_", "NOTIFIER_", "SLICE_"))}
        env.update(
            {
                "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
                "STARTING_OFFSETS": "earliest",
                "METRICS_TOPIC": METRICS,
                "METRICS_INTERVAL_SECONDS": "2",
                "SPARK_MASTER": self.spark_master,
                "CREATE_TOPICS": "true",
            }
        )
        env["SLICE_SECONDS"] = f"{self.slice_seconds:g}"
        env.update({k.upper(): v for k, v in settings.items()})
        return env

    def create_topics(self, partitions: int) -> None:
        topics = {t: partitions for t in (RAW, NORMALISED, DETECTIONS, NOTIFICATIONS, JOINING_OUTPUT)}
        topics.update({f"{name}.dlq": partitions for name in ("normaliser", "notifier", *(n for n, _ in (*DETECTORS, JOINING)))})
        topics[METRICS] = 1
        clients.create_topics(clients.base(self.bootstrap), topics)

    def bake_detectors(self, detectors=DETECTORS, output_topic: str = DETECTIONS) -> dict[str, list[str]]:
        """Generate detectors from the template, as a data scientist would, and install them."""
        from cookiecutter.main import cookiecutter

        commands = {}
        for name, kind in detectors:
            project = cookiecutter(
                str(self.template),
                no_input=True,
                output_dir=str(self.work),
                overwrite_if_exists=True,
                extra_context={"service_name": name, "detector_kind": kind, "input_topic": NORMALISED, "output_topic": output_topic},
            )
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", project], check=True)
            commands[name] = [sys.executable, "-m", name.replace("-", "_")]
        return commands

    def start(self, detector_commands: dict[str, list[str]]) -> None:
        self.aggregator_port = free_port()
        dk = [sys.executable, "-m", "detectorkit"]
        self.jobs = [
            Job(
                "aggregator",
                [
                    *dk,
                    "aggregate",
                    "--bootstrap-servers",
                    self.bootstrap,
                    "--metrics-topic",
                    METRICS,
                    "--port",
                    str(self.aggregator_port),
                    "--interval-seconds",
                    "2",
                ],
                self.env(),
                self.work / "aggregator.log",
            ),
            Job("normaliser", [*dk, "normalise"], self.env("normaliser", input_topic=RAW, output_topic=NORMALISED), self.work / "normaliser.log"),
            *(Job(name, command, self.env(name), self.work / f"{name}.log") for name, command in detector_commands.items()),
            Job(
                "notifier",
                [*dk, "notify"],
                self.env("notifier", input_topic=DETECTIONS, output_topic=NOTIFICATIONS, notifier_window_seconds=str(WINDOW_SECONDS)),
                self.work / "notifier.log",
            ),
        ]
        for job in self.jobs:
            job.start()

    def stop(self) -> dict[str, int | None]:
        # Upstream first, so each stage's last batch finds its input complete.
        return {job.name: job.stop() for job in self.jobs[1:] + self.jobs[:1]}

    def scrape(self) -> dict[str, dict[str, float]]:
        """service -> metric -> value, summed over labels, from the aggregator's /metrics."""
        from prometheus_client.parser import text_string_to_metric_families

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.aggregator_port}/metrics", timeout=2) as response:
                text = response.read().decode()
        except OSError:
            return {}
        table: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if "service" in s.labels:
                    table[s.labels["service"]][s.name] += s.value
        return table


@dataclass
class Joining:
    """A third detector deployed into the running diamond (`--join-detector`): the feed holds at
    its middle, the detector starts with no committed offsets, and the feed goes on once its group
    holds where it starts. It must start at the end of its input and leave the others running."""

    name: str
    command: list[str]
    bootstrap: str
    ends: dict[int, int] | None = None  # records.normalized's end offsets when it was deployed
    # The records normalised by then: not the offsets' sum, which counts an exactly-once
    # normaliser's transaction markers too.
    before: int = 0
    had_offsets: bool = False  # its group held offsets before it started (it must not)
    start: dict[int, int] | None = None  # where its group says it starts
    job: Job | None = None

    def deploy(self, diamond: Diamond, normalised: int) -> None:
        from detectorkit.kafka import broker_kind
        from detectorkit.kafka.end_offsets import open_end_offsets

        base = clients.base(self.bootstrap)
        kind = broker_kind.resolve(broker_kind.AUTO, base, 30.0)
        probe = open_end_offsets(kind, base, f"{self.name}.probe", NORMALISED, 30.0)
        try:
            self.ends = probe.end_offsets(probe.topic_partitions(), confirmed=True)
        finally:
            probe.close()
        self.before = normalised
        self.had_offsets = any(o is not None for o in self._committed().values())
        # Its default STARTING_OFFSETS (latest), not the others' earliest.
        env = diamond.env(self.name, output_topic=JOINING_OUTPUT)
        env.pop("STARTING_OFFSETS")
        self.job = Job(self.name, self.command, env, diamond.work / f"{self.name}.log").start()
        diamond.jobs.append(self.job)

    def started(self) -> bool:
        """True once its group holds a position for every partition (the job commits where it
        starts before its first batch)."""
        if self.start is None:
            committed = self._committed()
            if all(o is not None for o in committed.values()):
                self.start = committed
        return self.start is not None

    def _committed(self) -> dict[int, int | None]:
        from detectorkit.kafka.offset_store import OffsetStore

        store = OffsetStore(clients.consumer(clients.base(self.bootstrap), self.name), NORMALISED)
        try:
            return store.committed(sorted(self.ends))
        finally:
            store.close()

    def lines(self, table: dict[str, dict[str, float]]) -> tuple[list[str], bool]:
        m = table.get(self.name, {})
        after = _normalised(table) - self.before
        at_end = self.start == self.ends and not self.had_offsets
        read_after = m.get("detector_records_read_total", -1) == after
        return [
            f"{self.name} deployed halfway, with no committed offsets: started at the end of {NORMALISED} "
            f"({sum(self.start.values()):,} of {sum(self.ends.values()):,}): {'yes' if at_end else 'NO'}",
            f"{self.name} read the {after:,} records normalised after it joined: "
            f"{'yes' if read_after else 'NO, ' + format(m.get('detector_records_read_total', 0), ',.0f')}; the others went on",
        ], at_end and read_after


def summary_table(table: dict[str, dict[str, float]], jobs: list[Job]):
    from rich.table import Table

    view = Table(title="the diamond, aggregated by the metrics-aggregator", expand=False)
    for column in ("job", "up", "records in", "detections", "dead letters", "lag"):
        view.add_column(column, justify="left" if column == "job" else "right")
    for job in jobs[1:]:
        m = table.get(job.name, {})
        alive = "yes" if job.process is not None and job.process.poll() is None else f"exited {job.process.returncode}"
        view.add_row(
            job.name,
            alive,
            f"{m.get('detector_records_read_total', 0):,.0f}",
            f"{m.get('detector_detections_written_total', 0):,.0f}",
            f"{m.get('detector_dead_letters_total', 0):,.0f}",
            f"{m.get('detector_consumer_lag_records', 0):,.0f}",
        )
    return view


def reconcile(bootstrap: str, planted: list, window_s: float = WINDOW_SECONDS) -> tuple[list[str], bool]:
    """Lines comparing every stage with what the generator planted; True when all of it holds."""
    base = clients.base(bootstrap)
    count = {t: len(list(read_topic(base, t))) for t in (RAW, NORMALISED, "normaliser.dlq")}
    notes = [json.loads(m["value"]) for m in read_topic(base, NOTIFICATIONS)]
    per_window = collections.Counter((n["customer"], n["window_start"]) for n in notes)

    def window_of(sample) -> tuple[str, str]:
        moment = datetime.fromisoformat(sample.normalised["timestamp"].replace("Z", "+00:00"))
        start = int(moment.timestamp() // window_s * window_s)
        return sample.normalised["customer"], datetime.fromtimestamp(start, moment.tzinfo).isoformat(timespec="milliseconds").replace("+00:00", "Z")

    anomalies = {window_of(s) for s in planted if s.anomaly or s.burst}
    missing = anomalies - set(per_window)
    twice = {k: v for k, v in per_window.items() if v > 1}
    extra = set(per_window) - anomalies
    raw_ok = count[RAW] == count[NORMALISED] + count["normaliser.dlq"] == len(planted)
    lines = [
        f"raw {count[RAW]:,} = normalised {count[NORMALISED]:,} + upstream dead letters {count['normaliser.dlq']:,}: {'yes' if raw_ok else 'NO'}",
        f"anomalous customer-windows planted {len(anomalies):,}; notified {len(anomalies - missing):,}; missed {len(missing)}; "
        f"notified twice {len(twice)}",
    ]
    if extra:
        lines.append(f"notified without a planted anomaly: {len(extra)} (records of one customer that happened to form a burst)")
    return lines, raw_ok and not missing and not twice


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="detectorkit diamond", description="Run the whole diamond on one machine.")
    parser.add_argument("--engine", choices=ENGINES, default="tansu", help="tansu (embedded, default) or kafka (Apache Kafka)")
    parser.add_argument("--bootstrap-servers", default=None, help="use this broker instead of starting one")
    parser.add_argument("--records", type=int, default=5_000)
    parser.add_argument("--rate", type=float, default=500.0, help="raw records per second")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--work", default=".diamond", help="where the detectors are generated and the logs go")
    parser.add_argument("--template", default=".", help="the template's folder (this repository)")
    parser.add_argument("--timeout-seconds", type=float, default=600.0, help="give up waiting for the diamond to drain")
    parser.add_argument("--no-live", dest="live", action="store_false", help="no live table (logs, CI)")
    parser.add_argument(
        "--join-detector", action="store_true", help="halfway through, deploy a third detector generated from the template into the running diamond"
    )
    parser.add_argument("--slice-seconds", type=float, default=5.0, help="the jobs' SLICE_SECONDS (default: 5)")
    args = parser.parse_args(argv)
    work = pathlib.Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())

    broker = _Given(args.bootstrap_servers) if args.bootstrap_servers else start_broker(args.engine)
    diamond = Diamond(work, broker.bootstrap_servers, pathlib.Path(args.template).resolve(), slice_seconds=args.slice_seconds)
    try:
        diamond.create_topics(args.partitions)
        detectors = diamond.bake_detectors()
        joining = None
        if args.join_detector:
            (command,) = diamond.bake_detectors((JOINING,), JOINING_OUTPUT).values()
            joining = Joining(JOINING[0], command, broker.bootstrap_servers)
        diamond.start(detectors)
        planted = list(
            raw_samples(
                args.records,
                seed=args.seed,
                anomaly_share=0.01,
                malformed_share=0.02,
                burst_share=0.002,
                customers=1_000_000,
                start_s=int(time.time()),
                per_second=args.rate,
            )
        )
        fed = Feed(hold_at=len(planted) // 2 if joining else None)
        threading.Thread(target=fed.run, args=(broker.bootstrap_servers, planted, args.rate, stopping), daemon=True).start()
        drained = _watch(diamond, args, planted, fed, stopping, joining)
    finally:
        codes = diamond.stop()
        broker_out = broker.bootstrap_servers
    try:
        if not drained:
            print(f"the diamond did not drain within {args.timeout_seconds:g} s (or was stopped); logs in {work}", file=sys.stderr)
            return 1
        notes = [json.loads(m["value"]) for m in read_topic(clients.base(broker_out), NOTIFICATIONS)]
        print(f"\n{len(notes)} notifications, the first ones:")
        for n in notes[:5]:
            rules = sorted({d["service"] for d in n["detections"]})
            print(f"  {n['customer']}  {n['window_start']}  {len(n['detections'])} detection(s) from {', '.join(rules)}")
        lines, ok = reconcile(broker_out, planted)
        if joining is not None:
            more, joined_ok = joining.lines(diamond.final_metrics)
            lines, ok = lines + more, ok and joined_ok
        print("\nreconciliation:")
        for line in lines:
            print(f"  {line}")
        metrics = {service: dict(values) for service, values in diamond.final_metrics.items()}
        failed = {name: code for name, code in codes.items() if code not in (0, None)}
        (work / "result.json").write_text(
            json.dumps({"ok": ok, "lines": lines, "metrics": metrics, "notifications": len(notes), "failed_jobs": failed})
        )
        if failed:
            print(f"jobs that did not stop cleanly: {failed}; logs in {work}", file=sys.stderr)
        return 0 if ok and not failed else 1
    finally:
        broker.stop()


@dataclass
class _Given:
    """A broker that runs already: nothing to stop."""

    bootstrap_servers: str

    def stop(self) -> None:
        pass


class Feed:
    """Produces the raw records at the rate asked; `sent` counts them, `done` is set at the end.
    With `hold_at`, it sets `held` after that many records and waits for `resume`."""

    def __init__(self, hold_at: int | None = None):
        self.sent = 0
        self.done = threading.Event()
        self.hold_at = hold_at
        self.held, self.resume = threading.Event(), threading.Event()

    def run(self, bootstrap: str, planted: list, rate: float, stopping: threading.Event) -> None:
        producer = clients.new_producer(clients.producer(clients.base(bootstrap)))
        pacer = Pacer(rate)
        for i, s in enumerate(planted):
            if i == self.hold_at:
                producer.flush(30)
                self.held.set()
                while not (self.resume.wait(0.5) or stopping.is_set()):
                    pass
                pacer.restart_at(i)
            if stopping.is_set():
                break
            producer.produce(RAW, key=s.key, value=s.value)
            producer.poll(0)
            self.sent = i + 1
            if i % 100 == 99:
                pacer.wait(i + 1)
        producer.flush(30)
        self.done.set()


def _watch(diamond: Diamond, args, planted: list, fed: Feed, stopping: threading.Event, joining: Joining | None = None) -> bool:
    """Refresh the summary until every stage has read everything upstream of it (or the timeout);
    deploy the joining detector when the feed holds and the normaliser has caught up with it."""
    from rich.console import Group
    from rich.live import Live
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    progress = Progress(TextColumn("raw records fed"), BarColumn(), MofNCompleteColumn())
    task = progress.add_task("feed", total=len(planted))
    deadline = time.monotonic() + args.timeout_seconds
    settled_since = None
    view = Live(Group(progress, summary_table({}, diamond.jobs)), refresh_per_second=2) if args.live else contextlib.nullcontext()
    with view as live:
        while not stopping.is_set() and time.monotonic() < deadline:
            table = diamond.scrape()
            progress.update(task, completed=fed.sent)
            if args.live:
                live.update(Group(progress, summary_table(table, diamond.jobs)))
            else:
                _print_plain(table, diamond.jobs)
            dead = [j.name for j in diamond.jobs if j.process is not None and j.process.poll() is not None]
            if dead:
                print(f"job(s) exited early: {dead}; logs in {diamond.work}", file=sys.stderr)
                return False
            if joining is not None and fed.held.is_set() and not fed.resume.is_set():
                if joining.job is None and _drained(table, fed.sent, stages=("normaliser",)):
                    joining.deploy(diamond, _normalised(table))
                elif joining.job is not None and joining.started():
                    fed.resume.set()
            extra = (joining.name,) if joining is not None and joining.job is not None else ()
            settled = fed.done.is_set() and _drained(table, fed.sent, joined=extra, after=joining.before if extra else 0)
            settled_since = (settled_since or time.monotonic()) if settled else None
            if settled_since and time.monotonic() - settled_since > 6:  # three reports in a row
                diamond.final_metrics = table
                return True
            stopping.wait(1.0)
    return False


def _normalised(table: dict[str, dict[str, float]]) -> int:
    return int(table["normaliser"]["detector_records_read_total"] - table["normaliser"]["detector_dead_letters_total"])


def _drained(
    table: dict[str, dict[str, float]],
    raw: int,
    stages: tuple[str, ...] = ("normaliser", *(n for n, _ in DETECTORS), "notifier"),
    joined: tuple[str, ...] = (),
    after: int = 0,
) -> bool:
    """Each of `stages` has read all that its upstream wrote: the normaliser every raw record fed,
    each detector every normalised record, the notifier every detection; a `joined` detector at least
    every normalised record after the first `after`."""
    services = [*stages, *joined]
    if any(s not in table or table[s].get("detector_instances_up", 0) < 1 for s in services):
        return False
    if table["normaliser"].get("detector_records_read_total", 0) != raw:
        return False
    if any(table[s].get("detector_consumer_lag_records", 0) != 0 for s in services):
        return False
    normalised = _normalised(table)
    detectors = [n for n, _ in DETECTORS if n in stages]
    if any(table[n]["detector_records_read_total"] != normalised for n in detectors):
        return False
    # At least: one that read more (started earlier than it should have) must still settle, for the
    # reconciliation to say so.
    if any(table[n]["detector_records_read_total"] < normalised - after for n in joined):
        return False
    return "notifier" not in stages or table["notifier"]["detector_records_read_total"] == sum(
        table[n]["detector_detections_written_total"] for n in detectors
    )


def _print_plain(table: dict[str, dict[str, float]], jobs: list[Job]) -> None:
    cells = [f"{j.name}: in {table.get(j.name, {}).get('detector_records_read_total', 0):,.0f}" for j in jobs[1:]]
    print(" | ".join(cells), flush=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
