"""A detector job: Kafka source whose tasks detect and write to the Kafka sink, offsets committed to Kafka.

Each micro-batch runs in `foreachBatch`: the source's tasks read their planned offset ranges, detect
and write (flushing their producers), all in one Python worker each (kafka.source.task_source); the
driver collects their summaries and commits the batch's end offsets to the consumer group before the
batch returns. A graceful stop waits for the batch in flight, so its offsets are committed too.

Instances of a service share its input through the consumer group (`membership`): the query reads
exactly the partitions this instance owns, from the group's committed offsets. When they change, the
query is stopped after its batch in flight (written and committed) and started again on the new
set; revoked partitions are released only then, so the next owner starts where this one stopped.

The consumer group is the only record of the job's position. Spark's checkpoint is fresh for every
query (a temporary directory, or a per-instance one under CHECKPOINT_DIR that is emptied first): a
checkpoint kept from an earlier run would hold batches Spark thinks done whose offsets the group
never got, or the other way round, and Spark's log would win.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import structlog
from confluent_kafka import KafkaException

from detectorkit.detector import Detector
from detectorkit.kafka import broker_kind, clients, offset_store, transactions
from detectorkit.kafka.end_offsets import EndOffsetProbe, ListOffsetsEnds, open_end_offsets, start_positions
from detectorkit.kafka.membership import CommitRefused, GroupMember
from detectorkit.kafka.planning import DataLossError
from detectorkit.kafka.source import NAME as SOURCE_NAME
from detectorkit.kafka.source import task_source
from detectorkit.kafka.source_options import SourceOptions
from detectorkit.metrics.registry import LATENCY_BUCKETS, JobMetrics
from detectorkit.metrics.reporter import MetricsReporter
from detectorkit.runtime.health import Progress
from detectorkit.runtime.processing import SUMMARY_SCHEMA, process_in_driver, process_planned, warm_worker
from detectorkit.runtime.stage import Stage, as_stage
from detectorkit.runtime.supervisor import describe, explain, is_permanent
from detectorkit.runtime.task_context import TaskContext
from detectorkit.settings import Settings, SettingsError
from detectorkit.state import changelog
from detectorkit.state.changelog import StateContext

log = structlog.get_logger("detectorkit.job")

RESTART_BACKOFF_CAP_SECONDS = 30.0


@dataclass
class BatchResult:
    batch_id: int
    records: int
    detections: int
    dead_letters: Counter
    committed: dict[int, int]
    seconds: float


@dataclass
class JobStats:
    batches: int = 0
    records: int = 0
    detections: int = 0
    dead_letters: Counter = field(default_factory=Counter)
    last: BatchResult | None = None


class StreamJob:
    """Start with `start()`, stop gracefully with `stop()`; `stats` tells what was processed."""

    def __init__(self, stage: Detector | Stage, settings: Settings, spark, config: Any = None):
        if not settings.kafka_bootstrap_servers:
            raise ValueError("settings.kafka_bootstrap_servers must be set (the command line starts the embedded broker)")
        self.stage = as_stage(stage)
        # The command line specialises and logs them once; only a caller that has not gets them filled here.
        self.settings = settings if settings.consumer_group and settings.dlq_topic else settings.for_service(self.stage.name)
        self.spark = spark
        self.config = self.stage.load_config() if config is None else config
        self.stats = JobStats()
        # The query reading the partitions this instance owns; replaced when they change.
        self.query = None
        self._running: frozenset[int] | None = None  # what `query` reads; None: nothing runs
        # A batch of a query whose token is no longer current is skipped: that query is stopping.
        self._token = 0
        # Held while a batch runs: a stop or a hand-over waits for it, and nothing is closed under it.
        self._lock = threading.Lock()
        self._checkpoint: str | None = None
        s = self.settings
        self._base = clients.base(s.kafka_bootstrap_servers, s.kafka_options)
        self.broker_kind = s.kafka_broker_kind
        self._member: GroupMember | None = None
        self._admin = None  # a stateful job's, for the metadata request of each assignment
        self._metadata: bytes | None = None  # with exactly-once: the group metadata the query's tasks commit with
        self._ends: ListOffsetsEnds | EndOffsetProbe | None = None
        self._reporter: MetricsReporter | None = None
        self.metrics = JobMetrics(dead_letter_reasons=self.stage.reasons)
        # Serialises the group commits of batches with the periodic refresh, the lag reading and
        # the hand-over of partitions; `_committable` is what a batch may still commit.
        self._offsets_lock = threading.Lock()
        self._committable: set[int] = set()
        self._committed_at = time.monotonic()
        # With a state flush interval: how far each partition's changelog reflects the input, committed
        # with its offset (kafka.offset_store.durable_metadata); the tasks report it as they flush.
        self._durable: dict[int, int] = {}
        self._leaving = threading.Event()
        self._ready = threading.Event()  # the first assignment is applied (or the job failed)
        self._ended = threading.Event()
        self._failure: str | None = None
        self._failures = 0  # query failures in a row: since the last batch that processed records
        self._serving: threading.Thread | None = None
        self.progress = Progress()  # for liveness: when a batch last completed
        # How long a worker keeps an unused Kafka client (tests shorten it).
        self.client_idle_seconds = 60.0
        # How long a worker keeps a state store no task uses (0: every task restores its state, as tests do).
        self.state_idle_seconds = 600.0

    def source_options(self) -> SourceOptions:
        s = self.settings
        return SourceOptions(
            topic=s.input_topic,
            client_conf=self._base,
            group=s.consumer_group,
            max_records_per_batch=s.max_records_per_batch,
            fail_on_data_loss=s.fail_on_data_loss,
            timeout=s.connect_timeout_seconds,
            max_tasks=max(1, self.spark.sparkContext.defaultParallelism),
            min_task_records=s.min_records_per_task,
            broker_kind=self.broker_kind,
            client_idle_seconds=self.client_idle_seconds,
            tick_seconds=self._tick_seconds(),
            marks_caught_up=self._flushes_per_interval(),
            claims_dir=self._claims_dir(),
        )

    def _claims_dir(self) -> str | None:
        """Where a stateful batch's tasks claim their partitions (kafka.claims), when they all run on
        this machine: Spark in local mode. On a cluster each task runs the ranges it was planned."""
        if (self.stage.state is None and not self.settings.exactly_once) or not self.spark.sparkContext.master.startswith("local"):
            return None
        return os.path.join(tempfile.gettempdir(), "detectorkit-claims", f"{self.settings.consumer_group}-{os.getpid()}")

    def _tick_seconds(self) -> float | None:
        """How often the source plans a batch with nothing to read, for the timers of quiet partitions."""
        if not self.stage.ticks:
            return None
        return max(0.5, min(10.0, self.settings.timer_idle_grace_seconds / 4))

    def _fresh_checkpoint(self) -> str:
        """A checkpoint directory that holds nothing: the group's offsets are the only position."""
        s = self.settings
        if s.checkpoint_dir is None:
            return tempfile.mkdtemp(prefix=f"{self.stage.name}-checkpoint-")
        # Per instance, so instances sharing CHECKPOINT_DIR never empty each other's.
        path = os.path.join(s.checkpoint_dir, re.sub(r"[^\w.-]", "_", s.instance_id))
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        return path

    def start(self):
        """Join the group and start reading what it assigns; returns once the first assignment
        runs (the query, or None when the group gave this instance nothing) or the job failed."""
        s = self.settings
        timeout = s.connect_timeout_seconds
        self.broker_kind = broker_kind.resolve(self.broker_kind, self._base, timeout)
        if s.exactly_once:
            self._check_exactly_once()
        self._task = TaskContext(
            service=self.stage.name,
            stage=self.stage,
            config=self.config,
            producer_conf=clients.producer(self._base),
            output_topic=s.output_topic,
            dlq_topic=s.dlq_topic,
            client_idle_seconds=self.client_idle_seconds,
            log_level=s.log_level,
            log_context=(("service", self.stage.name), ("instance", s.instance_id)),
            state=self._state_context(),
            exactly_once=s.exactly_once,
            transaction_timeout_ms=int(s.transaction_timeout_seconds * 1000),
            flush_timeout=max(60.0, s.transaction_timeout_seconds),
        )
        self._format = SOURCE_NAME  # a stage that runs in the driver gets the planned ranges and reads them itself
        if not self.stage.runs_in_driver:
            # The source's tasks read, detect and write themselves: one Python worker per task.
            self._format = f"{SOURCE_NAME}-{self.stage.name}-{uuid.uuid4().hex[:12]}"
            self.spark.dataSource.register(task_source(self._format, SUMMARY_SCHEMA, partial(process_planned, self._task)))
        # The first Python job of a session pays for starting the workers and their imports
        # (6.5 s measured on 2 cores); done now, it overlaps the group join instead of delaying
        # the first batch.
        threading.Thread(target=self._warm_workers, name="warm-workers", daemon=True).start()
        if self._task.state is not None:
            changelog.create(self._base, self._task.state.topic, s.input_topic, self.broker_kind, timeout)
        self.stage.prepare_job(self.config, s, self._base, self.broker_kind)
        # Lag needs the true end, as the source plans it (ListOffsets gets it wrong on Tansu).
        self._ends = open_end_offsets(self.broker_kind, self._base, s.consumer_group, s.input_topic, timeout)
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
        self._member = GroupMember(
            self._base,
            s.consumer_group,
            s.input_topic,
            self,
            static_id=s.static_instance_id(),
            session_timeout=s.group_session_timeout_seconds,
            protocol=s.group_protocol,
            timeout=timeout,
        ).subscribe()
        log.info(
            "job started",
            input_topic=s.input_topic,
            output_topic=s.output_topic,
            dlq_topic=s.dlq_topic,
            consumer_group=s.consumer_group,
            group_instance_id=s.static_instance_id(),
            starting_offsets=s.starting_offsets,
            broker_kind=self.broker_kind,
        )
        self._serving = threading.Thread(target=self._serve_group, name="consumer-group", daemon=True)
        self._serving.start()
        self._ready.wait(timeout + s.group_session_timeout_seconds)
        return self.query

    def _check_exactly_once(self) -> None:
        """PROCESSING_GUARANTEE=exactly-once only where it holds; SettingsError in one line otherwise."""
        if self.broker_kind == broker_kind.TANSU:
            raise SettingsError(
                "PROCESSING_GUARANTEE=exactly-once needs Apache Kafka: the embedded broker (Tansu) shows aborted transactions "
                "to read_committed consumers, so nothing written there can be exactly once; use at-least-once with it"
            )
        try:
            transactions.check_broker(clients.producer(self._base), self.settings.consumer_group, self.settings.connect_timeout_seconds)
        except transactions.TransactionError as exc:
            raise SettingsError(str(exc)) from None

    def _state_context(self) -> StateContext | None:
        state = self.stage.state
        if state is None:
            return None
        s = self.settings
        return StateContext(
            state.changelog_topic(s.consumer_group),
            self._base,
            s.connect_timeout_seconds,
            self.state_idle_seconds,
            s.timer_idle_grace_seconds,
            s.input_topic,
            "read_committed" if s.exactly_once else "read_uncommitted",
            # Exactly-once commits a partition's changes with its offset in each batch's transaction;
            # Tansu keeps no metadata with a committed offset, where the changelog's position goes.
            # A stage in the driver delivers what its changes say was sent (after_flush): every batch.
            0.0 if s.exactly_once or self.broker_kind == broker_kind.TANSU or self.stage.runs_in_driver else s.state_flush_interval_seconds,
        )

    def _warm_workers(self) -> None:
        n = max(1, self.spark.sparkContext.defaultParallelism)
        try:
            self.spark.range(0, n, 1, n).mapInArrow(partial(warm_worker, self._task), "id long").collect()
        except Exception as exc:  # noqa: BLE001 - only an optimisation: the first batch starts them anyway
            if not self._leaving.is_set():
                log.warning("could not start the Python workers ahead of the first batch", error=str(exc).splitlines()[0])

    # ---- the group: what this instance reads ------------------------------------------------------

    def _serve_group(self) -> None:
        member = self._member
        try:
            while not self._leaving.is_set() and not self._ended.is_set():
                member.poll(0.2)  # rebalance callbacks, and `release`, run in here
                if member.fatal:
                    self._fail(member.fatal)
                    return
                if member.joined and self._needs_query(member) and not self._leaving.is_set():
                    try:
                        self._apply(member.owned)
                    except Exception as exc:  # noqa: BLE001 - classified by _recover: retried, or the job fails
                        if not self._recover(describe(exc)):
                            return
                        continue
                if member.joined:
                    self._ready.set()
                reason = self._query_failure()
                if reason is not None and not self._recover(reason):
                    return
        except Exception as exc:  # noqa: BLE001 - whatever it is, the job has failed and must say why
            self._fail(describe(exc))

    def _needs_query(self, member: GroupMember) -> bool:
        """A query must start on what the group gave: another set of partitions, or, with
        exactly-once, the same set under a new generation (the tasks commit with the group's
        metadata, which the broker refuses once its generation is over)."""
        if self._running != member.owned:
            return True
        return self.settings.exactly_once and bool(self._running) and member.group_metadata() != self._metadata

    def _recover(self, reason: str) -> bool:
        """The query died, or could not start: start it again after a backoff, from the group's
        committed offsets, so what the failed batch wrote is written again, as after a crash.
        False once the job has failed instead: an error no restart mends, or one that persists."""
        self._failures += 1
        attempts = self.settings.query_restart_attempts
        if is_permanent(reason):
            self._fail(reason)
            return False
        if self._failures > attempts:
            self._fail(f"{reason} (the query failed {self._failures} times in a row; QUERY_RESTART_ATTEMPTS={attempts})")
            return False
        delay = min(RESTART_BACKOFF_CAP_SECONDS, self.settings.query_restart_backoff_seconds * 2 ** (self._failures - 1))
        self.metrics.query_restarts.labels(error=reason.split(":", 1)[0]).inc()
        log.warning(
            "query failed; restarting it from the group's committed offsets",
            error=reason,
            attempt=self._failures,
            attempts=attempts,
            retry_in_seconds=delay,
        )
        self._running = None  # a dead query reads nothing: the serving loop starts one again
        self._stop_query()
        self._leaving.wait(delay)
        return True

    def _query_failure(self) -> str | None:
        """Why the query this instance runs has died; None while it runs, or when none does."""
        query = self.query
        if query is None or query.isActive or self._running is None:
            return None
        exc = query.exception()
        return explain(exc) if exc is not None else "the query stopped by itself"

    def _fail(self, reason: str) -> None:
        log.error("job failed", error=reason)
        self._failure = self._failure or reason
        self._ended.set()
        self._ready.set()

    def _apply(self, owned: frozenset[int]) -> None:
        """Read exactly `owned`, each from the group's committed offset."""
        self._check_state_partitions(owned)
        began = self._member.changed_at
        before = self._running or frozenset()
        self._stop_query()
        if owned:
            start = self._start_offsets(owned)
            if self._leaving.is_set():
                # Stopped meanwhile (a member is given partitions until it leaves): a query started
                # now would plan its first batch while the stop waits for it. The next owner starts
                # from the same committed offsets.
                return
            self._start_query(owned, start)
        self._running = owned
        self.progress.mark()  # a new query has had no chance to complete a batch yet
        seconds = time.monotonic() - began
        self.metrics.set_assignment(owned, seconds)
        log.info(
            "partitions assigned",
            partitions=sorted(owned),
            gained=sorted(owned - before),
            handover_seconds=round(seconds, 3),
            member_id=self._member.member_id(),
        )

    def _check_state_partitions(self, owned: frozenset[int]) -> None:
        """Partitions added to the input while a stateful job runs reach it here: their state would
        be restored from changelog partitions that do not exist (a timeout, restarts, then a
        misleading error), and their keys' state is in other partitions. SettingsError instead, a
        permanent failure in one line, before anything stops; one metadata request an assignment."""
        if not owned or self._task.state is None:
            return
        if self._admin is None:
            self._admin = clients.new_admin(self._base)
        state = self._task.state
        changelog.check_assignment(self._admin, state.topic, self.settings.input_topic, owned, self.settings.connect_timeout_seconds)

    def release(self, partitions: set[int], lost: bool) -> None:
        """The group takes `partitions` away (see membership.Owner). Revoked: the batch in flight
        finishes and commits them first. Lost: another member may already read them, so nothing of
        theirs is committed any more."""
        began = time.monotonic()
        if lost:
            with self._offsets_lock:
                self._committable -= partitions
        if self._running and self._running & partitions:
            self._stop_query()
            self._running = None
        with self._offsets_lock:
            self._committable -= partitions
            self.metrics.forget_partitions(partitions)
        log.info("partitions released", partitions=sorted(partitions), lost=lost, handover_seconds=round(time.monotonic() - began, 3))

    def _start_offsets(self, owned: frozenset[int]) -> dict[int, int]:
        s = self.settings
        if s.exactly_once:
            # What a killed owner left open is aborted first, so the offsets read next are stable.
            timeout_ms = int(s.transaction_timeout_seconds * 1000)
            transactions.fence(clients.producer(self._base), s.consumer_group, s.input_topic, sorted(owned), timeout_ms, s.connect_timeout_seconds)
        commits = self._member.commits(owned)  # the offsets, and with a flush interval where the changelog is
        committed = {p: c.offset for p, c in commits.items()}
        policy = s.starting_offsets
        if any(o is None for o in committed.values()) and policy != "earliest":
            # STARTING_OFFSETS is for the service's first start. Once the group holds a position
            # anywhere in the topic, a partition without one is new (added to the topic): all of
            # its records arrived after the service started, so it is read from its first.
            others = set(self._ends.topic_partitions()) - set(owned)
            if any(o is not None for o in self._member.committed(others).values()):
                policy = "earliest"
        start = start_positions(self._ends, committed, policy, s.input_topic, s.consumer_group)
        # Without metadata (a new partition, or committed by a version that wrote the changelog every
        # batch) the changelog reflects the input up to the committed offset.
        if self._flushes_per_interval():
            self._durable.update({p: start[p] if commits[p].durable is None else commits[p].durable for p in owned})
        # Recorded at once, so a restart before any record arrives starts here too instead of at a
        # later "latest" that would skip what came in between.
        self._member.commit({p: o for p, o in start.items() if committed.get(p) is None})
        return start

    def _start_query(self, owned: frozenset[int], start: dict[int, int]) -> None:
        s = self.settings
        token = self._token
        checkpoint = self._checkpoint = self._fresh_checkpoint()
        self._metadata = self._member.group_metadata() if s.exactly_once else None
        self._source = dataclasses.replace(
            self.source_options(), partitions=sorted(owned), start_offsets=start, group_metadata=self._metadata.hex() if self._metadata else None
        )
        stream = self.spark.readStream.format(self._format).options(**self._source.to_options()).load()
        writer = (
            stream.writeStream.foreachBatch(partial(self._on_batch, token))
            .option("checkpointLocation", checkpoint)
            .queryName(f"{self.stage.name}-{token}")
        )
        if s.trigger_interval_seconds > 0:
            writer = writer.trigger(processingTime=f"{s.trigger_interval_seconds} seconds")
        with self._offsets_lock:
            self._committable = set(owned)
        self.query = writer.start()

    def _stop_query(self, timeout: float = 120.0) -> None:
        """Stop the query after its batch in flight. If that batch takes longer than `timeout`, the
        query is stopped under it: its tasks are cancelled and its offsets not committed."""
        if self.query is None:
            return
        reason = self._query_failure()
        if reason is not None and is_permanent(reason):
            # It died before the serving loop saw it: when the group takes the partitions away
            # for the same cause (a deleted topic), its error must not go with them.
            self._fail(reason)
        elif reason is not None:
            log.warning("query had failed; what this instance still owns starts again", error=reason)
        if self._acquire_serving(timeout):
            self._token += 1  # later batches of this query are skipped, and never committed
            self._lock.release()
        else:
            log.warning("batch in flight did not finish in time; cancelling it", timeout=timeout)
            self._token += 1
            with self._offsets_lock:
                self._committable = set()
        self.query.stop()
        # Cancelled, the batch's callback returns soon: wait for it before anything is closed.
        if self._acquire_serving(max(timeout, 120.0)):
            self._lock.release()
        self.query = None
        if self._checkpoint:
            shutil.rmtree(self._checkpoint, ignore_errors=True)
            self._checkpoint = None

    def _acquire_serving(self, timeout: float) -> bool:
        """The batch lock, serving the group's calls meanwhile: the batch in flight waits for its
        commit to run on this thread when this is the group's thread (a hand-over)."""
        deadline = time.monotonic() + timeout
        while not self._lock.acquire(timeout=0.05):
            if self._member is not None:
                self._member.serve()
            if time.monotonic() > deadline:
                return False
        return True

    # ---- batches ----------------------------------------------------------------------------------

    def _on_batch(self, token: int, frame, batch_id: int) -> None:
        with self._lock:
            if token != self._token:
                # Not committed, so the partitions' next reader reads these records again; Spark
                # records the batch as done, which is harmless since no query reuses a checkpoint.
                return
            started = time.monotonic()
            structlog.contextvars.bind_contextvars(batch=batch_id)
            try:
                if self._process(frame, batch_id, started).records:
                    self._failures = 0
                self.progress.mark()
            finally:
                structlog.contextvars.unbind_contextvars("batch")

    def _process(self, frame, batch_id: int, started: float) -> BatchResult:
        """One batch: the driver's steps of the commit sequence (runtime.checkpoint)."""
        # 1-5 in the tasks (or, for a stage that runs in the driver, here, with 6: its after_flush).
        if self.stage.runs_in_driver:
            rows = process_in_driver(self._task, self._source, frame)
        else:
            rows = frame.collect()  # the source's tasks have read, detected and written
        committed: dict[int, int] = {}
        records = detections = 0
        dead = Counter()
        latency_counts = [0] * (len(LATENCY_BUCKETS) + 1)
        latency_sum = 0.0
        # A task some of whose transactions failed reports the others (checkpoint.CommitsFailed).
        failed = [row.error for row in rows if row.error]
        for row in rows:
            if row.partition >= 0:  # -1: the error of a task none of whose transactions committed
                committed[row.partition] = max(committed.get(row.partition, -1), row.next_offset)
            records += row.records
            detections += row.detections
            dead.update(json.loads(row.dead_letters))
            latency_counts = [a + b for a, b in zip(latency_counts, json.loads(row.latency_counts), strict=True)]
            latency_sum += row.latency_sum
            self.metrics.executors.update(json.loads(row.processes))
            if row.state:
                state = json.loads(row.state)
                self.metrics.record_state(row.partition, state)
                if "durable" in state:
                    self._durable[row.partition] = max(self._durable.get(row.partition, -1), state["durable"])
        collected = time.monotonic()
        if failed:
            # What committed is counted; the batch fails, and the query starts again from the
            # group's offsets, where the failed partitions' records are read again.
            self._count(BatchResult(batch_id, records, detections, dead, committed, collected - started), latency_counts, latency_sum)
            raise transactions.TransactionError(failed[0])
        # 7. every task has flushed: the output and the state's changes are written, so the position may move.
        self._commit(committed)
        commit_seconds = time.monotonic() - collected
        # 8. what the batch did.
        result = BatchResult(batch_id, records, detections, dead, committed, time.monotonic() - started)
        self._count(result, latency_counts, latency_sum)
        self.stats.batches += 1
        self.stats.last = result
        if records:
            log.info(
                "batch done",
                records=records,
                detections=detections,
                dead_letters=dict(dead),
                committed={str(k): v for k, v in committed.items()},
                seconds=round(result.seconds, 3),
                tasks_seconds=round(collected - started, 3),
                commit_seconds=round(commit_seconds, 3),
            )
        return result

    def _count(self, result: BatchResult, latency_counts: list[int], latency_sum: float) -> None:
        """What the batch's tasks wrote, into the metrics and the stats: also for a batch that
        fails after some of its transactions committed, whose records are not read again."""
        self.metrics.record_batch(result.records, result.detections, result.dead_letters, result.seconds, latency_counts, latency_sum)
        st = self.stats
        st.records += result.records
        st.detections += result.detections
        st.dead_letters.update(result.dead_letters)

    def _commit(self, committed: dict[int, int]) -> None:
        """The batch's end offsets, for the partitions this instance still owns. With exactly-once
        the tasks have committed them in their transactions: only the lag is measured here."""
        exactly_once = self.settings.exactly_once
        with self._offsets_lock:
            mine = {p: o for p, o in committed.items() if p in self._committable}
        if mine != committed and not exactly_once:
            log.warning("not committing partitions this instance no longer owns", partitions=sorted(set(committed) - set(mine)))
        # Not under the offsets lock: the commit runs on the group's thread, which may be handing
        # partitions over and take that lock.
        try:
            try:
                if not exactly_once:
                    self._member.commit(mine, self._durable_metadata(mine))
            except CommitRefused as exc:
                # A zombie: the group moved on while this instance was away. The output is written
                # (the new owner writes it again), the group's offsets stay where the owner put them.
                log.warning(
                    "offsets not committed: the group gave these partitions to another member", partitions=sorted(mine), error=exc.args[0].str()
                )
                mine = {}
            with self._offsets_lock:
                if mine:
                    self._committed_at = time.monotonic()
                    self.metrics.set_offsets(mine, self._ends.end_offsets(mine))
        except (LookupError, KafkaException) as exc:
            if not clients.is_not_there(exc):
                raise
            # Deleted after the batch was planned: a deletion like any other. When skipping,
            # the source waits for the topic to come back.
            problem = f"topic {self.settings.input_topic!r} was deleted while the job read it"
            if self.settings.fail_on_data_loss:
                raise DataLossError(f"{problem}. Some records may never have been processed. Set FAIL_ON_DATA_LOSS=false to skip ahead.") from None
            log.warning("skipping lost records", problem=problem)

    def _durable_metadata(self, offsets: dict[int, int]) -> dict[int, str] | None:
        """The metadata of a commit of `offsets`: where each partition's changelog is (a commit
        without it would make the next owner take the changelog as reflecting the whole input)."""
        if not self._flushes_per_interval():
            return None
        return {p: offset_store.durable_metadata(self._durable[p]) for p in offsets if p in self._durable}

    def _flushes_per_interval(self) -> bool:
        """The tasks write state changes once an interval (StateContext.flush_interval_seconds)."""
        return self._task is not None and self._task.state is not None and self._task.state.flush_interval_seconds > 0

    def maintain_offsets(self) -> None:
        """Called before each metrics report: lag of every partition the instance owns, also while
        no batch runs; and, every COMMIT_REFRESH_SECONDS, the group's positions committed again.

        Kafka deletes a group's offsets once they are older than offsets.retention.minutes (7 days
        by default) and the group has had no member for that long; committing the same positions
        again now and then costs nothing and keeps a quiet partition's position safe either way."""
        member = self._member
        with self._offsets_lock:
            partitions = sorted(self._committable)
        if member is None or self._ends is None or not partitions:
            return
        try:
            if time.monotonic() - self._committed_at >= self.settings.commit_refresh_seconds and self._may_recommit():
                try:
                    known = member.recommit(partitions)  # the same positions: only their commit time moves
                finally:
                    if self.settings.exactly_once:
                        self._lock.release()
                self._committed_at = time.monotonic()
                log.info("positions committed again", partitions=len(known))
            else:
                known = {p: o for p, o in member.committed(partitions).items() if o is not None}
            with self._offsets_lock:
                known = {p: o for p, o in known.items() if p in self._committable}
                if known and self._ends is not None:
                    self.metrics.set_offsets(known, self._ends.end_offsets(known))
        except CommitRefused:
            pass  # being handed over: the new owner commits them
        except (LookupError, KafkaException) as exc:
            if not clients.is_not_there(exc):
                raise
            # A deleted input topic: the source and the batches say so; there is no lag to tell.

    def _may_recommit(self) -> bool:
        """With exactly-once the tasks commit, outside the driver: a recommit may only run while no
        batch does (else it could write back a position a task's transaction has just moved on);
        the batch lock is then held until it is done."""
        return not self.settings.exactly_once or self._lock.acquire(blocking=False)

    def caught_up(self) -> bool:
        """True while nothing waits to be read: no batch running and no new record seen (also
        when the group gave this instance no partition)."""
        query = self.query
        if self._running is not None and not self._running:
            return True
        if query is None or self._running is None:
            return False
        # Spark asks the source for new records every few milliseconds, so isTriggerActive is true
        # most of the time even when idle; isDataAvailable only turns true when a trigger finds
        # records and stays false between empty triggers. Before the first trigger it is false
        # too: lastProgress tells that one apart.
        if query.lastProgress is None:
            return False
        if not query.status["isDataAvailable"]:
            return True
        # A stage with timers gets a batch with nothing to read every few seconds (a tick): one
        # running while the last batch read nothing and nothing is left to read is no new record.
        last = self.stats.last
        return self.stage.ticks and last is not None and last.records == 0 and self.metrics.lag_total() == 0

    # ---- health (runtime.health asks) -------------------------------------------------------------

    def is_reading(self) -> bool:
        """Joined and reading what the group gave it: its query runs, or it was given nothing."""
        running, query = self._running, self.query
        return running is not None and (not running or (query is not None and query.isActive))

    def seconds_since_progress(self) -> float:
        return self.progress.seconds()

    def records_waiting(self) -> int:
        """The lag of the partitions it owns, as last measured (each batch, each metrics report)."""
        return self.metrics.lag_total()

    def terminated(self, timeout: float) -> bool:
        """Wait up to `timeout` s; True once the job has ended, failed or not (see `error()`)."""
        return self._ended.wait(timeout)

    def error(self) -> str | None:
        """Why the job failed, in one line; None while it runs or after a clean stop."""
        return self._failure

    def stop(self, timeout: float = 120.0) -> None:
        """Finish the batch in flight (its offsets get committed), stop the query, then leave the
        group, so the partitions' next owner starts exactly after what was committed. If the batch
        takes longer than `timeout`, the query is stopped under it: its tasks are cancelled and
        its offsets not committed, so the next owner reads it again."""
        self._leaving.set()
        if self._serving is not None and self._serving is not threading.current_thread():
            # It may be handing partitions over: a batch's worth of waiting at most.
            self._serving.join(timeout + 120.0)
        self._stop_query(timeout)
        self._running = None
        if self._member is not None:
            # Waiting for the batch in flight made this thread the group's server; it is about to
            # wait for the metrics reporter, which may need the group for its last report.
            self._member.stop_serving()
        self.close()
        self._ended.set()

    def close(self, timeout: float = 120.0) -> None:
        if self._reporter is not None:
            try:
                self._reporter.stop()  # the last snapshot, with the last batch in it
            except Exception:  # noqa: BLE001 - a failed report must not hide how the job ended
                log.exception("final metrics report failed")
            self._reporter = None
        self._leaving.set()
        # The batch callback runs in this process and may outlive query.stop(): its clients are
        # closed only once it has returned.
        if not self._lock.acquire(timeout=timeout):
            # Never left to the garbage collector: librdkafka spins forever destroying an unclosed
            # group member with a rebalance pending (measured).
            log.error("a batch is still running; its Kafka clients are closed when it returns", timeout=timeout)
            threading.Thread(target=self._close_clients, kwargs={"wait": True}, name="close-after-batch", daemon=True).start()
            return
        self._close_clients(wait=False)

    def _close_clients(self, wait: bool) -> None:
        if wait:
            self._lock.acquire()
        try:
            if self._member is not None:
                self._member.close()  # revokes what is left: nothing runs, so nothing waits
            with self._offsets_lock:
                if self._ends is not None:
                    self._ends.close()
                self._member = self._ends = None
            if self._checkpoint:
                shutil.rmtree(self._checkpoint, ignore_errors=True)
                self._checkpoint = None
        finally:
            self._lock.release()
