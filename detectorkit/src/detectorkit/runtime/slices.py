"""Slices (SLICE_SECONDS): Spark tasks that read, detect, write and commit until a deadline, so
Spark's scheduling of a batch is paid once a slice rather than once every few hundred
milliseconds, and a record waits for a poll, a detection and a produce instead of for a batch.

A slice is one micro-batch of a query over Spark's rate source, which only ticks (no Python data
source plans it): its foreachBatch runs a task per core over the partitions this instance owns,
from the positions the last slice ended at (the group's committed offsets at first). Each task
loops until the slice's deadline, or until the driver says to end (runtime.slice_control: a
rebalance, a stop):
  1. poll what has arrived (a short wait when nothing has) and process it as a batch's task does
     (runtime.processing), detections and dead letters sent as they are found;
  2. every tick, the timers of its quiet partitions fire as the wall clock passes them;
  3. every SLICE_COMMIT_INTERVAL_SECONDS, and at the end, the checkpoint of runtime.checkpoint over
     what was read since the last one: outputs flushed, state changes written, and with exactly-once
     the task's transaction committed with its positions and the next one begun (as Kafka Streams
     commits every 100 ms under exactly-once); then it reports its positions to the driver,
     with what it wrote since its last report, which the driver counts into the job's metrics.
With at-least-once the driver commits the positions each report brings, every commit interval as
they move, and the last ones once the slice ends, as after a batch (runtime.driver_checkpoint). A
slice that ends early, or a task that fails, loses nothing: what was not committed is read again by
the partitions' next reader."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import structlog

from detectorkit.kafka import claims, range_reader
from detectorkit.kafka.claims import Claim
from detectorkit.kafka.planning import PartitionRange
from detectorkit.kafka.position_reader import PositionReader
from detectorkit.kafka.source_options import SourceOptions
from detectorkit.runtime import checkpoint
from detectorkit.runtime.processing import fire_quiet, process_chunk, setup_worker, summary_batch, take_claimed, take_counts
from detectorkit.runtime.slice_control import Link
from detectorkit.runtime.task_context import PartitionSummary, TaskContext
from detectorkit.runtime.task_result import NO_PARTITION, TaskResult
from detectorkit.runtime.task_stores import TaskStores
from detectorkit.runtime.writers import AtLeastOnceWriter, CommitsFailed, TransactionalWriter, Writer

_log = structlog.get_logger("detectorkit.job")

# The longest a task waits for records in one poll: how late it sees the driver's word to end.
_MAX_WAIT_SECONDS = 0.1
# The most records a poll takes at once. A stateful detector pays per call for each distinct key of
# a partition's records (its state read, decoded and written), and a backlog of many keys repeats
# few of them within a small chunk; a chunk is still a few tens of MiB, and a checkpoint comes
# between two. A stateless one pays per record, so a bigger poll gains it nothing, and its workers'
# peak memory is a poll parsed with its detections.
STATEFUL_POLL_RECORDS = 80_000
STATELESS_POLL_RECORDS = 20_000


@dataclass(frozen=True)
class SliceSpec:
    """What the driver hands a slice's tasks."""

    source: SourceOptions
    positions: dict[int, int]  # each partition's next offset
    tasks: int
    seconds: float
    commit_interval_seconds: float
    # The slice's start (epoch ms), as a planned range's tick: a store knows it is current by
    # (offset, tick), and a slice may fire timers without moving the offset.
    tick: int
    tick_seconds: float | None
    control: tuple[str, int]
    token: str
    claims: tuple[Claim, ...] | None = None
    # Exactly-once: partitions whose committed offset is their position here, committed in this
    # generation by the previous slice's task, which returned (kafka.transactions.for_task).
    known: frozenset[int] = frozenset()
    # A task whose loop stood still this long (a paused instance, a frozen VM, a detector call as
    # long) may have lost its partitions meanwhile: it ends its slice before it goes on (_Loop.run).
    pause_seconds: float = math.inf


def plan(
    source: SourceOptions,
    positions: dict[int, int],
    tasks: int,
    seconds: float,
    interval: float,
    tick_seconds: float | None,
    control: tuple[str, int],
    token: str,
    known: frozenset[int] = frozenset(),
    pause_seconds: float = math.inf,
) -> SliceSpec:
    """The next slice's spec; with claims (a stateful or exactly-once job in local mode) each task
    claims its share as it starts, the partitions whose stores its worker holds first."""
    tick = int(time.time() * 1000)
    ranges = _ranges(source.topic, positions, tick)
    found = None
    if source.claims_dir and tasks > 1:
        sticky = source.group_metadata is not None
        found = tuple(claims.claims_for(source.claims_dir, ranges, tasks, sticky=sticky))
    known = known & set(positions)
    return SliceSpec(source, dict(positions), tasks, seconds, interval, tick, tick_seconds, control, token, found, known, pause_seconds)


