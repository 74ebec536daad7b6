"""A detector job: Kafka source -> detector in mapInArrow -> Kafka sink, offsets committed to Kafka.

Each micro-batch runs in `foreachBatch`: the tasks detect and write (flushing their producers), the
driver collects their summaries and commits the batch's end offsets to the consumer group before the
batch returns. A graceful stop waits for the batch in flight, so its offsets are committed too.
"""

from __future__ import annotations

import json
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

from . import clients
from .detector import Detector
from .end_offsets import EndOffsetProbe
from .metrics import LATENCY_BUCKETS, JobMetrics
from .offset_store import OffsetStore
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
        self._lock = threading.Lock()
        self._stopping = False
        self._checkpoint_tmp: str | None = None
        s = self.settings
        self._base = clients.base(s.kafka_bootstrap_servers, s.kafka_options)
        self._store: OffsetStore | None = None
        self._ends: EndOffsetProbe | None = None
        self._reporter: MetricsReporter | None = None
        self.metrics = JobMetrics()
        self._offsets_lock = threading.Lock()
        self._task = TaskContext(
            service=detector.name,
            detector=detector,
            config=self.config,
            producer_conf=clients.producer(self._base),
            output_topic=s.output_topic,
            dlq_topic=s.dlq_topic,
        )

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
        )

    def start(self):
        s = self.settings
        self._store = OffsetStore(clients.consumer(self._base, s.consumer_group), s.input_topic, s.connect_timeout_seconds)
        # The driver's own probe: lag needs the true end, which ListOffsets gets wrong on Tansu.
        self._ends = EndOffsetProbe(clients.consumer(self._base, s.consumer_group), s.input_topic, s.connect_timeout_seconds)
        metrics_conf = clients.base(s.metrics_bootstrap_servers, s.kafka_options) if s.metrics_bootstrap_servers else self._base
        self._reporter = MetricsReporter(self.metrics, metrics_conf, s.metrics_topic, self.detector.name, s.instance_id,
                                         s.metrics_interval_seconds, before_report=self.refresh_lag).start()
        checkpoint = s.checkpoint_dir
        if checkpoint is None:
            # Offsets live in Kafka; the checkpoint only has to outlive one run.
            checkpoint = self._checkpoint_tmp = tempfile.mkdtemp(prefix=f"{self.detector.name}-checkpoint-")
        self._source = self.source_options()
        stream = self.spark.readStream.format(SOURCE_NAME).options(**self._source.to_options()).load()
        writer = stream.writeStream.foreachBatch(self._on_batch).option("checkpointLocation", checkpoint).queryName(self.detector.name)
        if s.trigger_interval_seconds > 0:
            writer = writer.trigger(processingTime=f"{s.trigger_interval_seconds} seconds")
        self.query = writer.start()
        log.info("job started", input_topic=s.input_topic, output_topic=s.output_topic, dlq_topic=s.dlq_topic,
                 consumer_group=s.consumer_group, starting_offsets=s.starting_offsets, checkpoint=checkpoint)
        return self.query

    def _on_batch(self, frame, batch_id: int) -> None:
        with self._lock:
            if self._stopping:
                return  # not committed, so the next run reads these records again
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
        self._store.commit(committed)
        commit_seconds = time.monotonic() - collected
        result = BatchResult(batch_id, records, detections, dead, committed, time.monotonic() - started)
        self.metrics.record_batch(records, detections, dead, result.seconds, latency_counts, latency_sum)
        with self._offsets_lock:
            if committed:
                self.metrics.set_offsets(committed, self._ends.end_offsets(committed))
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

    def refresh_lag(self) -> None:
        """Lag of every partition the job owns, also while no batch runs (called before each report)."""
        if self._store is None or self._ends is None:
            return
        with self._offsets_lock:
            partitions = self.settings.partitions() or self._ends.topic_partitions()
            known = {p: o for p, o in self._store.committed(partitions).items() if o is not None}
            self.metrics.set_offsets(known, self._ends.end_offsets(known))

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
        """Finish the batch in flight (its offsets get committed), then stop the query."""
        if self._lock.acquire(timeout=timeout):
            self._stopping = True
            self._lock.release()
        else:
            log.warning("batch in flight did not finish in time; stopping anyway", timeout=timeout)
            self._stopping = True
        if self.query is not None:
            self.query.stop()
        self.close()

    def close(self) -> None:
        if self._reporter is not None:
            try:
                self._reporter.stop()  # the last snapshot, with the last batch in it
            except Exception:  # noqa: BLE001 - a failed report must not hide how the job ended
                log.exception("final metrics report failed")
            self._reporter = None
        with self._offsets_lock:
            for client in (self._store, self._ends):
                if client is not None:
                    client.close()
            self._store = self._ends = None
        if self._checkpoint_tmp:
            shutil.rmtree(self._checkpoint_tmp, ignore_errors=True)
            self._checkpoint_tmp = None


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
