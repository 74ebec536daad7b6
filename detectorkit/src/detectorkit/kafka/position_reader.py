"""A slice's reading (runtime.slices): its partitions from their positions on, for as long as the
slice lasts, each poll's records as one Arrow batch in the range reader's columns; where each
partition has got to, and which are read to their end.

A planned range knows where it ends; this reader does not, so its positions come from the records
and from the end-of-partition events, whose offset is the partition's end at the reader's isolation
level: a position moves past transaction markers and aborted records too, and a quiet partition's
lag reaches 0."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from detectorkit.kafka import clients
from detectorkit.kafka.planning import data_loss
from detectorkit.kafka.range_reader import CHUNK_RECORDS, Chunk, to_arrow

if TYPE_CHECKING:
    import pyarrow as pa

_GONE = {KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE, *clients.NOT_THERE}

log = logging.getLogger(__name__)


class PositionReader:
    """Reads `positions` (partition -> next offset) of `topic` onward with `consumer` (a range
    reader's: end-of-partition events on, no offset reset)."""

    def __init__(self, consumer: Consumer, topic: str, positions: dict[int, int], fail_on_data_loss: bool, timeout: float):
        self.consumer = consumer
        self.topic = topic
        self.position = dict(positions)
        self.at_end: set[int] = set()
        self.went_back: set[int] = set()  # taken back to their start, past their end
        self.fail_on_data_loss = fail_on_data_loss
        self.timeout = timeout
        consumer.assign([TopicPartition(topic, p, o) for p, o in sorted(positions.items())])

    def mark(self) -> tuple[dict[int, int], set[int]]:
        """Where the reader is, for `rewind`."""
        return dict(self.position), set(self.at_end)

    def rewind(self, mark: tuple[dict[int, int], set[int]]) -> None:
        """Back to `mark`: what was polled since is as if never read (the slice ends: the next one's
        reader is assigned from the positions)."""
        self.position, self.at_end = dict(mark[0]), set(mark[1])

    def poll(self, wait: float, max_records: int = CHUNK_RECORDS) -> pa.RecordBatch | None:
        """What has arrived, at once; else the first records within `wait` s and what came with them."""
        messages = self.consumer.consume(max_records, timeout=0)
        if not messages and wait > 0:
            messages = self.consumer.consume(1, timeout=wait)
            if messages:
                messages += self.consumer.consume(max_records - 1, timeout=0)
        if not messages:
            return None
        batch = self._all_at_once(messages)
        if batch is not None:
            return batch
        chunk = Chunk()
        for message in messages:
            p = message.partition()
            error = message.error()
            if error is not None:
                self._handle(p, error, message)
                continue
            offset = message.offset()
            if p not in self.position or offset < self.position[p]:
                continue
            chunk.add(message, p, offset)
            self.position[p] = offset + 1
            self.at_end.discard(p)
        return chunk.batch(self.topic) if len(chunk) else None

    def _all_at_once(self, messages: list) -> pa.RecordBatch | None:
        """A poll of records only, each partition's from its position on, taken column by column
        (the usual poll while there is a backlog); None for any other, which goes message by
        message. A partition's records come in order, so its first says whether any was read."""
        if any([m.error() is not None for m in messages]):
            return None
        partitions = [m.partition() for m in messages]
        offsets = [m.offset() for m in messages]
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for p, offset in zip(partitions, offsets, strict=True):
            first.setdefault(p, offset)
            last[p] = offset
        if any(p not in self.position or offset < self.position[p] for p, offset in first.items()):
            return None
        for p, offset in last.items():
            self.position[p] = offset + 1
            self.at_end.discard(p)
        keys = [m.key() for m in messages]
        values = [m.value() for m in messages]
        stamps = [m.timestamp()[1] for m in messages]
        return to_arrow(self.topic, keys, values, partitions, offsets, stamps)

    def _handle(self, p: int, error: KafkaError, message) -> None:
        code = error.code()
        if p not in self.position:
            if error.fatal():
                raise KafkaException(error)
            return  # a client-wide notice
        if code == KafkaError._PARTITION_EOF:
            self.position[p] = max(self.position[p], message.offset())
            self.at_end.add(p)
            return
        if code not in _GONE:
            if error.fatal() or not error.retriable():
                raise KafkaException(error)
            return  # transient: librdkafka retries by itself
        problem = f"records {self.topic}-{p} from offset {self.position[p]} are no longer on the broker ({error.str()})"
        if self.fail_on_data_loss:
            raise data_loss(problem)
        log.warning("skipping lost records: %s", problem)
        low, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=self.timeout, cached=False)
        # Past its end, the partition is a new one (the topic was re-created): read from its start;
        # kept, the position was asked for again and again.
        if self.position[p] > high:
            self.position[p] = low
            self.went_back.add(p)
        else:
            self.position[p] = max(self.position[p], low)
        # After an offset-out-of-range error the partition's fetcher refuses seek(): a new assignment restarts it.
        self.consumer.assign([TopicPartition(self.topic, q, o) for q, o in sorted(self.position.items())])

    def close(self) -> None:
        self.consumer.unassign()