class SlicePositions:
    """The driver's side: where each partition's next slice starts, which is where the last one's
    tasks ended, and (exactly-once) which of those their transactions committed."""

    def __init__(self, start: dict[int, int]):
        self.next = dict(start)
        self.known: frozenset[int] = frozenset()
        # Partitions a reader took back to their start (past their end: a topic created again,
        # kafka.position_reader), since the driver last saw the input topic's id.
        self._went_back: set[int] = set()

    def began(self) -> None:
        self.known = frozenset()  # a slice that fails leaves nothing known

    def ended(self, results: list[TaskResult], exactly_once: bool) -> None:
        returned: dict[int, int] = {}
        for r in results:
            if r.partition != NO_PARTITION and not r.error:
                returned[r.partition] = max(returned.get(r.partition, -1), r.next_offset)
                if r.went_back:
                    # Behind where it was planned, and kept so: from the planned position the next
                    # slice's reader would go past the new topic's end again, and back, each slice.
                    self._went_back.add(r.partition)
        for p, o in returned.items():
            self.next[p] = o if p in self._went_back else max(self.next.get(p, -1), o)
        # Exactly-once: each of these is committed at its position by a task that returned, so the
        # next slice's tasks need not read it back (kafka.transactions.for_task).
        self.known = frozenset(returned) if exactly_once else frozenset()

    def input_checked(self, recreated: bool | None) -> dict[int, int] | None:
        """The input topic's id was looked at (runtime.partition_owner.input_recreated; None: it is not
        there). None unless it is a new topic; then where each partition starts on it: its first
        record, but where a reader that already went back to it got to."""
        if recreated is False:
            self._went_back.clear()
        if not recreated:
            return None
        self.next = {p: o if p in self._went_back else 0 for p, o in self.next.items()}
        self.known, self._went_back = frozenset(), set()
        return dict(self.next)


def _ranges(topic: str, positions: dict[int, int], tick: int) -> list[PartitionRange]:
    return [PartitionRange(topic, p, o, o, tick=tick) for p, o in sorted(positions.items())]


