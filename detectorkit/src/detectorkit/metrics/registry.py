"""A job's metrics, Dropwizard-style, as prometheus-client metrics in a registry of the job's own.

Counting happens where the work happens: the executors count records, detections, dead letters
and end-to-end latencies per task and send them to the driver in the batch's own results (the
summaries `foreachBatch` collects); the driver adds them here. Batch time, offsets and lag are
measured on the driver; CPU and memory cover the whole process tree (driver, JVM, Python workers),
and, reported by the tasks themselves, the processes that ran them (metrics.executors), wherever.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from detectorkit.metrics.executors import ExecutorProcesses

PREFIX = "detector"

# From a record's Kafka timestamp to its detection being acknowledged by the broker.
LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 300.0)
BATCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)
# A model's scores (detectorkit.models): a probability's tenths; a score above 1 counts in +Inf.
SCORE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def bucket_counts(values_seconds: Iterable[float], bounds: Sequence[float] = LATENCY_BUCKETS) -> list[int]:
    """Non-cumulative counts per bucket, the last one for +Inf: a value counts in the first bucket
    whose bound it does not pass (NaN in the first). In one pass of NumPy, not one per value: a
    model's scores come a batch of records at a time."""
    values = np.asarray(values_seconds if isinstance(values_seconds, np.ndarray) else list(values_seconds), dtype=np.float64)
    where = np.searchsorted(np.asarray(bounds, dtype=np.float64), values, side="left")
    where[np.isnan(values)] = 0
    return np.bincount(where, minlength=len(bounds) + 1).tolist()


def merged_counts(*counts: Sequence[int]) -> list[int]:
    """Bucket counts added up bucket by bucket; an empty one (none counted yet) adds nothing."""
    given = [c for c in counts if c]
    return [sum(bucket) for bucket in zip(*given, strict=True)] if given else []


class MergedHistogram(Collector):
    """A histogram fed with bucket counts computed elsewhere (prometheus-client's Histogram only
    takes single observations, and the executors observe, not the driver)."""

    def __init__(self, name: str, documentation: str, bounds: Sequence[float]):
        self.name, self.documentation, self.bounds = name, documentation, tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def add(self, counts: Sequence[int], total: float) -> None:
        if len(counts) != len(self.counts):
            raise ValueError(f"{self.name}: expected {len(self.counts)} bucket counts, got {len(counts)}")
        for i, n in enumerate(counts):
            self.counts[i] += n
        self.sum += total

    def collect(self):
        cumulative, buckets = 0, []
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            cumulative += n
            buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=self.sum)


class ProcessTreeCollector(Collector):
    """CPU and memory of this process and all its descendants: the JVM and the Python workers
    of a PySpark job are children of the driver, and a job's cost is all of them together."""

    def __init__(self, pid: int | None = None):
        import psutil

        self._psutil = psutil
        self._root = psutil.Process(pid or os.getpid())
        self._cpu_high = 0.0

    def _tree(self):
        try:
            return [self._root, *self._root.children(recursive=True)]
        except self._psutil.Error:
            return [self._root]

    def collect(self):
        cpu = rss = 0.0
        count = 0
        for proc in self._tree():
            try:
                times = proc.cpu_times()
                # children_* hold the CPU of exited children (short-lived workers), once reaped.
                cpu += times.user + times.system + times.children_user + times.children_system
                rss += proc.memory_info().rss
                count += 1
            except self._psutil.Error:
                continue
        # A counter never goes down, even when a child exits before its parent reaps it.
        self._cpu_high = max(self._cpu_high, cpu)
        yield CounterMetricFamily(
            f"{PREFIX}_process_cpu_seconds", "CPU time of the job's processes (driver, JVM, Python workers).", value=self._cpu_high
        )
        yield GaugeMetricFamily(f"{PREFIX}_process_resident_memory_bytes", "Resident memory of the job's processes.", value=rss)
        yield GaugeMetricFamily(f"{PREFIX}_processes", "Number of the job's processes.", value=count)


