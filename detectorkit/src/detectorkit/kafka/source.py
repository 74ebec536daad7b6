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
import functools
import json
import logging
import pickle
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from pydantic import SecretStr
from pyspark import cloudpickle
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from detectorkit.kafka import broker_kind as kinds
from detectorkit.kafka import clients
from detectorkit.kafka.claims import Claim, plan_tasks
from detectorkit.kafka.end_offsets import EndOffsetProbe, ListOffsetsEnds, open_end_offsets
from detectorkit.kafka.planning import (
    MIN_TASK_RECORDS,
    DataLossError,
    PartitionRange,
    cap_end_offsets,
    from_spark,
    plan_ranges,
    reconcile,
    to_spark,
)
from detectorkit.kafka.worker_clients import WorkerClients

if TYPE_CHECKING:
    import pyarrow as pa

NAME = "detectorkit-kafka"

# Without a task (task_source): one row per task naming the offset ranges it owns, for a stage
# that reads them itself in the driver (the notifier), so records never cross into the JVM and back.
RANGES_SCHEMA = "ranges string"

# How many records one Arrow batch from `read` holds: big enough to amortise the per-batch cost of
# the detector, small enough to keep a worker's memory flat.
CHUNK_RECORDS = 20_000

# How long a read may see nothing before it checks that its partition still exists.
_STALL_CHECK_SECONDS = 2.0

# Errors by which the broker says the records asked for are not there.
_GONE = {KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE, *clients.NOT_THERE}

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourceOptions:
    topic: str
    client_conf: dict[str, Any]
    group: str
    max_records_per_batch: int | None = None
    fail_on_data_loss: bool = True
    timeout: float = 30.0
    partition_refresh_seconds: float = 5.0
    # The partitions this instance owns; None: all of the topic's, including ones added later.
    partitions: list[int] | None = None
    # Where to start each partition, resolved by the group's member (the job); a reader refuses to
    # start without them.
    start_offsets: dict[int, int] | None = None
    # Spark tasks per batch at most: the job passes its parallelism (cores).
    max_tasks: int = 2
    # A task per this many records at least: a caught-up job's small batches go in one task.
    min_task_records: int = MIN_TASK_RECORDS
    # broker_kind.KAFKA or TANSU (AUTO: detected by the planner); the job detects it once at start.
    broker_kind: str = kinds.AUTO
    # A worker's cached reading consumer is closed after this long unused (see worker_clients).
    client_idle_seconds: float = 60.0
    # Plan a batch at least this often, with an empty range for each partition that has nothing to
    # read (a tick: timers of quiet partitions fire in it); None: only when there are records.
    tick_seconds: float | None = None
    # Name each range read to its partition's end at planning (PartitionRange.caught_up): a stateful
    # task writes such a partition's state changes at once rather than waiting for the interval.
    marks_caught_up: bool = False
    # Where a batch's tasks claim their partitions when they all run on this machine (kafka.claims):
    # set for a stateful stage in local mode, so a worker keeps the partitions whose stores it holds.
    claims_dir: str | None = None
    # With exactly-once: the driver's consumer group metadata (hex) at the query's start, with which
    # the tasks commit their offsets inside their transactions (kafka.transactions).
    group_metadata: str | None = None

    def resolved(self) -> SourceOptions:
        """These options with the broker kind detected, if it was AUTO."""
        if self.broker_kind != kinds.AUTO:
            return self
        return dataclasses.replace(self, broker_kind=kinds.resolve(self.broker_kind, self.client_conf, self.timeout))

    def to_options(self) -> dict[str, str]:
        """Spark's data source options. Secrets travel under keys that Spark's redaction pattern
        (spark.redaction.regex matches "secret") hides from plans, explain() and the UI."""
        conf = {k: v for k, v in self.client_conf.items() if not isinstance(v, SecretStr)}
        options = {"detectorkit.options": json.dumps({**self.__dict__, "client_conf": conf})}
        for k, v in self.client_conf.items():
            if isinstance(v, SecretStr):
                options[_SECRET_OPTION + k] = v.get_secret_value()
        return options

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SourceOptions:
        fields = json.loads(options["detectorkit.options"])
        if fields.get("start_offsets") is not None:  # JSON made the partition numbers strings
            fields["start_offsets"] = {int(p): o for p, o in fields["start_offsets"].items()}
        # Spark may hand the options back with lower-cased keys; librdkafka's keys are lower case.
        secrets = {k[len(_SECRET_OPTION) :]: SecretStr(v) for k, v in options.items() if k.lower().startswith(_SECRET_OPTION)}
        return cls(**{**fields, "client_conf": {**fields["client_conf"], **secrets}})


