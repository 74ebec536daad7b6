"""A detector job: Kafka source -> detector in mapInArrow -> Kafka sink, offsets committed to Kafka.

Each micro-batch runs in `foreachBatch`: the tasks detect and write (flushing their producers), the
driver collects their summaries and commits the batch's end offsets to the consumer group before the
batch returns. A graceful stop waits for the batch in flight, so its offsets are committed too.

The consumer group is the only record of the job's position. Spark's checkpoint is fresh on every
start (a temporary directory, or a per-instance one under CHECKPOINT_DIR that is emptied first): a
checkpoint kept from an earlier run would hold batches Spark thinks done whose offsets the group
never got, or the other way round, and Spark's log would win. So a batch skipped while stopping,
which Spark records as done, is read again by the next run. The positions of all partitions are
committed again now and then, also where no records came, so the group's offsets never expire.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import structlog
from confluent_kafka import KafkaException

from . import broker_kind, clients
from .detector import Detector
from .end_offsets import EndOffsetProbe, ListOffsetsEnds, open_end_offsets
from .metrics import LATENCY_BUCKETS, JobMetrics
from .offset_store import OffsetStore
from .planning import DataLossError
from .processing import SUMMARY_SCHEMA, TaskContext, process_partition, process_ranges
from .reporter import MetricsReporter
from .settings import Settings
from .source import NAME as SOURCE_NAME
from .source import SourceOptions

log = structlog.get_logger("detectorkit.job")


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


class DetectorJob:
    """Start with `start()`, stop gracefully with `stop()`; `stats` tells what was processed."""

    def __init__(self, detector: Detector, settings: Settings, spark, config: Any = None, deliver: str = "ranges"):
        if not settings.kafka_bootstrap_servers:
            raise ValueError("settings.kafka_bootstrap_servers must be set (the command line starts the embedded broker)")
        self.detector = detector
        self.settings = settings.for_service(detector.name)
        self.spark = spark
        self.config = detector.load_config() if config is None else config
        self.stats = JobStats()
        # "ranges": the tasks read their planned ranges themselves; "records": the source's records
        # pass through the JVM into the tasks. Both are kept so the benchmark can compare them.
        self.deliver = deliver
        self.query = None
        # Held while a batch runs: a stop waits for it, and nothing is closed under it.
        self._lock = threading.Lock()
        self._stopping = False
        self._checkpoint: str | None = None
        s = self.settings
        self._base = clients.base(s.kafka_bootstrap_servers, s.kafka_options)
        self.broker_kind = s.kafka_broker_kind
        self._store: OffsetStore | None = None
        self._ends: ListOffsetsEnds | EndOffsetProbe | None = None
        self._reporter: MetricsReporter | None = None
        self.metrics = JobMetrics()
        # Serialises the group commits of batches with the periodic refresh and the lag reading.
        self._offsets_lock = threading.Lock()
        self._committed_at = time.monotonic()
        # How long a worker keeps an unused Kafka client (tests shorten it).
        self.client_idle_seconds = 60.0

    def source_options(self) -> SourceOptions:
        s = self.settings
        return SourceOptions(
            topic=s.input_topic,
            client_conf=self._base,
            group=s.consumer_group,
            starting_offsets=s.starting_offsets,
            max_records_per_batch=s.max_records_per_batch,
            fail_on_data_loss=s.fail_on_data_loss,
            timeout=s.connect_timeout_seconds,
            partitions=s.partitions(),
            max_tasks=max(1, self.spark.sparkContext.defaultParallelism),
            deliver=self.deliver,
            broker_kind=self.broker_kind,
            client_idle_seconds=self.client_idle_seconds,
        )

    def _fresh_checkpoint(self) -> str:
        """A checkpoint directory that holds nothing: the group's offsets are the only position."""
        s = self.settings
        if s.checkpoint_dir is None:
            return tempfile.mkdtemp(prefix=f"{self.detector.name}-checkpoint-")
        # Per instance, so instances sharing CHECKPOINT_DIR never empty each other's.
        path = os.path.join(s.checkpoint_dir, re.sub(r"[^\w.-]", "_", s.instance_id))
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        return path

    def start(self):
        s = self.settings
        timeout = s.connect_timeout_seconds
        self.broker_kind = broker_kind.resolve(self.broker_kind, self._base, timeout)
        self._task = TaskContext(
            service=self.detector.name,
            detector=self.detector,
            config=self.config,
            producer_conf=clients.producer(self._base),
            output_topic=s.output_topic,
            dlq_topic=s.dlq_topic,
            client_idle_seconds=self.client_idle_seconds,
        )
        self._store = OffsetStore(clients.consumer(self._base, s.consumer_group), s.input_topic, timeout)
        # Lag needs the true end, as the source plans it (ListOffsets gets it wrong on Tansu).
        self._ends = open_end_offsets(self.broker_kind, self._base, s.consumer_group, s.input_topic, timeout)
        metrics_conf = clients.base(s.metrics_bootstrap_servers, s.kafka_options) if s.metrics_bootstrap_servers else self._base
        self._reporter = MetricsReporter(self.metrics, metrics_conf, s.metrics_topic, self.detector.name, s.instance_id,
                                         s.metrics_interval_seconds, before_report=self.maintain_offsets).start()
        checkpoint = self._checkpoint = self._fresh_checkpoint()
        self._source = self.source_options()
        stream = self.spark.readStream.format(SOURCE_NAME).options(**self._source.to_options()).load()
        writer = stream.writeStream.foreachBatch(self._on_batch).option("checkpointLocation", checkpoint).queryName(self.detector.name)
        if s.trigger_interval_seconds > 0:
            writer = writer.trigger(processingTime=f"{s.trigger_interval_seconds} seconds")
        self.query = writer.start()
        log.info("job started", input_topic=s.input_topic, output_topic=s.output_topic, dlq_topic=s.dlq_topic,
                 consumer_group=s.consumer_group, starting_offsets=s.starting_offsets, checkpoint=checkpoint,
                 broker_kind=self.broker_kind)
        return self.query

    def _on_batch(self, frame, batch_id: int) -> None:
        with self._lock:
            if self._stopping:
                # Not committed, so the next run reads these records again; Spark will record the
                # batch as done, which is harmless since no run ever reuses this checkpoint.
                return
            started = time.monotonic()
            structlog.contextvars.bind_contextvars(batch=batch_id)
            try:
                self._process(frame, batch_id, started)
            finally:
                structlog.contextvars.unbind_contextvars("batch")

    def _process(self, frame, batch_id: int, started: float) -> BatchResult:
        # The source hands over the planned ranges; the tasks read, detect and write in one worker.
        if self.deliver == "ranges":
            work = partial(process_ranges, self._task, self._source)
        else:
            work = partial(process_partition, self._task)
        rows = frame.mapInArrow(work, SUMMARY_SCHEMA).collect()
        committed: dict[int, int] = {}
        records = detections = 0
        dead = Counter()
        latency_counts = [0] * (len(LATENCY_BUCKETS) + 1)
        latency_sum = 0.0
        for row in rows:
            committed[row.partition] = max(committed.get(row.partition, -1), row.next_offset)
            records += row.records
            detections += row.detections
            dead.update(json.loads(row.dead_letters))
            latency_counts = [a + b for a, b in zip(latency_counts, json.loads(row.latency_counts), strict=True)]
            latency_sum += row.latency_sum
        collected = time.monotonic()
        # Every task has flushed its producer: the output is written, so the position may move.
        with self._offsets_lock:
            try:
                self._store.commit(committed)
                if committed:
                    self._committed_at = time.monotonic()
                    self.metrics.set_offsets(committed, self._ends.end_offsets(committed))
            except (LookupError, KafkaException) as exc:
                if not clients.is_not_there(exc):
                    raise
                # Deleted after the batch was planned: a deletion like any other. When skipping,
                # the source waits for the topic to come back.
                problem = f"topic {self.settings.input_topic!r} was deleted while the job read it"
                if self.settings.fail_on_data_loss:
                    raise DataLossError(f"{problem}. Some records may never have been processed. "
                                        "Set FAIL_ON_DATA_LOSS=false to skip ahead.") from None
                log.warning("skipping lost records", problem=problem)
        commit_seconds = time.monotonic() - collected
        result = BatchResult(batch_id, records, detections, dead, committed, time.monotonic() - started)
        self.metrics.record_batch(records, detections, dead, result.seconds, latency_counts, latency_sum)
        st = self.stats
        st.batches += 1
        st.records += records
        st.detections += detections
        st.dead_letters.update(dead)
        st.last = result
        if records:
            log.info("batch done", records=records, detections=detections, dead_letters=dict(dead),
                     committed={str(k): v for k, v in committed.items()}, seconds=round(result.seconds, 3),
                     tasks_seconds=round(collected - started, 3), commit_seconds=round(commit_seconds, 3))
        return result

    def maintain_offsets(self) -> None:
        """Called before each metrics report: lag of every partition the job owns, also while no
        batch runs; and, every COMMIT_REFRESH_SECONDS, the group's positions committed again.

        Kafka deletes a group's offsets once they are older than offsets.retention.minutes (7 days
        by default) while no member holds them, and this group never has members: a partition
        that got no record for that long would lose its position, and a restart on
        STARTING_OFFSETS=latest would skip what arrived meanwhile."""
        with self._offsets_lock:
            if self._store is None or self._ends is None:
                return
            try:
                partitions = self.settings.partitions() or self._ends.topic_partitions()
                known = {p: o for p, o in self._store.committed(partitions).items() if o is not None}
                if known and time.monotonic() - self._committed_at >= self.settings.commit_refresh_seconds:
                    self._store.commit(known)  # the same positions: only their commit time moves
                    self._committed_at = time.monotonic()
                    log.info("positions committed again", partitions=len(known))
                self.metrics.set_offsets(known, self._ends.end_offsets(known))
            except (LookupError, KafkaException) as exc:
                if not clients.is_not_there(exc):
                    raise
                # A deleted input topic: the source and the batches say so; there is no lag to tell.

    def terminated(self, timeout: float) -> bool:
        """Wait up to `timeout` s; True once the query has ended, failed or not (see `error()`)."""
        from pyspark.errors import StreamingQueryException

        try:
            return bool(self.query.awaitTermination(timeout))
        except StreamingQueryException:
            return True

    def error(self) -> str | None:
        """Why the query failed, in one line; None while it runs or after a clean stop."""
        exc = self.query.exception() if self.query is not None else None
        return None if exc is None else explain(exc)

    def stop(self, timeout: float = 120.0) -> None:
        """Finish the batch in flight (its offsets get committed), then stop the query. If the
        batch takes longer than `timeout`, the query is stopped under it: its tasks are cancelled
        and its offsets not committed, so the next run reads it again."""
        if self._lock.acquire(timeout=timeout):
            self._stopping = True
            self._lock.release()
        else:
            log.warning("batch in flight did not finish in time; cancelling it", timeout=timeout)
            self._stopping = True
        if self.query is not None:
            self.query.stop()
        # Cancelled, the batch's callback returns soon: close() waits for it on its own bound.
        self.close()

    def close(self, timeout: float = 120.0) -> None:
        if self._reporter is not None:
            try:
                self._reporter.stop()  # the last snapshot, with the last batch in it
            except Exception:  # noqa: BLE001 - a failed report must not hide how the job ended
                log.exception("final metrics report failed")
            self._reporter = None
        # The batch callback runs in this process and may outlive query.stop(): its clients are
        # closed only once it has returned.
        if not self._lock.acquire(timeout=timeout):
            log.error("a batch is still running; its Kafka clients are left open", timeout=timeout)
            return
        try:
            with self._offsets_lock:
                for client in (self._store, self._ends):
                    if client is not None:
                        client.close()
                self._store = self._ends = None
            if self._checkpoint:
                shutil.rmtree(self._checkpoint, ignore_errors=True)
                self._checkpoint = None
        finally:
            self._lock.release()


_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+\.)?(\w*(?:Error|Exception)): (.+)$", re.MULTILINE)
_OUR_ERRORS = ("DataLossError", "NoCommittedOffsetsError", "DeliveryError", "TimeoutError", "KafkaException", "LookupError")


def explain(exc: BaseException) -> str:
    """The one line of a failed query's error that says what went wrong, not Spark's stack."""
    text = str(exc)
    found = _ERROR_LINE.findall(text)
    for name, message in found:
        if name in _OUR_ERRORS:
            return f"{name}: {message.strip()}"
    python = [f"{n}: {m.strip()}" for n, m in found if n not in ("PythonException", "StreamingQueryException", "Py4JJavaError")]
    if python:
        return python[-1]
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
