"""The Kafka source: a PySpark Python Data Source streaming reader built on confluent-kafka.

Spark's own Kafka connector is a JVM package; this one needs nothing but Python packages.

Where things run: `initialOffset`, `latestOffset` and `partitions` run in a long-lived Python
process on the driver (the planner); `read` runs in Python workers on an unpickled copy of the
reader. Kafka clients are therefore created lazily and cached per process, never pickled.

Broker kinds: on Apache Kafka the source reads read_committed with end offsets from ListOffsets
(the last stable offset); on the embedded Tansu, read_uncommitted with end offsets from the Fetch
high watermark (see `broker_kind` and `end_offsets`).

Offsets: a query starts where `SourceOptions.start_offsets` says. The job resolves them as the
consumer group's member, from the group's committed offsets (which it commits after each batch's
output is flushed, see `job.py`) and STARTING_OFFSETS where the group has none; the source never
reads the group's offsets itself. The reader's `commit(end)` is deliberately not used to commit:
Spark calls it one batch late, so a redeploy would replay the last batch.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pickle
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyspark import cloudpickle
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from detectorkit.kafka.claims import Claim, plan_tasks
from detectorkit.kafka.end_offsets import EndOffsetProbe, ListOffsetsEnds, open_end_offsets
from detectorkit.kafka.planning import (
    DataLossError,
    PartitionRange,
    cap_end_offsets,
    from_spark,
    plan_ranges,
    reconcile,
    to_spark,
)
from detectorkit.kafka.source_options import SourceOptions

if TYPE_CHECKING:
    import pyarrow as pa

NAME = "detectorkit-kafka"

# Without a task (task_source): one row per task naming the offset ranges it owns, for a stage
# that reads them itself in the driver (the notifier), so records never cross into the JVM and back.
RANGES_SCHEMA = "ranges string"

log = logging.getLogger(__name__)


# The offset's fields that count the source's ticks (SourceOptions.tick_seconds) and name the
# partitions planned to their end (only those are quiet when nothing is planned for them).
TICK = "detectorkit.tick"
CAUGHT_UP = "detectorkit.caught_up"


class KafkaInputPartition(InputPartition):
    """One Spark task: the ranges of one or more Kafka partitions, read at once."""

    def __init__(self, ranges: list[PartitionRange], claim: Claim | None = None):
        super().__init__(ranges)
        self.ranges = ranges
        self.claim = claim  # the ranges are the whole batch's, of which the task claims its share


class KafkaSource(DataSource):
    """Register with ``spark.dataSource.register(KafkaSource)``, read with
    ``spark.readStream.format("detectorkit-kafka").options(**SourceOptions(...).to_options())``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return RANGES_SCHEMA

    def streamReader(self, schema) -> KafkaStreamReader:
        return KafkaStreamReader(SourceOptions.from_options(self.options).resolved())


# What a task of `task_source` runs over its planned ranges: it reads them itself and yields what
# the source's schema says.
TaskFunction = Callable[[SourceOptions, list[PartitionRange]], Iterator["pa.RecordBatch"]]


def task_source(name: str, schema: str, task: TaskFunction) -> type[KafkaSource]:
    """A KafkaSource, registered under `name`, whose tasks run `task` over their planned ranges in
    the Python worker Spark starts for the read. A job that processes each task's records with a
    `mapInArrow` after a ranges source runs two Python workers per task, and pays for a second
    pickled plan and an Arrow round trip through the JVM in every batch; this runs one.

    `task` travels pickled inside the class (cloudpickle takes a class defined in a function by
    value), so nothing of it is part of the options Spark shows in plans; it is unpickled only in
    the workers, never in the planner's process, which thus never imports what the task needs."""
    pickled = cloudpickle.dumps(task)

    class TaskSource(KafkaSource):
        @classmethod
        def name(cls) -> str:
            return name

        def schema(self) -> str:
            return schema

        def streamReader(self, schema) -> KafkaStreamReader:
            return KafkaStreamReader(SourceOptions.from_options(self.options).resolved(), task=pickled)

    return TaskSource