_SECRET_OPTION = "detectorkit.secret."
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


# One reading consumer per worker process and configuration, reused by every task that process runs.
_readers = WorkerClients(close=lambda consumer: consumer.close())


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
            end[TICK] = int(time.time() // self.options.tick_seconds)
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
            ranges = [dataclasses.replace(r, tick=tick) for r in ranges]
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


# A task's consumer reads its ranges and stops. librdkafka's defaults prefetch up to 64 MiB ahead
# into buffers malloc'ed by its broker threads, which then stay in the worker's memory: a 64 MiB
# arena, full, in each worker after a backlog. Fetching 1 MiB per partition, 4 MiB per request and
# queueing 8 MiB: the two workers' peak PSS 530 -> 415 MiB, throughput unchanged (records of ~105
# bytes; a fetch still brings ~10,000 of them).
READER_BUFFERS = {"fetch.max.bytes": 4 * 1024 * 1024, "max.partition.fetch.bytes": 1024 * 1024, "queued.max.messages.kbytes": 8 * 1024}


def _consumer_conf(options: SourceOptions, **extra: Any) -> dict[str, Any]:
    # The planner's end offsets were taken at the same isolation level, so a range never ends
    # inside an open transaction (read_committed) or beyond the high watermark (Tansu).
    isolation = kinds.isolation_level(options.broker_kind)
    return clients.consumer(options.client_conf, options.group, **{"isolation.level": isolation, **READER_BUFFERS, **extra})


def read_planned(options: SourceOptions, ranges: list[PartitionRange]) -> Iterator[pa.RecordBatch]:
    """The records of planned ranges, with this worker process's reading consumer."""
    conf = _consumer_conf(options, **{"enable.partition.eof": True, "auto.offset.reset": "error"})
    with _readers.use(clients.conf_key(conf), lambda: clients.new_consumer(conf), options.client_idle_seconds) as consumer:
        yield from read_ranges(consumer, ranges, options.fail_on_data_loss, options.timeout)


def ranges_from_row(text: str) -> list[PartitionRange]:
    return [PartitionRange(*fields) for fields in json.loads(text)]


def read_ranges(consumer: Consumer, ranges: list[PartitionRange], fail_on_data_loss: bool, timeout: float) -> Iterator[pa.RecordBatch]:
    """Exactly the records of each range's offsets [start, end), as Arrow record batches; the
    partitions are fetched at once, so their records come interleaved."""
    consumer.assign([TopicPartition(r.topic, r.partition, r.start) for r in ranges])
    try:
        yield from _read_assigned(consumer, {r.partition: r for r in ranges}, fail_on_data_loss, timeout)
    finally:
        consumer.unassign()


def _read_assigned(consumer: Consumer, ranges: dict[int, PartitionRange], fail_on_data_loss: bool, timeout: float) -> Iterator[pa.RecordBatch]:
    topic = next(iter(ranges.values())).topic
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    partitions: list[int] = []
    offsets: list[int] = []
    stamps: list[int] = []
    position = {p: r.start for p, r in ranges.items()}
    remaining = sum(r.size for r in ranges.values())
    deadline = time.monotonic() + timeout
    checked = time.monotonic()
    while remaining > 0:
        # consume() returns once it has as many messages as asked for: asking for more than the
        # ranges hold would wait out the whole timeout at the end of every task.
        messages = consumer.consume(min(CHUNK_RECORDS, remaining), timeout=0.2)
        if not messages:
            now = time.monotonic()
            if now > checked + _STALL_CHECK_SECONDS:
                # librdkafka waits quietly on a partition that no longer exists: ask the metadata.
                checked = now
                existing = _existing_partitions(consumer, topic, timeout)
                for p in [p for p, r in ranges.items() if position[p] < r.end]:
                    if existing is not None and p not in existing:
                        r = ranges[p]
                        _lost(r, f"partition {r.topic}-{p} no longer exists; records [{position[p]}, {r.end}) are gone", fail_on_data_loss)
                        remaining -= r.end - position[p]
                        position[p] = r.end
            if now > deadline:
                late = {p: (position[p], r.end) for p, r in ranges.items() if position[p] < r.end}
                raise TimeoutError(
                    f"no records from {topic} partition(s) {late} (position, planned end) for {timeout:.0f} s; is the broker reachable?"
                )
            continue
        deadline = time.monotonic() + timeout
        for message in messages:
            p = message.partition()
            r = ranges.get(p)
            error = message.error()
            if r is None:
                if error is not None and error.fatal():
                    raise KafkaException(error)
                continue  # a client-wide notice, or a record of a partition this task does not read
            if position[p] >= r.end:
                continue
            if error is not None:
                moved = min(_handle_error(consumer, r, position[p], error, message, fail_on_data_loss, timeout), r.end)
                if position[p] < moved < r.end:
                    # Skipping to the first record still there. After an offset-out-of-range error
                    # the partition's fetcher refuses seek(); a new assignment at every unfinished
                    # partition's position restarts it (records already queued are fetched again
                    # and skipped by offset).
                    consumer.assign([TopicPartition(topic, q, moved if q == p else position[q]) for q, rq in ranges.items() if position[q] < rq.end])
                remaining -= moved - position[p]
                position[p] = moved
                continue
            offset = message.offset()
            if offset < position[p]:
                continue
            if offset >= r.end:
                remaining -= r.end - position[p]
                position[p] = r.end
                continue
            keys.append(message.key())
            values.append(message.value())
            partitions.append(p)
            offsets.append(offset)
            stamps.append(message.timestamp()[1])
            remaining -= offset + 1 - position[p]
            position[p] = offset + 1
        if len(offsets) >= CHUNK_RECORDS or (offsets and remaining <= 0):
            yield _to_arrow(topic, keys, values, partitions, offsets, stamps)
            keys, values, partitions, offsets, stamps = [], [], [], [], []


def _handle_error(consumer, r: PartitionRange, position: int, error: KafkaError, message, fail_on_data_loss: bool, timeout: float) -> int:
    """The offset where reading goes on after `error` (the caller moves the consumer there); raises
    when it cannot."""
    code = error.code()
    if code == KafkaError._PARTITION_EOF:
        if message.offset() >= r.end:
            return r.end  # the rest of the range holds no records (e.g. transaction markers)
        problem = f"partition {r.topic}-{r.partition} ends at offset {message.offset()}, before the planned {r.end}"
    elif code in _GONE:
        problem = f"records {r.topic}-{r.partition} [{position}, {r.end}) are no longer on the broker ({error.str()})"
    elif error.fatal() or not error.retriable():
        raise KafkaException(error)
    else:
        return position  # transient: librdkafka retries by itself
    _lost(r, problem, fail_on_data_loss)
    try:
        low, _ = consumer.get_watermark_offsets(TopicPartition(r.topic, r.partition), timeout=timeout, cached=False)
    except KafkaException:
        return r.end  # the partition itself is gone: nothing of the range is left to read
    if low < 0 or low >= r.end or code == KafkaError._PARTITION_EOF or low <= position:
        return r.end
    return low


def _lost(r: PartitionRange, problem: str, fail_on_data_loss: bool) -> None:
    if fail_on_data_loss and not r.from_earliest:
        raise DataLossError(problem + ". Some records were never processed. Set FAIL_ON_DATA_LOSS=false to skip ahead.")
    log.warning("skipping lost records: %s", problem)


def _existing_partitions(consumer: Consumer, topic: str, timeout: float) -> set[int] | None:
    """The topic's partitions now; None when the broker does not answer, which is no sign of loss
    (the read timeout covers it)."""
    try:
        return set(clients.topic_partitions(consumer, topic, timeout))
    except LookupError:
        return set()
    except clients.TopicAccessError:
        raise  # refused, not gone: stop rather than skip anything
    except KafkaException:
        return None


@functools.cache
def arrow_schema() -> pa.Schema:
    """The columns of the batches `read_planned` yields: those of Spark's own Kafka source, less headers."""
    import pyarrow as pa

    return pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
        ]
    )


def _to_arrow(topic: str, keys, values, partitions, offsets, stamps) -> pa.RecordBatch:
    # Imported here, in the workers that read: the planner processes that unpickle this module
    # never build a batch, and pyarrow is ~20 MiB in each.
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(offsets)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array([topic] * n, pa.string()),
            pa.array(partitions, pa.int32()),
            pa.array(offsets, pa.int64()),
            pc.multiply(pa.array(stamps, pa.int64()), 1000).cast(pa.timestamp("us", tz="UTC")),
        ],
        schema=arrow_schema(),
    )
