"""The `detectorkit` command line, and `run_detector`, which every generated service's script calls."""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from . import clients, logs
from . import settings as settings_mod
from .broker import ENGINES, BrokerError, EmbeddedBroker, start_broker
from .detector import Detector
from .settings import Settings, SettingsError

EXIT_FAILED = 1
EXIT_CONFIG = 2


def _fail(message: str, code: int = EXIT_CONFIG) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def check_kafka(settings: Settings) -> str | None:
    """None when the broker answers and the input topic exists; else what is wrong, in one line."""
    from confluent_kafka import KafkaError, KafkaException

    conf = clients.base(settings.kafka_bootstrap_servers, settings.kafka_options)
    timeout = settings.connect_timeout_seconds
    refused: list[str] = []

    def on_error(error) -> None:
        # A wrong password only ever shows here; the metadata request just sees a transport failure.
        if error.code() in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED):
            refused.append(error.str())

    admin = clients.new_admin({**conf, "log_level": 0, "error_cb": on_error})
    deadline = time.monotonic() + timeout
    while True:
        try:
            admin.list_topics(timeout=min(1.0, timeout))
            break
        except KafkaException as exc:
            admin.poll(0)  # serves error_cb
            if refused:
                return f"Kafka at {settings.kafka_bootstrap_servers} refused the credentials: {refused[-1]}"
            if time.monotonic() >= deadline:
                return f"cannot reach Kafka at {settings.kafka_bootstrap_servers} within {timeout:g} s ({exc.args[0].str()})"
    try:
        if settings.create_topics:
            wanted = {t: settings.topic_partitions for t in (settings.input_topic, settings.output_topic, settings.dlq_topic)}
            # One partition: the aggregator reads it as a table, and order per instance must hold.
            wanted[settings.metrics_topic] = 1
            clients.create_topics(conf, wanted, timeout)
        clients.topic_partitions(admin, settings.input_topic, timeout)
    except LookupError as exc:
        return f"{exc}; create it, or set CREATE_TOPICS=true"
    except KafkaException as exc:  # not authorised, above all: say so, never take it for "missing"
        return exc.args[0].str()
    return None


def run_detector(detector: Detector, argv: Sequence[str] | None = None, defaults: Mapping[str, Any] | None = None) -> int:
    """Run `detector` as a streaming job until SIGTERM/SIGINT (or idle, if configured). Exit code:
    0 after a graceful stop, 1 when the job failed, 2 when it could not start."""
    parser = argparse.ArgumentParser(prog=detector.name, description=f"Run the {detector.name} detector.")
    settings_mod.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        settings = settings_mod.load(args, defaults=defaults).for_service(detector.name)
        config = detector.load_config()
    except SettingsError as exc:
        return _fail(str(exc))
    log = logs.setup(settings.log_level, service=detector.name, instance=settings.instance_id)
    log.info("settings", **settings.safe_dict(), detector_config=repr(config))

    broker = None
    if not settings.kafka_bootstrap_servers:
        try:
            broker = EmbeddedBroker().start()
        except BrokerError as exc:
            return _fail(str(exc))
        settings = settings.model_copy(update={"kafka_bootstrap_servers": broker.bootstrap_servers, "create_topics": True})
        log.info("embedded broker started", bootstrap_servers=broker.bootstrap_servers)
    try:
        problem = check_kafka(settings)
        if problem:
            log.error("cannot start", error=problem)
            return _fail(problem)
        return _run(detector, settings, config, log)
    finally:
        if broker is not None:
            broker.stop()


