"""The `detectorkit` command: broker, run, backtest, aggregate, produce-sample, tail, kafka-tool, spark-archive."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

from detectorkit.cli.exits import EXIT_FAILED, fail
from detectorkit.cli.progress import bar, have_rich
from detectorkit.cli.run import run_detector
from detectorkit.devtools.broker_net import BrokerError
from detectorkit.devtools.brokers import ENGINES, start_broker
from detectorkit.kafka import clients

# A service is installed without the dev extra; its dev tools say so instead of failing on an import.
NEEDS_DEV = "pip install 'detectorkit[dev]'"


def _cmd_broker(args) -> int:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        broker = start_broker(args.engine, port=args.port, data_dir=args.data_dir)
    except BrokerError as exc:
        return fail(str(exc))
    try:
        print(broker.bootstrap_servers, flush=True)
        if args.topics:
            clients.create_topics(clients.base(broker.bootstrap_servers), {t: args.partitions for t in args.topics})
        while not stop.wait(0.5):
            if broker.process is None or broker.process.poll() is not None:
                return fail(f"the {args.engine} broker exited", EXIT_FAILED)
        return 0
    finally:
        broker.stop()


def _cmd_spark_archive(_args) -> int:
    from detectorkit.runtime import jvm

    try:
        path, seconds = jvm.build_archive()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return fail(f"cannot archive Spark's classes: {exc}", EXIT_FAILED)
    print(f"{path} ({path.stat().st_size / 2**20:.0f} MiB, {seconds:.0f} s); services on this machine start with it", flush=True)
    return 0


def _cmd_kafka_tool(tool: str, rest: list[str]) -> int:
    from detectorkit.devtools.kafka_broker import run_tool

    try:
        return run_tool(tool, rest).returncode
    except BrokerError as exc:
        return fail(str(exc))


def _cmd_run(args, rest: list[str]) -> int:
    module_name, _, attr = args.detector.partition(":")
    try:
        detector = getattr(importlib.import_module(module_name), attr or "DETECTOR")
    except (ImportError, AttributeError) as exc:
        return fail(f"cannot load detector {args.detector!r}: {exc}; use module.path:ATTRIBUTE")
    return run_detector(detector, rest)


def _cmd_produce_sample(args) -> int:
    from detectorkit.devtools.pacing import Pacer
    from detectorkit.samples import raw_samples, samples

    if args.progress is None:
        args.progress = sys.stderr.isatty() and have_rich()
    elif args.progress and not have_rich():
        return fail(f"--progress needs the dev tools: {NEEDS_DEV}, or --no-progress")

    if args.command == "produce-raw":
        made = raw_samples(args.count, seed=args.seed, anomaly_share=args.anomaly_share, malformed_share=args.malformed_share)
    else:
        made = samples(args.count, seed=args.seed, bad_every=args.bad_every)
    base = clients.base(args.bootstrap_servers)
    if args.create:
        clients.create_topics(base, {args.topic: args.partitions})
    producer = clients.new_producer(clients.producer(base))
    kinds: dict[str, int] = {}
    anomalies = 0
    pacer = Pacer(args.rate)
    with bar(args.count, f"producing to {args.topic}", args.progress) as advance:
        for i, s in enumerate(made):
            producer.produce(args.topic, key=s.key, value=s.value)
            producer.poll(0)
            kinds[s.kind] = kinds.get(s.kind, 0) + 1
            anomalies += bool(getattr(s, "anomaly", False))
            if i % 1000 == 999 or i == args.count - 1:
                advance(i + 1)
                pacer.wait(i + 1)
    if producer.flush(30):
        return fail("not every sample record was delivered", EXIT_FAILED)
    summary = {"topic": args.topic, "produced": args.count, "kinds": kinds}
    if args.command == "produce-raw":
        summary.update(anomalies=anomalies, seed=args.seed)
    print(json.dumps(summary))
    return 0


def _cmd_tail(args) -> int:
    from detectorkit.kafka.topic_reader import read_topic

    for message in read_topic(clients.base(args.bootstrap_servers), args.topic, timeout=args.timeout, limit=args.max):
        print(json.dumps(message), flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="detectorkit", description="Runtime of the detector services.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("broker", help="start a broker (the embedded Tansu, or Apache Kafka) and print its address")
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="tansu",
        help="tansu: embedded, in memory, starts at once (default); kafka: Apache Kafka (KRaft), jars from Maven Central",
    )
    p.add_argument("--port", type=int, default=None, help="loopback port (default: a free one)")
    p.add_argument("--data-dir", default=None, help="kafka only: keep the log (and the address) here across restarts")
    p.add_argument("--topics", nargs="*", default=[], help="topics to create once it runs")
    p.add_argument("--partitions", type=int, default=8, help="partitions of each created topic")

    sub.add_parser(
        "notify",
        help="run the downstream notifier: detections in, one notification per customer and window out [job flags; NOTIFIER_* settings]",
        add_help=False,
    )
    sub.add_parser(
        "normalise", help="run the upstream normaliser: raw records in, normalised records keyed by customer out [job flags]", add_help=False
    )
    p = sub.add_parser("run", help="run a detector: detectorkit run --detector my_pkg.detector:DETECTOR [job flags]")
    p.add_argument("--detector", required=True, help="module.path:ATTRIBUTE of a detectorkit.Detector")
    p = sub.add_parser(
        "backtest", help="a detector over history: detectorkit backtest --detector my_pkg.detector:DETECTOR --out found.jsonl [backtest flags]"
    )
    p.add_argument("--detector", required=True, help="module.path:ATTRIBUTE of a detectorkit.Detector")

    for name, helptext in (
        ("produce-sample", "write sample records (some bad) to a topic"),
        ("produce-raw", "write raw customer records for the normaliser (some anomalous, some malformed)"),
        ("tail", "print a topic's records as JSON lines"),
    ):
        p = sub.add_parser(name, help=helptext)
        # As `produce`, `backtest` and `diff` take it: a shell that exported it once needs no flag.
        servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        p.add_argument("--bootstrap-servers", default=servers, required=not servers, help="default: KAFKA_BOOTSTRAP_SERVERS")
        p.add_argument("--topic", required=name != "produce-raw", default="records.raw")
    for name in ("produce-sample", "produce-raw"):
        p = sub.choices[name]
        p.add_argument("--count", type=int, default=1000)
        p.add_argument("--seed", type=int, default=7, help="the same seed gives the same records")
        p.add_argument("--create", action="store_true", help="create the topic if missing")
        p.add_argument("--rate", type=float, default=None, help="records per second at most (default: as fast as it goes)")
        p.add_argument("--partitions", type=int, default=8)
        p.add_argument(
            "--progress",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="a progress bar on stderr (default: when stderr is a terminal and the dev extra is installed)",
        )
    sub.choices["produce-sample"].add_argument("--bad-every", type=int, default=50, help="every N-th record is bad (0: none)")
    p = sub.choices["produce-raw"]
    p.add_argument("--anomaly-share", type=float, default=0.02, help="share of valid records with an amount above 1000")
    p.add_argument("--malformed-share", type=float, default=0.02, help="share of records the normaliser must refuse")
    p = sub.choices["tail"]
    p.add_argument("--max", type=int, default=None, help="stop after this many records")
    p.add_argument("--timeout", type=float, default=10.0, help="give up reaching the end after this many seconds")

    sub.add_parser("diamond", help="run the whole diamond on one machine with a live summary (detectorkit diamond --help)", add_help=False)
    sub.add_parser("aggregate", help="run the shared metrics-aggregator (detectorkit aggregate --help)", add_help=False)
    sub.add_parser(
        "cluster", help="run a Spark standalone cluster on this machine and print its master URL (detectorkit cluster --help)", add_help=False
    )
    sub.add_parser(
        "spark-archive",
        help="archive Spark's JVM classes for this machine's Java and PySpark, so each service's JVM starts ~3 s sooner (once per machine or image)",
    )
    p = sub.add_parser(
        "kafka-tool", help="run one of Apache Kafka's own tools, e.g. detectorkit kafka-tool consumer-groups --describe ...", add_help=False
    )
    p.add_argument("tool", help="consumer-groups, topics, delete-records, get-offsets, transactions, console-consumer, ...")

    sub.add_parser("diff", help="compare two detection sets: backtest outputs or topics (detectorkit diff --help)", add_help=False)
    sub.add_parser("produce", help="put the records of JSON lines or Parquet files on a topic (detectorkit produce --help)", add_help=False)

    args, rest = parser.parse_known_args(argv)
    if args.command == "diff":
        from detectorkit.cli.backtest import diff_main

        return diff_main(rest)
    if args.command == "produce":
        from detectorkit.cli.produce import produce_main

        return produce_main(rest)
    if args.command == "aggregate":
        from detectorkit.metrics.aggregator_service import main as aggregate

        return aggregate(rest)
    if args.command in ("run", "backtest"):
        return _cmd_run(args, ["backtest", *rest] if args.command == "backtest" else rest)
    if args.command == "diamond":
        if not have_rich():
            return fail(f"detectorkit diamond is a dev tool: {NEEDS_DEV}")
        from detectorkit.devtools.diamond import main as diamond

        return diamond(rest)
    if args.command == "cluster":
        from detectorkit.devtools.cluster import main as cluster

        return cluster(rest)
    if args.command == "notify":
        from detectorkit.roles.notifier import Notifier

        return run_detector(Notifier(), rest, command="detectorkit notify")
    if args.command == "normalise":
        from detectorkit.roles.normaliser import NORMALISER

        return run_detector(NORMALISER, rest, command="detectorkit normalise")
    if args.command == "kafka-tool":
        return _cmd_kafka_tool(args.tool, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    commands = {
        "broker": _cmd_broker,
        "spark-archive": _cmd_spark_archive,
        "produce-sample": _cmd_produce_sample,
        "produce-raw": _cmd_produce_sample,
        "tail": _cmd_tail,
    }
    return commands[args.command](args)
