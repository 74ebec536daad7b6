"""A task's state stores: opened at its start (from this worker's cache, restored from the changelog,
the records the changelog does not reflect replayed), their changes sent at its checkpoint, kept in
the worker's cache at its end. The state's whole life in a task, in the order it is lived.

The per-worker cache of stores is `state.cache`; what is kept there is checked by its next catch-up."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import pyarrow as pa
import structlog

from detectorkit.kafka import offset_store, range_reader
from detectorkit.kafka import sink as sinks
from detectorkit.kafka.planning import PartitionRange
from detectorkit.kafka.source_options import SourceOptions
from detectorkit.runtime.batches import by_partition, stamps_ms
from detectorkit.runtime.stage import KeyedBatch, Output, Source
from detectorkit.runtime.task_context import PartitionSummary, TaskContext
from detectorkit.state import cache
from detectorkit.state.codec import INPUT_OFFSET_HEADER, tag_of
from detectorkit.state.store import EVENT_TIME_KEY, PartitionStore

_log = structlog.get_logger("detectorkit.state")


@dataclass
class TaskStores:
    """The state stores of a task's partitions, and each partition's tag: the end of its range,
    the input offset its changes reflect."""

    stores: dict[int, PartitionStore]
    tags: dict[int, int]
    restored: dict[int, tuple[int, float]]  # changelog records read to open it, and the seconds it took
    idle: set[int]  # partitions planned with nothing to read: a tick, for their timers
    # The wall clock (ms) at which the idle partitions were seen to have nothing to read; None: now.
    quiet_seen_ms: int | None = None
    replayed: dict[int, int] = field(default_factory=dict)  # input records replayed into the store to open it
    caught_up: set[int] = field(default_factory=set)  # partitions read to their end: nothing waits behind them
    # The changelog record each partition's changes ended with, (key, value, tag): where the store
    # expects it is checked by its next catch-up (`keep`, state.cache).
    last_written: dict[int, tuple[str, bytes | None, int | None]] = field(default_factory=dict)

    # ---- open -------------------------------------------------------------------------------

    @classmethod
    def open(cls, ctx: TaskContext, ranges: list[PartitionRange], source: SourceOptions | None = None) -> TaskStores:
        """Each partition's store, reflecting its input up to the range's start (the group's committed
        offset): restored from the changelog first when this worker's copy is not that. The changelog
        may reflect less (a flush interval, now or in the deployment before: the group's commit says
        how much, whatever the settings are now), and the records from there to the start are replayed
        into the store from the `source`; under exactly-once, inside the task's transactions."""
        idle = {r.partition for r in ranges if r.size == 0}
        wanted = {r.partition: (r.start, r.tick) for r in ranges}
        durable = None
        if source is not None:

            def durable(behind: list[int]) -> dict[int, int | None]:
                return offset_store.committed_durable(source.client_conf, source.group, source.topic, behind, ctx.state.timeout)

        opened = cache.open_stores(ctx.state, ctx.stage.state, wanted, durable)
        replays = [
            PartitionRange(r.topic, r.partition, opened[r.partition].replay_from, r.start)
            for r in ranges
            if opened[r.partition].replay_from is not None
        ]
        replayed = {}
        if replays:
            replayed = _replay(ctx, source, {p: o.store for p, o in opened.items()}, replays)
            for r in replays:
                store = opened[r.partition].store
                store.position, store.tick = wanted[r.partition]
                # Written at this task's end, whatever the interval: a partition that keeps changing
                # worker (a cluster's executors) would otherwise replay ever more, from a changelog
                # that never moves.
                store.flushed_at = float("-inf")
        for p, o in opened.items():
            if o.restored or o.seconds:
                _log.info(
                    "state restored",
                    partition=p,
                    changelog_records=o.restored,
                    keys=len(o.store),
                    seconds=round(o.seconds, 3),
                    rebuilt=o.rebuilt,
                    worker_pid=os.getpid(),  # Spark runs a partition's tasks in whichever of its Python workers is free
                )
        stores = {p: o.store for p, o in opened.items()}
        tags = {r.partition: r.end for r in ranges}
        restored = {p: (o.restored, o.seconds) for p, o in opened.items()}
        seen = min((r.tick_ms for r in ranges if r.partition in idle and r.tick_ms is not None), default=None)
        return cls(stores, tags, restored, idle, seen, replayed, {r.partition for r in ranges if r.caught_up})

    # ---- step 2: the timers of partitions with nothing to read --------------------------------

    def fire_idle(self, ctx: TaskContext) -> Iterator[tuple[int, list[Output]]]:
        """The timers of partitions with nothing to read in this batch (a tick of the source's planner)
        fire as the wall clock minus the grace passes them: no record says how far their event time got.
        The clock is read when they were seen quiet: a record written since is stamped after that."""
        now_ms = time.time() * 1000
        seen = min(self.quiet_seen_ms, now_ms) if self.quiet_seen_ms is not None else now_ms
        idle_ms = int(seen - ctx.state.idle_grace_seconds * 1000)
        empty = pa.array([], pa.binary())
        for p in self.idle:
            tick = KeyedBatch(empty, empty, np.array([], "int64"), None, self.stores[p], self.tags[p], ctx.state.input_topic, idle_ms)
            found, _ = ctx.stage.run_keyed(tick, ctx.config, ctx.service)
            yield p, found

    # ---- step 4: the changes ------------------------------------------------------------------

    def flush_due(self, ctx: TaskContext, p: int, now: float) -> bool:
        """Every batch without an interval; else once it has passed, and whenever the partition was
        read to its end: the interval only saves work while a backlog is read, and a partition that then
        goes quiet must not keep its changes for a replay from input that retention may delete. After
        a tick too: timers fired by the wall clock are not in the input, and a replay could not repeat them."""
        interval = ctx.state.flush_interval_seconds
        return interval <= 0 or p in self.idle or p in self.caught_up or now - self.stores[p].flushed_at >= interval

    def send_changes(self, ctx: TaskContext, sink: sinks.Sink, p: int, summaries: dict[int, PartitionSummary], send: bool = True) -> None:
        """The partition's state changes to its changelog partition if `send`, and its state summary."""
        store, tag = self.stores[p], self.tags[p]
        expired = written = 0
        if send:
            expired = store.expire(tag)
            changes = store.take_changes()
            # A value carries its batch's offset (state.codec); a tombstone and the event time, in a header.
            event = [changes.pop()] if changes and changes[-1][0] == EVENT_TIME_KEY else []
            values = [c for c in changes if c[1] is not None]
            headed = [c for c in changes if c[1] is None] + event
            # The record sent last lands last (one producer, one partition, in order); send_batch may
            # reorder its own when the local queue fills, so the last value goes alone when it is last.
            if values:
                sink.send_batch(ctx.state.topic, p, values if headed else values[:-1])
            if headed:
                sink.send_all(ctx.state.topic, p, headed, [(INPUT_OFFSET_HEADER, str(tag).encode())])
                self.last_written[p] = (headed[-1][0], headed[-1][1], tag)
            elif values:
                sink.send_all(ctx.state.topic, p, values[-1:], None)
                self.last_written[p] = (values[-1][0], values[-1][1], tag_of(None, values[-1][1]))
            written = len(changes) + len(event)
        restored, seconds = self.restored[p]
        summaries[p].state = {
            "keys": len(store),
            "bytes": store.bytes,
            "written": written,
            "expired": expired,
            "restored": restored,
            "restore_seconds": seconds,
            "replayed": self.replayed.get(p, 0),
            "late": store.late,
        }
        store.late = 0
        # Counted once: a slice's task sends its changes at every checkpoint, and reports each.
        self.restored[p], self.replayed[p] = (0, 0.0), 0

    # ---- step 6: kept -------------------------------------------------------------------------

    def keep(self, ctx: TaskContext, summaries: dict[int, PartitionSummary]) -> None:
        for p, store in self.stores.items():
            # It reflects the input to the range's end, at the range's tick (opening it set that), also
            # when the batch changed none of its keys: the next task, starting there, finds it current.
            store.position = self.tags[p]
            written = summaries[p].state["written"]
            if written:
                # Its changes follow what it had read or written (only the partition's task writes its
                # changelog partition), so a later catch-up need not read them back: a partition still
                # moves between Python workers now and then (on a cluster, or as the claims of
                # kafka.claims even out), and each catch-up read both workers' changes before this. A
                # zombie's writes (at-least-once: a paused instance's task) may come between, so this
                # is a guess: the catch-up checks the last change is where it is expected (state.cache).
                last = store.changelog_offset + written - 1
                store.last_written = (last, *self.last_written[p])
                # With exactly-once, the transaction's commit marker comes next.
                store.changelog_offset = last + 1 + int(ctx.exactly_once)
            cache.keep(ctx.state, store)


def _replay(ctx: TaskContext, source: SourceOptions, stores: dict[int, PartitionStore], ranges: list[PartitionRange]) -> dict[int, int]:
    """The records of `ranges` through the detector into the stores, their outputs dropped: they
    were written when the records were first read; only the state they made was not (it was
    waiting for the interval's flush in a worker that no longer runs the partition)."""
    began = time.monotonic()
    ends = {r.partition: r.end for r in ranges}
    read = Counter()
    for p, part in by_partition(range_reader.read_planned(source, ranges)):
        stamps = stamps_ms(part).to_numpy()
        nowhere = partial(Source, source.topic, p, -1)  # never written: the outputs are dropped
        batch = KeyedBatch(part.column("value"), part.column("key"), stamps, nowhere, stores[p], ends[p], source.topic)
        ctx.stage.run_keyed(batch, ctx.config, ctx.service)
        read[p] += part.num_rows
    seconds = round(time.monotonic() - began, 3)
    for r in ranges:
        _log.info("state replayed", partition=r.partition, start=r.start, end=r.end, records=read[r.partition], seconds=seconds)
    return dict(read)