def _run(detector: Detector, settings: Settings, config, log) -> int:
    from .job import DetectorJob
    from .spark import session

    stop = threading.Event()

    def on_signal(signum, _frame):
        log.info("stop requested", signal=signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    spark = session(settings.spark_master, detector.name)
    # SparkContext replaces the SIGINT handler with one that cancels every job at once; a Ctrl-C
    # must finish the batch in flight instead.
    signal.signal(signal.SIGINT, on_signal)
    job = DetectorJob(detector, settings, spark, config)
    try:
        job.start()
        idle = settings.stop_after_idle_seconds
        idle_since = None
        while not stop.is_set():
            if job.terminated(0.25):
                break
            if idle:
                # Idle means caught up and waiting: Spark's own status says so once the sources
                # are initialised, the first batches are done and no new record has arrived.
                idle_since = (idle_since or time.monotonic()) if job.caught_up() else None
                if idle_since and time.monotonic() - idle_since > idle:
                    log.info("stopping: no new records", idle_seconds=idle)
                    stop.set()
        job.stop()
        reason = job.error()
        if reason is not None:
            log.error("job failed", error=reason)
            return _fail(reason, EXIT_FAILED)
        st = job.stats
        log.info("job stopped", batches=st.batches, records=st.records, detections=st.detections,
                 dead_letters=dict(st.dead_letters))
        return 0
    finally:
        job.close()
        spark.stop()


# ---- the `detectorkit` command ---------------------------------------------------------------


def _cmd_broker(args) -> int:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        broker = start_broker(args.engine, port=args.port, data_dir=args.data_dir)
    except BrokerError as exc:
        return _fail(str(exc))
    try:
        print(broker.bootstrap_servers, flush=True)
        if args.topics:
            clients.create_topics(clients.base(broker.bootstrap_servers), {t: args.partitions for t in args.topics})
        while not stop.wait(0.5):
            if broker.process is None or broker.process.poll() is not None:
                return _fail(f"the {args.engine} broker exited", EXIT_FAILED)
        return 0
    finally:
        broker.stop()


def _cmd_kafka_tool(tool: str, rest: list[str]) -> int:
    from .kafka_broker import run_tool

    try:
        return run_tool(tool, rest).returncode
    except BrokerError as exc:
        return _fail(str(exc))


def _cmd_run(args, rest: list[str]) -> int:
    module_name, _, attr = args.detector.partition(":")
    try:
        detector = getattr(importlib.import_module(module_name), attr or "DETECTOR")
    except (ImportError, AttributeError) as exc:
        return _fail(f"cannot load detector {args.detector!r}: {exc}; use module.path:ATTRIBUTE")
    return run_detector(detector, rest)


def _cmd_produce_sample(args) -> int:
    from .samples import samples

    conf = clients.producer(clients.base(args.bootstrap_servers))
    if args.create:
        clients.create_topics(clients.base(args.bootstrap_servers), {args.topic: args.partitions})
    producer = clients.new_producer(conf)
    kinds: dict[str, int] = {}
    began = time.monotonic()
    for i, s in enumerate(samples(args.count, seed=args.seed, bad_every=args.bad_every)):
        producer.produce(args.topic, key=s.key, value=s.value)
        producer.poll(0)
        kinds[s.kind] = kinds.get(s.kind, 0) + 1
        if args.rate and i % 1000 == 999:
            ahead = (i + 1) / args.rate - (time.monotonic() - began)
            if ahead > 0:
                time.sleep(ahead)
    if producer.flush(30):
        return _fail("not every sample record was delivered", EXIT_FAILED)
    print(json.dumps({"topic": args.topic, "produced": args.count, "kinds": kinds}))
    return 0


def _cmd_tail(args) -> int:
    from .topic_reader import read_topic

    for message in read_topic(clients.base(args.bootstrap_servers), args.topic, timeout=args.timeout, limit=args.max):
        print(json.dumps(message), flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="detectorkit", description="Runtime of the detector services.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("broker", help="start a broker (the embedded Tansu, or Apache Kafka) and print its address")
    p.add_argument("--engine", choices=ENGINES, default="tansu",
                   help="tansu: embedded, in memory, starts at once (default); kafka: Apache Kafka (KRaft), jars from Maven Central")
    p.add_argument("--port", type=int, default=None, help="loopback port (default: a free one)")
    p.add_argument("--data-dir", default=None, help="kafka only: keep the log (and the address) here across restarts")
    p.add_argument("--topics", nargs="*", default=[], help="topics to create once it runs")
    p.add_argument("--partitions", type=int, default=8, help="partitions of each created topic")

    p = sub.add_parser("run", help="run a detector: detectorkit run --detector my_pkg.detector:DETECTOR [job flags]")
    p.add_argument("--detector", required=True, help="module.path:ATTRIBUTE of a detectorkit.Detector")

    for name, helptext in (("produce-sample", "write sample records (some bad) to a topic"), ("tail", "print a topic's records as JSON lines")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--bootstrap-servers", required=True)
        p.add_argument("--topic", required=True)
    p = sub.choices["produce-sample"]
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--bad-every", type=int, default=50, help="every N-th record is bad (0: none)")
    p.add_argument("--create", action="store_true", help="create the topic if missing")
    p.add_argument("--rate", type=float, default=None, help="records per second at most (default: as fast as it goes)")
    p.add_argument("--partitions", type=int, default=8)
    p = sub.choices["tail"]
    p.add_argument("--max", type=int, default=None, help="stop after this many records")
    p.add_argument("--timeout", type=float, default=10.0, help="give up reaching the end after this many seconds")

    sub.add_parser("aggregate", help="run the shared metrics-aggregator (detectorkit aggregate --help)", add_help=False)
    p = sub.add_parser("kafka-tool", help="run one of Apache Kafka's own tools, e.g. detectorkit kafka-tool consumer-groups --describe ...",
                       add_help=False)
    p.add_argument("tool", help="consumer-groups, topics, delete-records, get-offsets, transactions, console-consumer, ...")

    args, rest = parser.parse_known_args(argv)
    if args.command == "aggregate":
        from .aggregator_service import main as aggregate

        return aggregate(rest)
    if args.command == "run":
        return _cmd_run(args, rest)
    if args.command == "kafka-tool":
        return _cmd_kafka_tool(args.tool, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return {"broker": _cmd_broker, "produce-sample": _cmd_produce_sample, "tail": _cmd_tail}[args.command](args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
