"""A detector job: Spark tasks that read Kafka, detect and write to Kafka, offsets committed to Kafka.

Each batch of the query runs one slice (runtime.slices): a task per core reads the partitions this
instance owns, detects, writes and checkpoints until the slice's deadline or a rebalance, all in one
Python worker each; the driver commits the positions its tasks report to the consumer group as they
move, and the last ones when the slice ends. A graceful stop ends the slice in flight at its tasks'
next checkpoint, so its positions are committed too.

`StreamJob` is the face (start, stop, stats, health) over the driver's parts, each owning one concern:
  - `JobPlan` (runtime.job_plan): the settings turned once into the guarantee and what follows;
  - `PartitionOwner` (runtime.partition_owner): the consumer group's member, its hand-overs and start offsets;
  - `QueryRunner` (runtime.query_runner): the Spark query on a fresh checkpoint, and the batch lock;
  - `DriverCheckpoint` (runtime.driver_checkpoint): folding task results, commits, recommits and lag;
  - `Supervisor` (runtime.supervisor): restarts with backoff, permanent errors, the job's end;
  - `SliceDriver` (runtime.slice_driver): the slice each batch runs, and what its tasks report as
    they checkpoint.

The consumer group is the only record of the job's position. Spark's checkpoint is fresh for every
query (a temporary directory, or a per-instance one under CHECKPOINT_DIR that is emptied first): a
checkpoint kept from an earlier run would hold batches Spark thinks done whose offsets the group
never got, or the other way round, and Spark's log would win.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import Future
from typing import Any

import structlog

from detectorkit.detector import Detector
from detectorkit.kafka import broker_kind, clients, transactions
from detectorkit.kafka.access import KafkaAccess
from detectorkit.kafka.end_offsets import open_end_offsets
from detectorkit.kafka.membership import GroupMember
from detectorkit.kafka.source_options import SourceOptions
from detectorkit.metrics import build_info
from detectorkit.metrics.registry import JobMetrics
from detectorkit.metrics.reporter import MetricsReporter
from detectorkit.runtime import repartition
from detectorkit.runtime.driver_checkpoint import BatchResult, DriverCheckpoint, JobStats
from detectorkit.runtime.health import Progress
from detectorkit.runtime.job_plan import JobPlan
from detectorkit.runtime.partition_owner import PartitionOwner
from detectorkit.runtime.processing import warm_workers
from detectorkit.runtime.query_runner import QueryRunner
from detectorkit.runtime.slice_driver import SliceDriver
from detectorkit.runtime.stage import Relay, Stage, prepared
from detectorkit.runtime.supervisor import Supervisor
from detectorkit.runtime.task_context import TaskContext
from detectorkit.settings import Settings, SettingsError
from detectorkit.state import changelog
from detectorkit.state.changelog import StateContext

__all__ = ["BatchResult", "JobStats", "StreamJob"]

log = structlog.get_logger("detectorkit.job")


class StreamJob:
    """Start with `start()`, stop gracefully with `stop()`; `stats` tells what was processed."""

    @classmethod
    def of(cls, job: Detector | Stage, settings: Settings, spark, config: Any = None, **keeping: float) -> StreamJob:
        """The job of a detector or stage as written, its settings and config read here
        (runtime.stage.prepared); the command line reads them itself, once, and hands them over."""
        return cls(*prepared(job, settings, config), spark, **keeping)

    def __init__(self, stage: Stage, settings: Settings, config: Any, spark, client_idle_seconds: float = 60.0, state_idle_seconds: float = 600.0):
        """`stage`, `settings` and `config` as `runtime.stage.prepared` makes them. `spark`: a
        SparkSession, or a Future of one still starting: the group join and the Kafka set-up then
        run meanwhile (only the query waits for it). How long a worker keeps an unused Kafka client,
        and a state store no task uses (0: every task restores its state, as a new instance's)."""
        if not settings.kafka_bootstrap_servers:
            raise ValueError("settings.kafka_bootstrap_servers must be set (the command line starts the embedded broker)")
        self.stage, self.settings, self.config, self._spark = stage, settings, config, spark
        # Keys from a field (runtime.repartition): a feeder re-keys the input into a topic of the
        # job's own, which this job then reads from its first record.
        self._feeder: StreamJob | None = None
        field = self.stage.repartition_field
        if field is not None:
            s = self.settings
            topic = repartition.topic_of(s.consumer_group)
            feeder = s.model_copy(update={"output_topic": topic, "consumer_group": topic})
            self._feeder = StreamJob.of(repartition.RepartitionStage(f"{self.stage.name}-repartition", field), feeder, spark)
            self.settings = s.model_copy(update={"input_topic": topic, "starting_offsets": "earliest"})
        s = self.settings
        self._base = clients.base(s.kafka_bootstrap_servers, s.kafka_options)
        self.broker_kind = s.kafka_broker_kind
        self.stats = JobStats()
        self.metrics = JobMetrics(dead_letter_reasons=self.stage.reasons, build=build_info.versions(build_info.package_of(self.stage)))
        model = self.stage.model_info
        if model is not None:
            self.metrics.model_info.labels(model=model[0], version=model[1]).set(1)
        self.progress = Progress()  # for liveness: when a batch last completed
        self._leaving = threading.Event()
        self.supervisor = Supervisor(s.query_restart_attempts, s.query_restart_backoff_seconds, self.metrics.query_restarts, self._leaving)
        # Made at start, once the broker's kind is known.
        self.plan: JobPlan | None = None
        self._task: TaskContext | None = None
        self._committer: DriverCheckpoint | None = None
        self._runner: QueryRunner | None = None
        self._assignment: PartitionOwner | None = None
        self._member: GroupMember | None = None
        self._reporter: MetricsReporter | None = None
        self._relay: Relay | None = None
        self._serving: threading.Thread | None = None
        self._slices: SliceDriver | None = None
        self._source: SourceOptions | None = None  # what the query's tasks read (set when it starts)
        self._access: KafkaAccess | None = None
        self._local = True
        self.client_idle_seconds, self.state_idle_seconds = client_idle_seconds, state_idle_seconds

    @property
    def spark(self):
        """The SparkSession, once it has started."""
        if isinstance(self._spark, Future):
            self._spark = self._spark.result()
        return self._spark

    @property
    def query(self):
        """The query reading the partitions this instance owns; replaced when they change."""
        return None if self._runner is None else self._runner.query

    def make_plan(self) -> JobPlan:
        """The job's plan, the broker's kind resolved (detected once, if AUTO)."""
        if self.plan is None:
            self.broker_kind = broker_kind.resolve(self.broker_kind, self._base, self.settings.connect_timeout_seconds)
            if isinstance(self._spark, Future):
                master = self.settings.spark_master or "local"  # not waiting for the session to know it
            else:
                master = self._spark.sparkContext.master if self._spark is not None else "local"
            self._local = master.startswith("local")
            self.plan = JobPlan.of(self.stage, self.settings, broker_kind.profile(self.broker_kind), master)
        return self.plan

    def access(self) -> KafkaAccess:
        """How the job's workers reach Kafka: one object, which every part the tasks take holds."""
        if self._access is None:
            plan = self.make_plan()
            self._access = KafkaAccess(self._base, plan.group, plan.timeout, self.client_idle_seconds, self.broker_kind)
        return self._access

    def source_options(self) -> SourceOptions:
        s, plan = self.settings, self.make_plan()
        return SourceOptions(
            topic=plan.input_topic,
            access=self.access(),
            max_records_per_batch=s.max_records_per_batch,
            fail_on_data_loss=plan.fail_on_data_loss,
            claims_dir=plan.claims_dir,
        )

    def state_context(self) -> StateContext | None:
        state = self.stage.state
        if state is None:
            return None
        s, plan = self.settings, self.make_plan()
        return StateContext(
            topic=state.changelog_topic(plan.group),
            access=self.access(),
            idle_seconds=self.state_idle_seconds,
            idle_grace_seconds=s.timer_idle_grace_seconds,
            input_topic=plan.input_topic,
            isolation=plan.state_isolation,
            flush_interval_seconds=plan.flush_interval_seconds,
        )

    def start(self):
        """Join the group and start reading what it assigns; returns once the first assignment
        runs (the query, or None when the group gave this instance nothing) or the job failed."""
        s = self.settings
        timeout = s.connect_timeout_seconds
        plan = self.make_plan()
        if self._feeder is not None:
            self._start_feeder()
        if plan.exactly_once:
            try:
                transactions.check_broker(clients.producer(self._base), s.consumer_group, timeout)
            except transactions.TransactionError as exc:
                raise SettingsError(str(exc)) from None
        elif s.processing_guarantee == "auto":
            log.info("at-least-once: the embedded broker cannot hide aborted transactions; exactly-once runs on Apache Kafka")
        self._task = self._task_context(plan)
        # The first Python job of a session pays for starting the workers and their imports: done
        # now, it overlaps the group join instead of delaying the first batch.
        threading.Thread(target=self._warm_workers, name="warm-workers", daemon=True).start()
        self._prepare_topics()
        assignment = self._make_parts(plan)
        self._member.subscribe(assignment)
        log.info(
            "job started",
            input_topic=s.input_topic,
            output_topic=s.output_topic,
            dlq_topic=s.dlq_topic,
            consumer_group=s.consumer_group,
            group_instance_id=s.static_instance_id(),
            starting_offsets=s.starting_offsets,
            broker_kind=self.broker_kind,
            processing_guarantee=plan.guarantee.value,
            slice_seconds=plan.slice_seconds,
        )
        self._serving = threading.Thread(target=assignment.serve, name="consumer-group", daemon=True)
        self._serving.start()
        if not plan.exactly_once:
            threading.Thread(target=self._slices.commit_as_they_go, args=(self.supervisor.ended,), name="slice-commits", daemon=True).start()
        self.supervisor.ready.wait(timeout + s.group_session_timeout_seconds)
        return self.query

    def _task_context(self, plan: JobPlan) -> TaskContext:
        """What every task is handed: the stage, its config, where it writes, its state."""
        s = self.settings
        return TaskContext(
            service=self.stage.name,
            stage=self.stage,
            config=self.config,
            access=self.access(),
            output_topic=s.output_topic,
            dlq_topic=s.dlq_topic,
            log_level=s.log_level,
            log_context=(("service", plan.service), ("instance", plan.instance_id)),
            state=self.state_context(),
            exactly_once=plan.exactly_once,
            transaction_timeout_ms=int(plan.transaction_timeout_seconds * 1000),
            flush_timeout=max(60.0, plan.transaction_timeout_seconds),
        )

    def _prepare_topics(self) -> None:
        """The changelog (made, or with TOPICS_AS_CODE checked), what the stage prepares, its relay."""
        s, timeout = self.settings, self.settings.connect_timeout_seconds
        if self._task.state is not None:
            if s.topics_as_code:
                changelog.require(self._base, self._task.state.topic, s.input_topic, timeout)
            else:
                changelog.create(self._base, self._task.state.topic, s.input_topic, self.broker_kind, timeout)
        self.stage.prepare_job(self.config, s, self._base, self.broker_kind)
        relay = self.stage.relay(self.config, s, self._base, self.broker_kind, self._count_dead_letter, self.supervisor.fail)
        self._relay = None if relay is None else relay.start()

    def _make_parts(self, plan: JobPlan) -> PartitionOwner:
        """The driver's parts, each made with what it needs; the owner of the partitions, whose
        group member is yet to subscribe."""
        s, timeout = self.settings, self.settings.connect_timeout_seconds
        # Lag needs the true end, as the source plans it (ListOffsets gets it wrong on Tansu).
        ends = open_end_offsets(self.broker_kind, self._base, s.consumer_group, s.input_topic, timeout)
        self._member = member = GroupMember(
            self._base,
            s.consumer_group,
            s.input_topic,
            static_id=s.static_instance_id(),
            session_timeout=s.group_session_timeout_seconds,
            protocol=s.group_protocol,
            timeout=timeout,
        )
        self._committer = committer = DriverCheckpoint(plan, self.metrics, self.stats, member, ends, on_input_gone=self._end_slices)
        self._runner = runner = QueryRunner(lambda: self.spark, plan, self._on_batch, serve=self._serve_member, interrupt=self._end_slices)
        self._assignment = assignment = PartitionOwner(
            plan,
            self._base,
            runner,
            committer,
            self.supervisor,
            self.metrics,
            self.progress,
            self._leaving,
            start_query=self._start_query,
            member=member,
            ends=ends,
            state_topic=None if self._task.state is None else self._task.state.topic,
        )
        # The tasks report to, and are ended by, this process: on a cluster, at the driver's address.
        host = "127.0.0.1" if self._local else self.spark.conf.get("spark.driver.host")
        self._slices = SliceDriver(host, plan, committer, assignment.input_recreated, self._leaving)
        metrics_conf = clients.base(s.metrics_bootstrap_servers, s.kafka_options) if s.metrics_bootstrap_servers else self._base
        self._reporter = MetricsReporter(
            self.metrics,
            metrics_conf,
            s.metrics_topic,
            self.stage.name,
            s.instance_id,
            s.metrics_interval_seconds,
            before_report=self.maintain_offsets,
        ).start()
        return assignment

    def _start_feeder(self) -> None:
        """The repartition topic (made, or with TOPICS_AS_CODE checked), then the feeder reading
        into it; the job fails with it."""
        feeder, s = self._feeder, self.settings
        if s.topics_as_code:
            repartition.require(self._base, s.input_topic, feeder.settings.input_topic, s.connect_timeout_seconds)
        else:
            repartition.create(self._base, s.input_topic, feeder.settings.input_topic, s.connect_timeout_seconds)
        feeder.start()

        def watch() -> None:
            feeder.terminated(None)
            if feeder.error() is not None and not self._leaving.is_set():
                self.supervisor.fail(f"the repartition feeder failed: {feeder.error()}")

        threading.Thread(target=watch, name="repartition-feeder", daemon=True).start()

    def _warm_workers(self) -> None:
        try:
            warm_workers(self.spark, self._task)
        except Exception as exc:  # noqa: BLE001 - only an optimisation: the first batch starts them anyway
            if not self._leaving.is_set():
                log.warning("could not start the Python workers ahead of the first batch", error=str(exc).splitlines()[0])

    def _serve_member(self) -> None:
        if self._member is not None:
            self._member.serve()

    def _start_query(self, owned: frozenset[int], start: dict[int, int], metadata: bytes | None) -> None:
        self._source = dataclasses.replace(
            self.source_options(), partitions=sorted(owned), start_offsets=start, group_metadata=metadata.hex() if metadata else None
        )
        self._slices.starting_at(start)
        self._runner.start()

    def _slice_progress(self):
        """Where the running slice's tasks last said they were (None: no slice, or no report yet)."""
        return self._slices.progress() if self._slices is not None else None

    def _end_slices(self) -> None:
        if self._slices is not None:
            self._slices.end()

    # ---- batches (the query runner calls under its batch lock) ------------------------------------

    def _on_batch(self, frame, batch_id: int) -> None:
        started = time.monotonic()
        structlog.contextvars.bind_contextvars(batch=batch_id)
        try:
            if self._process(frame, batch_id, started).records:
                self.supervisor.progressed()
            self.progress.mark()
        finally:
            structlog.contextvars.unbind_contextvars("batch")

    def _process(self, frame, batch_id: int, started: float) -> BatchResult:
        """One batch, a slice: steps 1-6 ran in the tasks; 5 (at-least-once) and 7 in the committer (runtime.checkpoint)."""
        results = self._slices.run(self.spark, self._task, self._source)
        return self._committer.finish(batch_id, results, started)

    def _count_dead_letter(self, reason: str) -> None:
        """A dead letter of the stage's relay (a notification that could not be delivered)."""
        self.metrics.dead_letters.labels(reason=reason).inc()
        self.stats.dead_letters[reason] += 1

    def maintain_offsets(self) -> None:
        """Before each metrics report: lag, and now and then the positions committed again (DriverCheckpoint.maintain)."""
        if self._committer is not None:
            self._committer.maintain(self._runner.between_batches)
            progress = self._slice_progress()
            if progress is not None and progress.positions:
                # Where the tasks are, which may be ahead of the last commit.
                self._committer.show_positions(dict(progress.positions))

    def caught_up(self) -> bool:
        """True while nothing waits to be read: no batch running and no new record seen (also
        when the group gave this instance no partition); the feeder's too."""
        if self._feeder is not None and not self._feeder.caught_up():
            return False
        query, running = self.query, self._running()
        if running is not None and not running:
            return True
        if query is None or running is None:
            return False
        # The tasks say which partitions they have read to the end, at every checkpoint.
        progress = self._slice_progress()
        return progress is not None and running <= progress.at_end

    def _running(self) -> frozenset[int] | None:
        return None if self._assignment is None else self._assignment.running

    # ---- health (runtime.health asks) -------------------------------------------------------------

    def is_reading(self) -> bool:
        """Joined and reading what the group gave it: its query runs, or it was given nothing (and
        its feeder too)."""
        if self._feeder is not None and not self._feeder.is_reading():
            return False
        running, query = self._running(), self.query
        return running is not None and (not running or (query is not None and query.isActive))

    def seconds_since_progress(self) -> float:
        """Since a batch last completed, or a slice's task last checkpointed."""
        seconds = self.progress.seconds()
        if self._slices is not None:  # (none before the job starts)
            seconds = min(seconds, self._slices.seconds_since_report())
        if self._feeder is not None:
            seconds = max(seconds, self._feeder.seconds_since_progress())  # the one that stands still
        return seconds

    def records_waiting(self) -> int:
        """The lag of the partitions it owns, as last measured (each batch, each metrics report),
        and its feeder's."""
        return self.metrics.lag_total() + (self._feeder.records_waiting() if self._feeder is not None else 0)

    def terminated(self, timeout: float) -> bool:
        """Wait up to `timeout` s; True once the job has ended, failed or not (see `error()`)."""
        return self.supervisor.ended.wait(timeout)

    def error(self) -> str | None:
        """Why the job failed, in one line; None while it runs or after a clean stop."""
        return self.supervisor.failure

    def stop(self, timeout: float = 120.0) -> None:
        """Finish the batch in flight (its offsets get committed), stop the query, then leave the
        group, so the partitions' next owner starts exactly after what was committed. If the batch
        takes longer than `timeout`, the query is stopped under it: its tasks are cancelled and
        its offsets not committed, so the next owner reads it again. A feeder stops first: what it
        committed is in its topic, for whoever reads it next."""
        self._leaving.set()
        if self._feeder is not None:
            self._feeder.stop(timeout)
        if self._serving is not None and self._serving is not threading.current_thread():
            # It may be handing partitions over: a batch's worth of waiting at most.
            self._serving.join(timeout + 120.0)
        if self._assignment is not None:
            self._assignment.stop_query(timeout)
            self._assignment.running = None
        self._stop_relay(timeout)
        if self._member is not None:
            # Waiting for the batch in flight made this thread the group's server; it is about to
            # wait for the metrics reporter, which may need the group for its last report.
            self._member.stop_serving()
        self.close()
        self.supervisor.ended.set()

    def _stop_relay(self, timeout: float) -> None:
        """After the last batch: the relay delivers what it committed, then leaves its group."""
        relay, self._relay = self._relay, None
        if relay is not None:
            relay.stop(timeout)

    def close(self, timeout: float = 120.0) -> None:
        if self._feeder is not None:
            self._feeder.close(timeout)
        self._stop_relay(min(timeout, 10.0))  # a job that failed: what is delivered now is the next one's to skip
        if self._reporter is not None:
            try:
                self._reporter.stop()  # the last snapshot, with the last batch in it
            except Exception:  # noqa: BLE001 - a failed report must not hide how the job ended
                log.exception("final metrics report failed")
            self._reporter = None
        self._leaving.set()
        if self._runner is None:
            self._close_clients()
        else:
            # Nothing is closed under a running batch.
            self._runner.after_batch(self._close_clients, timeout)

    def _close_clients(self) -> None:
        if self._slices is not None:
            self._slices.close()
        if self._member is not None:
            self._member.close()  # revokes what is left: nothing runs, so nothing waits
            self._member = None
        if self._committer is not None:
            self._committer.close()
