"""A task's reading of its planned ranges: exactly the records of each range's offsets, as Arrow
record batches, with the worker process's cached consumer; lost records are reported or skipped
as FAIL_ON_DATA_LOSS says."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from detectorkit.kafka import broker_kind as kinds
from detectorkit.kafka import clients
from detectorkit.kafka.planning import PartitionRange, data_loss
from detectorkit.kafka.source_options import SourceOptions
from detectorkit.kafka.worker_clients import WorkerClients

if TYPE_CHECKING:
    import pyarrow as pa

# How many records one Arrow batch from `read` holds: big enough to amortise the per-batch cost of
# the detector, small enough to keep a worker's memory flat.
CHUNK_RECORDS = 20_000

# How long a read may see nothing before it checks that its partition still exists.
_STALL_CHECK_SECONDS = 2.0

# Errors by which the broker says the records asked for are not there.
_GONE = {KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE, *clients.NOT_THERE}

log = logging.getLogger(__name__)

# One reading consumer per worker process and configuration, reused by every task that process runs.
_readers = WorkerClients(close=lambda consumer: consumer.close())


# A task's consumer reads its ranges and stops. librdkafka's defaults prefetch up to 64 MiB ahead
# into buffers malloc'ed by its broker threads, which then stay in the worker's memory: a 64 MiB
# arena, full, in each worker after a backlog. Fetching 1 MiB per partition, 4 MiB per request and
# queueing 8 MiB: the two workers' peak PSS 530 -> 415 MiB, throughput unchanged (records of ~105
# bytes; a fetch still brings ~10,000 of them).
READER_BUFFERS = {"fetch.max.bytes": 4 * 1024 * 1024, "max.partition.fetch.bytes": 1024 * 1024, "queued.max.messages.kbytes": 8 * 1024}


def reader_conf(client_conf: Mapping[str, Any], group: str, broker_kind: str) -> dict[str, Any]:
    """A consumer that reads planned ranges (`read_ranges`): the live source's, and a backtest's."""
    # The planner's end offsets were taken at the same isolation level, so a range never ends
    # inside an open transaction (read_committed) or beyond the high watermark (Tansu).
    isolation = kinds.isolation_level(broker_kind)
    extra = {"isolation.level": isolation, **READER_BUFFERS, "enable.partition.eof": True, "auto.offset.reset": "error"}
    return clients.consumer(client_conf, group, **extra)


@contextmanager
def worker_reader(options: SourceOptions) -> Iterator[Consumer]:
    """This worker process's reading consumer for `options`, held for the task."""
    conf = reader_conf(options.client_conf, options.group, options.broker_kind)
    with _readers.use(clients.conf_key(conf), lambda: clients.new_consumer(conf), options.client_idle_seconds) as consumer:
        yield consumer


def read_planned(options: SourceOptions, ranges: list[PartitionRange]) -> Iterator[pa.RecordBatch]:
    """The records of planned ranges, with this worker process's reading consumer."""
    with worker_reader(options) as consumer:
        yield from read_ranges(consumer, ranges, options.fail_on_data_loss, options.timeout)


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
    chunk = Chunk()
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
            chunk.add(message, p, offset)
            remaining -= offset + 1 - position[p]
            position[p] = offset + 1
        if len(chunk) >= CHUNK_RECORDS or (len(chunk) and remaining <= 0):
            yield chunk.batch(topic)
            chunk = Chunk()


class Chunk:
    """Records as read, column by column, until they become an Arrow batch."""

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.partitions: list[int] = []
        self.offsets: list[int] = []
        self.stamps: list[int] = []

    def add(self, message, partition: int, offset: int) -> None:
        self.keys.append(message.key())
        self.values.append(message.value())
        self.partitions.append(partition)
        self.offsets.append(offset)
        self.stamps.append(message.timestamp()[1])

    def __len__(self) -> int:
        return len(self.offsets)

    def batch(self, topic: str) -> pa.RecordBatch:
        return to_arrow(topic, self.keys, self.values, self.partitions, self.offsets, self.stamps)


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
        raise data_loss(problem)
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


def to_arrow(topic: str, keys, values, partitions, offsets, stamps) -> pa.RecordBatch:
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