@dataclass
class KafkaStreamReader(DataSourceStreamReader):
    options: SourceOptions
    # A pickled TaskFunction (see task_source); None: the source yields its tasks' ranges (RANGES_SCHEMA).
    task: bytes | None = field(default=None, repr=False)
    _probe: ListOffsetsEnds | EndOffsetProbe | None = field(default=None, repr=False)
    _partitions: list[int] = field(default_factory=list, repr=False)
    _partitions_at: float = field(default=0.0, repr=False)

    def __getstate__(self) -> dict:
        return {"options": self.options, "task": self.task}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["options"], state["task"])

    # ---- planner side -------------------------------------------------------------------------

    def _ends(self) -> ListOffsetsEnds | EndOffsetProbe:
        if self._probe is None:
            self.options = o = self.options.resolved()
            self._probe = open_end_offsets(o.broker_kind, o.client_conf, o.group, o.topic, o.timeout)
        return self._probe

    def _topic_partitions(self, force: bool = False) -> list[int]:
        # Partitions added to the topic are picked up within the refresh interval.
        now = time.monotonic()
        if force or now - self._partitions_at > self.options.partition_refresh_seconds:
            probe = self._ends()
            try:
                partitions = probe.topic_partitions()
            except LookupError as exc:
                if not self._partitions and not self._partitions_at:
                    raise  # at start: the topic was never there
                if self.options.fail_on_data_loss:
                    raise DataLossError(
                        f"{exc}: it was deleted while the job read it. Some records may never have been processed. "
                        "Set FAIL_ON_DATA_LOSS=false to skip ahead."
                    ) from None
                # Skipping: wait for the topic to come back, then read it from its first record.
                if self._partitions:
                    log.warning("skipping lost records: %s: it was deleted while the job read it", exc)
                partitions = []
            if self.options.partitions is not None:
                # The owned ones that exist: a deleted topic (when skipping) has none until the
                # group assigns the re-created topic's partitions.
                partitions = sorted(set(self.options.partitions) & set(partitions))
            probe.forget(set(self._partitions) - set(partitions))
            self._partitions, self._partitions_at = partitions, now
        return self._partitions

    def initialOffset(self) -> dict:
        if self.options.start_offsets is None:
            raise ValueError(f"no start offsets for {self.options.topic!r}: the group's member resolves them (SourceOptions.start_offsets)")
        return to_spark(self.options.topic, self.options.start_offsets)

    def getDefaultReadLimit(self):
        if self.options.max_records_per_batch:
            return ReadMaxRows(self.options.max_records_per_batch)
        return ReadAllAvailable()

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        listed_at = time.time()  # before the listing: a tick's quiet partitions were quiet then (PartitionRange.tick_ms)
        probe = self._ends()
        partitions = self._topic_partitions()
        # Confirmed: a partition's first answer on Tansu comes from ListOffsets, which is low, and
        # a low end below the job's start reads as a deleted topic. Once a fetch has answered for
        # a partition, this costs nothing more.
        try:
            latest = probe.end_offsets(partitions, confirmed=True)
        except LookupError:  # gone since the last look at the topic's partitions
            partitions = self._topic_partitions(force=True)
            latest = probe.end_offsets(partitions, confirmed=True)
        current = from_spark(self.options.topic, start)
        planned, _, problems = reconcile(current, latest, self.options.fail_on_data_loss, self.options.topic)
        for problem in problems:
            log.warning("skipping lost records: %s", problem)
        if limit is None:  # PySpark before 4.2 passes neither argument
            limit = self.getDefaultReadLimit()
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        capped = cap_end_offsets(planned, latest, max_rows)
        end = to_spark(self.options.topic, capped)
        if self.options.tick_seconds:
            # A new tick is a new offset: Spark plans a batch even when no record arrived.
            end[TICK] = int(listed_at // self.options.tick_seconds)
        if self.options.tick_seconds or self.options.marks_caught_up:
            # Only a partition read to its end is quiet: one whose records wait behind the cap is not,
            # and its event time must come from them, not from the wall clock. (The same offsets give
            # the same list: no batch is planned for it alone.)
            end[CAUGHT_UP] = sorted(p for p, o in capped.items() if o >= latest[p])
        return end

    def partitions(self, start: dict, end: dict) -> list[KafkaInputPartition]:
        topic = self.options.topic
        first, last = from_spark(topic, start), from_spark(topic, end)
        ranges = plan_ranges(topic, first, last)
        tick = end.get(TICK)
        if tick is not None:
            if tick != (start or {}).get(TICK):
                # Every caught-up partition with nothing to read gets an empty range: its task fires its timers.
                planned, quiet = {r.partition for r in ranges}, set(end.get(CAUGHT_UP, ()))
                ranges += [PartitionRange(topic, p, o, o) for p, o in sorted(last.items()) if p not in planned and p in quiet]
            tick_ms = int(tick * self.options.tick_seconds * 1000)
            ranges = [dataclasses.replace(r, tick=tick, tick_ms=tick_ms) for r in ranges]
        if self.options.marks_caught_up:
            caught_up = set(end.get(CAUGHT_UP, ()))
            ranges = [dataclasses.replace(r, caught_up=r.partition in caught_up) for r in ranges]
        # Only the runtime's own task claims (kafka.claims); exactly-once's claims are sticky.
        claims_dir = self.options.claims_dir if self.task is not None else None
        sticky = self.options.group_metadata is not None
        tasks = plan_tasks(ranges, self.options.max_tasks, self.options.min_task_records, claims_dir, sticky)
        return [KafkaInputPartition(task_ranges, claim) for task_ranges, claim in tasks]

    def commit(self, end: dict) -> None:
        """Nothing to do: the job commits each batch's offsets itself once its output is flushed."""

    def stop(self) -> None:
        if self._probe is not None:
            self._probe.close()
        self._probe = None

    # ---- worker side --------------------------------------------------------------------------

    def read(self, partition: KafkaInputPartition) -> Iterator:
        if self.task is not None:
            task = pickle.loads(self.task)
            claim = getattr(partition, "claim", None)
            yield from (task(self.options, partition.ranges) if claim is None else task(self.options, partition.ranges, claim=claim))
        else:
            yield (json.dumps([dataclasses.astuple(r) for r in partition.ranges]),)


def ranges_from_row(text: str) -> list[PartitionRange]:
    return [PartitionRange(*fields) for fields in json.loads(text)]
