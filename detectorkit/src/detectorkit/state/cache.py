"""The stores of a worker process: one per changelog partition, kept between tasks.

Spark reuses a Python worker for the job's tasks, so a store outlives its task and the next task of
the same partition usually finds it current (its position is the task's start offset, at the
source's tick) and reads nothing from Kafka. When the source has ticked since (a tick fires the
timers of quiet partitions without moving the offset, and every batch carries the source's newest
tick), a store at the task's start is current still unless another worker ran such a tick: one
ListOffsets for the task's partitions says whether the changelog still ends where the store expects
(Apache Kafka; on Tansu, whose ListOffsets is wrong, it is read instead). Otherwise (another worker
or instance moved the partition on, or fired its timers in a tick, or this store holds a batch that
was never committed) the store catches up from the changelog, or is rebuilt from its first record,
up to the task's start offset: the group's committed offset. With a flush interval the changelog may
reflect less of the input than that (`durable`, which the group's commit carries): the store is then
read up to there, and the task replays the records from there to its start (runtime.processing)
without writing their outputs. A store holding changes it has not flushed is never caught up, only
rebuilt: what it holds is the changelog's at no offset.

A store kept after its task guesses where its own changes landed in the changelog (right after what
it had read, runtime.checkpoint), so a catch-up need not read them back. A zombie (a paused
instance's task, writing after the partition's new owner) breaks the guess, so a catch-up starts at
the store's last change and checks it is there: if another writer's record is, the store is
dropped and rebuilt from the changelog's first record, as it is when its offset is out of range
(the changelog was truncated, or deleted and created again).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from detectorkit.state import changelog
from detectorkit.state.changelog import StateContext
from detectorkit.state.declaration import State
from detectorkit.state.store import PartitionStore

_log = structlog.get_logger("detectorkit.state")


@dataclass
class Opened:
    store: PartitionStore
    restored: int  # changelog records read
    seconds: float
    rebuilt: bool = False  # read from the changelog's start (this worker had no usable copy), not caught up
    replay_from: int | None = None  # the input offset the store reflects, when short of the task's start


# Keyed by the declaration too: a detector that declares other state never reads this one's store.
_stores: dict[tuple[str, int, State], tuple[PartitionStore, float]] = {}
_lock = threading.Lock()


def open_stores(
    ctx: StateContext,
    state: State,
    wanted: dict[int, tuple[int, int]],
    durable: Callable[[list[int]], dict[int, int | None]] | None = None,
) -> dict[int, Opened]:
    """Each partition's store, reflecting its input up to the start offset and the source's ticks
    up to the tick of `wanted` (partition -> (start, tick); timers fired on a quiet partition change
    state at the same offset). The stores not current here are read from the changelog together,
    through one assignment: a task's partitions cost one round of fetches, not one each. `durable`
    gives, for the partitions whose stores are not current, how far each changelog reflects the
    input (None: to the start); a store read up to short of its start says where in `replay_from`."""
    began = time.monotonic()
    with _lock:
        _drop_idle(ctx.idle_seconds, began)
        cached = {p: _stores.pop((ctx.topic, p, state), (None, 0.0))[0] for p in wanted}
    _confirm_ticks(ctx, cached, wanted)
    opened, reads, tombs, checks = {}, {}, {}, {}
    until: dict[int, int] = {}
    behind = [p for p, at in wanted.items() if not _current(cached[p], at)]
    reflected = durable(behind) if durable is not None and behind else {}
    for p, (start, tick) in wanted.items():
        store = cached[p]
        if p not in behind:
            opened[p] = Opened(store, 0, 0.0)
            continue
        until[p] = start if reflected.get(p) is None else min(reflected[p], start)
        if store is None or store.pending or (store.position, store.tick) > (until[p], tick):
            if store is not None:
                _log.warning(
                    "state store rebuilt",
                    partition=f"{ctx.topic}-{p}",
                    reason="it holds changes its changelog has not got" if store.pending else "it is ahead of where its partition starts",
                )
            store, reads[p] = _new(ctx, state, p), None
        elif store.last_written is not None:
            reads[p] = store.last_written[0]  # from its own last change, checked first
            checks[p] = store.last_written
        else:
            reads[p] = store.changelog_offset
        opened[p], tombs[p] = Opened(store, 0, 0.0, reads[p] is None), {}
    if reads:
        reader = changelog.read(ctx, reads)
        for part in reader:
            p, o = part.partition, opened[part.partition]
            expected = checks.pop(p, None)
            if part.out_of_range or (expected is not None and not _lands_first(expected, part.records)):
                _log.warning(
                    "state store rebuilt",
                    partition=f"{ctx.topic}-{p}",
                    reason="its changelog offset is out of range" if part.out_of_range else "another writer's records are among its own",
                )
                o.store, o.rebuilt, tombs[p] = _new(ctx, state, p), True, {}
                reader.restart(p)
                continue
            o.restored += o.store.restore(part.records, until[p], tombs[p])
            if part.end is not None:
                o.store.changelog_offset, o.store.last_written = part.end, None
        seconds = time.monotonic() - began
        for p in reads:
            start, tick = wanted[p]
            opened[p].store.position, opened[p].store.tick = until[p], tick
            opened[p].seconds = seconds
            if until[p] < start:
                opened[p].replay_from = until[p]
    return opened


def _new(ctx: StateContext, state: State, p: int) -> PartitionStore:
    return PartitionStore(state, p, f"state changelog {ctx.topic}-{p}")


def _confirm_ticks(ctx: StateContext, cached: dict[int, PartitionStore | None], wanted: dict[int, tuple[int, int]]) -> None:
    """A store at its task's start whose tick is behind: the source has ticked since its last task.
    Another worker may have run one of those ticks on the partition, firing timers and writing their
    changes; if the changelog still ends where the store expects, nobody wrote there since, and it
    is current at the new tick. One ListOffsets for the task's partitions; no answer (Tansu), and
    the store catches up as any other."""
    ticked = [p for p, (start, tick) in wanted.items() if (s := cached[p]) is not None and s.position == start and s.tick < tick]
    if not ticked:
        return
    ends = changelog.ends(ctx, ticked)
    for p in ticked:
        if ends.get(p) == cached[p].changelog_offset:
            cached[p].tick = wanted[p][1]


def _lands_first(expected: tuple[int, str, bytes | None, int | None], records: list[changelog.Record]) -> bool:
    """The store's last change is the first record read from where it expects it: its changes since
    its last read lie there with nobody else's among them (they all reached the changelog, and the
    offsets up to that one are as many as they are)."""
    offset, key, value, tag = expected
    return bool(records) and records[0] == (key, value, tag, offset)


def held(ctx: StateContext, state: State) -> set[int]:
    """The partitions whose stores this worker holds (current or a catch-up away)."""
    with _lock:
        return {p for topic, p, s in _stores if topic == ctx.topic and s == state}


def current(ctx: StateContext, state: State, wanted: dict[int, tuple[int, int]]) -> set[int]:
    """The partitions of `wanted` (partition -> (start, tick)) whose stores this worker holds as of
    there, or at the start a tick or more behind (current unless another worker ran a tick since:
    `_confirm_ticks`): a task that runs them most likely reads nothing from the changelog."""
    with _lock:
        held = {p: _stores.get((ctx.topic, p, state), (None, 0.0))[0] for p in wanted}
    return {p for p, store in held.items() if store is not None and store.position == wanted[p][0] and store.tick <= wanted[p][1]}


def _current(store: PartitionStore | None, at: tuple[int, int]) -> bool:
    """It reflects the input up to `at` (offset, tick): a task that starts there needs nothing else."""
    return store is not None and (store.position, store.tick) == at


def keep(ctx: StateContext, store: PartitionStore) -> None:
    """Back in the worker's cache once its task has written everything: a store whose task failed
    is not kept (it may hold changes the changelog never got), and the next task restores it."""
    with _lock:
        _stores[(ctx.topic, store.partition, store.state)] = (store, time.monotonic())


def _drop_idle(idle_seconds: float, now: float) -> None:
    for key in [k for k, (_, used) in _stores.items() if now - used >= idle_seconds]:
        del _stores[key]