class JobMetrics:
    """The registry of one job instance and the metrics in it.

    `aggregations` declares how the metrics-aggregator combines a gauge across instances: summed
    (the default: each instance reports its own share, as lag per partition, since an instance
    drops the partitions it hands over) or the maximum (a position that two instances may report
    for a moment during a hand-over)."""

    aggregations = {f"{PREFIX}_committed_offset": "max"}

    def __init__(self, process_tree: bool = True, dead_letter_reasons: Iterable[str] = (), build: Mapping[str, str] | None = None):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        if build is not None:
            labels = sorted(build)
            self.build_info = Gauge(f"{PREFIX}_build_info", "1 per instance, labelled with the versions it runs.", labels, registry=r)
            self.build_info.labels(**build).set(1)
        self.records_read = Counter(f"{PREFIX}_records_read", "Input records processed.", registry=r)
        self.detections = Counter(f"{PREFIX}_detections_written", "Detections written to the output topic.", registry=r)
        self.dead_letters = Counter(f"{PREFIX}_dead_letters", "Records written to the dead-letter topic, by reason.", ["reason"], registry=r)
        for reason in dead_letter_reasons:  # present from the start, so dashboards show a zero, not "no data"
            self.dead_letters.labels(reason=reason)
        self.batches = Counter(f"{PREFIX}_batches", "Slices completed (each a batch of the job's Spark query).", registry=r)
        self.batch_duration = Histogram(f"{PREFIX}_batch_duration_seconds", "Time to run and commit one slice.", buckets=BATCH_BUCKETS, registry=r)
        self.latency = MergedHistogram(
            f"{PREFIX}_end_to_end_latency_seconds", "From an input record's Kafka timestamp to its detection written.", LATENCY_BUCKETS
        )
        r.register(self.latency)
        # A model detector's: what it scores with, and the distribution of every score it gave.
        self.model_info = Gauge(f"{PREFIX}_model_info", "1 per instance, labelled with the model it scores with.", ["model", "version"], registry=r)
        self.model_scores = MergedHistogram(f"{PREFIX}_model_scores", "Scores the model gave the records it scored.", SCORE_BUCKETS)
        r.register(self.model_scores)
        self.lag = Gauge(f"{PREFIX}_consumer_lag_records", "High watermark minus committed offset, per input partition.", ["partition"], registry=r)
        self.committed = Gauge(f"{PREFIX}_committed_offset", "Last committed offset, per input partition.", ["partition"], registry=r)
        self.assigned = Gauge(f"{PREFIX}_assigned_partitions", "Input partitions this instance owns in its consumer group.", registry=r)
        self.rebalances = Counter(f"{PREFIX}_rebalances", "Changes of the partitions this instance owns.", registry=r)
        self.handover = Histogram(
            f"{PREFIX}_handover_seconds", "From a rebalance's start to reading the new partitions.", buckets=BATCH_BUCKETS, registry=r
        )
        self.report_errors = Counter(f"{PREFIX}_metrics_report_errors", "Metric snapshots that could not be written to Kafka.", registry=r)
        self.query_restarts = Counter(
            f"{PREFIX}_query_restarts", "Failed Spark queries restarted from the group's offsets, by error.", ["error"], registry=r
        )
        self.state_keys = Gauge(f"{PREFIX}_state_keys", "Keys held in the state store, per input partition.", ["partition"], registry=r)
        self.state_bytes = Gauge(
            f"{PREFIX}_state_bytes",
            "Size of the state store's values, per input partition: their changelog JSON (untyped state), or their arrays (typed state).",
            ["partition"],
            registry=r,
        )
        self.state_changelog_records = Counter(f"{PREFIX}_state_changelog_records", "State changes written to the changelog topic.", registry=r)
        self.state_expired_keys = Counter(f"{PREFIX}_state_expired_keys", "Keys dropped from the state store by their TTL.", registry=r)
        self.late_records = Counter(
            f"{PREFIX}_late_records",
            "Records a window rule dropped as late: older than their key's newest by more than the grace, or for windows already closed.",
            registry=r,
        )
        self.state_restored_records = Counter(
            f"{PREFIX}_state_restored_records", "Changelog records read to restore or catch up state stores.", registry=r
        )
        self.state_replayed_records = Counter(
            f"{PREFIX}_state_replayed_records",
            "Input records replayed into state stores whose changes had not reached the changelog (STATE_FLUSH_INTERVAL_SECONDS), "
            "their outputs not written again.",
            registry=r,
        )
        self.state_restore = Histogram(
            f"{PREFIX}_state_restore_seconds",
            "Time until a partition's state store was restored or caught up from the changelog (a task reads its partitions together).",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.executors = ExecutorProcesses()
        r.register(self.executors)
        if process_tree:
            r.register(ProcessTreeCollector())

    def record_batch(
        self, records: int, detections: int, dead_letters: Mapping[str, int], seconds: float, latency_counts: Sequence[int], latency_sum: float
    ) -> None:
        self.record_counts(records, detections, dead_letters, latency_counts, latency_sum)
        self.batches.inc()
        self.batch_duration.observe(seconds)

    def record_counts(
        self, records: int, detections: int, dead_letters: Mapping[str, int], latency_counts: Sequence[int], latency_sum: float
    ) -> None:
        """What tasks wrote: a batch's, or a slice's since its tasks' last checkpoints."""
        self.records_read.inc(records)
        self.detections.inc(detections)
        for reason, n in dead_letters.items():
            self.dead_letters.labels(reason=reason).inc(n)
        if any(latency_counts):
            self.latency.add(latency_counts, latency_sum)

    def record_scores(self, counts: Sequence[int], total: float) -> None:
        """A model detector's scores, as bucket counts of SCORE_BUCKETS (tasks count them)."""
        if any(counts):
            self.model_scores.add(counts, total)

    def set_assignment(self, owned, seconds: float) -> None:
        self.assigned.set(len(owned))
        self.rebalances.inc()
        self.handover.observe(seconds)

    def forget_partitions(self, partitions) -> None:
        """Another instance reports these now: keep the sums across instances right."""
        for partition in partitions:
            for gauge in (self.lag, self.committed, self.state_keys, self.state_bytes):
                try:
                    gauge.remove(str(partition))
                except KeyError:
                    pass

    def record_state(self, partition: int, report: Mapping[str, float]) -> None:
        """What a task reports of a partition's state store (task_context.PartitionSummary.state)."""
        self.state_keys.labels(partition=str(partition)).set(report["keys"])
        self.state_bytes.labels(partition=str(partition)).set(report["bytes"])
        self.state_changelog_records.inc(report["written"])
        self.state_expired_keys.inc(report["expired"])
        self.late_records.inc(report.get("late", 0))
        self.state_replayed_records.inc(report.get("replayed", 0))
        if report["restored"] or report["restore_seconds"]:
            self.state_restored_records.inc(report["restored"])
            self.state_restore.observe(report["restore_seconds"])

    def lag_total(self) -> int:
        """The lag of every partition this instance owns, summed, as last set."""
        return int(sum(sample.value for family in self.lag.collect() for sample in family.samples))

    def set_offsets(self, committed: Mapping[int, int], ends: Mapping[int, int]) -> None:
        for partition, offset in committed.items():
            self.committed.labels(partition=str(partition)).set(offset)
            end = ends.get(partition)
            if end is not None:
                self.lag.labels(partition=str(partition)).set(max(0, end - offset))