def run_slice(ctx: TaskContext, spec: SliceSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A `mapInArrow` function over `spark.range(tasks)`: the task whose index it is given."""
    setup_worker(ctx)
    indexes = [i for b in batches for i in b.column(0).to_pylist()]
    if not indexes:
        return
    ranges = _mine(ctx, spec, int(indexes[0]))
    if not ranges:
        return
    link = Link(spec.control, spec.token, spec.source.timeout)
    try:
        yield from _run(ctx, spec, ranges, link)
    finally:
        link.close()


def _mine(ctx: TaskContext, spec: SliceSpec, index: int) -> list[PartitionRange]:
    ranges = _ranges(spec.source.topic, spec.positions, spec.tick)
    if spec.claims is None:
        return ranges[index :: spec.tasks]
    return take_claimed(ctx, spec.source, spec.claims[index], ranges)


def _run(ctx: TaskContext, spec: SliceSpec, ranges: list[PartitionRange], link: Link) -> Iterator[pa.RecordBatch]:
    source = spec.source
    writer = TransactionalWriter(ctx, source, ranges, known_committed(spec)) if ctx.exactly_once else AtLeastOnceWriter(ctx)
    summaries: dict[int, PartitionSummary] = {}
    done = {r.partition: r.start for r in ranges}
    failed = None
    with writer:
        stores = TaskStores.open(ctx, ranges, source) if ctx.state is not None else None
        with range_reader.worker_reader(source) as consumer:
            reader = PositionReader(consumer, source.topic, dict(done), source.fail_on_data_loss, source.timeout)
            try:
                failed = _Loop(ctx, spec, reader, writer, stores, summaries, done, link).run()
            finally:
                reader.close()
            for p in reader.went_back:
                summaries.setdefault(p, PartitionSummary()).went_back = True
    lost = failed.partitions if failed is not None else frozenset()
    for p in lost:
        summaries.pop(p, None)
    for p, position in done.items():
        if p not in lost:
            summaries.setdefault(p, PartitionSummary()).next_offset = position
    yield summary_batch(summaries, time.time() * 1000, None if failed is None else str(failed))


def ends_at(spec: SliceSpec, monotonic_now: float, wall_now: float) -> float:
    """When a task's slice ends, on its monotonic clock: at the end the driver planned, the same for
    every task of the slice. Each counting from its own start, a task that started later (the first
    slice's tasks set up their workers and producers one after the other) ended later too, and the
    partitions of those that had ended went unread until the batch ended with the last. At least
    half a slice, so a task that starts late, or on a machine whose clock is off, still does its share."""
    left = spec.tick / 1000 + spec.seconds - wall_now
    return monotonic_now + min(spec.seconds, max(spec.seconds / 2, left))


def known_committed(spec: SliceSpec, attempt: int | None = None) -> frozenset[int]:
    """What this task may take as committed without reading it: nothing in a retried attempt, whose
    forerunner may have committed further before it failed."""
    if attempt is None:
        from pyspark import TaskContext as SparkTaskContext

        found = SparkTaskContext.get()
        attempt = found.attemptNumber() if found is not None else 0
    return spec.known if attempt == 0 else frozenset()


@dataclass
class _Loop:
    ctx: TaskContext
    spec: SliceSpec
    reader: PositionReader
    writer: Writer
    stores: TaskStores | None
    summaries: dict[int, PartitionSummary]
    done: dict[int, int]  # each partition's position as of the last checkpoint: what may be committed
    link: Link
    reported_at_end: set[int] = dataclasses.field(default_factory=set)

    def run(self) -> CommitsFailed | None:
        spec, reader = self.spec, self.reader
        now = time.monotonic()
        deadline = ends_at(spec, now, time.time())
        # Due as soon as there is something to write: what arrived between slices has waited already.
        next_checkpoint = now
        ticking = self.stores is not None and spec.tick_seconds
        next_tick = now + spec.tick_seconds if ticking else math.inf
        quiet = set(reader.position)
        changed = False
        most = STATEFUL_POLL_RECORDS if self.stores is not None else STATELESS_POLL_RECORDS
        chunk = min(most, spec.source.max_records_per_batch or most)
        polled_at = now
        while True:
            ending = self.link.ended() or time.monotonic() >= deadline
            stood_still = False
            if not ending:
                # Waiting for records, until what is due next: a checkpoint only once there is something to write.
                due = min(next_checkpoint if changed else math.inf, next_tick, deadline)
                wait = min(_MAX_WAIT_SECONDS, max(0.0, due - time.monotonic()))
                before = reader.mark()
                batch = reader.poll(wait, chunk)
                # This task since its last poll (in it, or processing what it gave), or its driver
                # since it last said it was there: the group may have given these partitions to
                # another member meanwhile, and the driver not have heard yet. What was processed
                # is checkpointed (the driver commits it only if it still owns them); what was
                # just polled is left to whoever owns them now.
                still = max(time.monotonic() - polled_at, self.link.silent_for())
                stood_still = still > spec.pause_seconds
                if stood_still:
                    _log.warning("the task or its driver stood still for half the group's session timeout: the slice ends", seconds=round(still, 1))
                    reader.rewind(before)
                    batch, ending = None, True
                polled_at = time.monotonic()
                if batch is not None:
                    self._process(batch)
                    quiet -= set(np.unique(batch.column("partition").to_numpy()).tolist())
                    changed = True
            now = time.monotonic()
            if now >= next_tick and not stood_still:
                changed |= self._fire_quiet(quiet & reader.at_end)
                quiet, next_tick = set(reader.position), now + spec.tick_seconds
            moved = changed or reader.position != self.done or reader.at_end != self.reported_at_end
            if ending or (now >= next_checkpoint and moved):
                failed = self._checkpoint(last=ending)
                if failed is not None:
                    return failed
                # From the checkpoint's start, as Kafka Streams counts its commit interval: from
                # its end, each commit's own time was added to every record's wait.
                changed, next_checkpoint = False, now + spec.commit_interval_seconds
            if ending:
                return None

    def _process(self, batch: pa.RecordBatch) -> None:
        process_chunk(self.ctx, [batch], self.writer, self.stores, self.summaries, self.reader.position)

    def _fire_quiet(self, quiet: set[int]) -> bool:
        """Fires the quiet partitions' timers; True if there were any (their state may have changed)."""
        self.stores.idle = quiet
        fire_quiet(self.ctx, self.stores, self.writer, self.summaries)
        return bool(quiet)

    def _checkpoint(self, last: bool = False) -> CommitsFailed | None:
        ends = dict(self.reader.position)
        stores = self.stores
        if stores is not None:
            stores.tags.update(ends)
            stores.caught_up = set(self.reader.at_end)
            for p in stores.stores:
                self.summaries.setdefault(p, PartitionSummary())
        failed = checkpoint.TaskCheckpoint(self.ctx, self.writer, stores, self.summaries, ends).commit()
        if failed is not None:
            return failed
        now_ms = time.time() * 1000
        for s in self.summaries.values():
            s.latencies.extend((now_ms - ts) / 1000 for ts in s.detected_at)
            s.detected_at.clear()
        self.done.update(ends)
        if stores is not None:
            stores.idle = set()
        if not last:
            # Not after the last: the worker keeps the producer for the next slice, which begins its own.
            self.writer.begin_next()
        durable = {p: s.durable for p, s in self.summaries.items() if s.durable is not None}
        self.link.report(ends, self.reader.at_end, durable, take_counts(self.summaries))
        self.reported_at_end = set(self.reader.at_end)
        return None
