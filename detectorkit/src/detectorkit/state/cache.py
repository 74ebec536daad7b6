"""The stores of a worker process: one per changelog partition, kept between tasks.

Spark reuses a Python worker for the job's tasks, so a store outlives its task and the next task of
the same partition usually finds it current (its position is the task's start offset) and reads
nothing from Kafka. Otherwise (another worker or instance moved the partition on, or fired its
timers in a tick, or this store holds a batch that was never committed) the store catches up from
the changelog, or is rebuilt from its first record, up to the task's start offset: the group's
committed offset. With a flush interval the changelog may reflect less of the input than that
(`durable`, which the group's commit carries): the store is then read up to there, and the task
replays the records from there to its start (runtime.processing) without writing their outputs.
A store holding changes it has not flushed is never caught up, only rebuilt: what it holds is the
changelog's at no offset.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from detectorkit.state import changelog
from detectorkit.state.changelog import StateContext
from detectorkit.state.declaration import State
from detectorkit.state.store import PartitionStore


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
    opened, reads, tombs = {}, {}, {}
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
            store, reads[p] = PartitionStore(state, p, f"state changelog {ctx.topic}-{p}"), None
        else:
            reads[p] = store.changelog_offset
        opened[p], tombs[p] = Opened(store, 0, 0.0, reads[p] is None), {}
    if reads:
        for p, records in changelog.read(ctx, reads):
            opened[p].restored += opened[p].store.restore(records, until[p], tombs[p])
        seconds = time.monotonic() - began
        for p in reads:
            start, tick = wanted[p]
            opened[p].store.position, opened[p].store.tick = until[p], tick
            opened[p].seconds = seconds
            if until[p] < start:
                opened[p].replay_from = until[p]
    return opened


def held(ctx: StateContext, state: State) -> set[int]:
    """The partitions whose stores this worker holds (current or a catch-up away)."""
    with _lock:
        return {p for topic, p, s in _stores if topic == ctx.topic and s == state}


def current(ctx: StateContext, state: State, wanted: dict[int, tuple[int, int]]) -> set[int]:
    """The partitions of `wanted` (partition -> (start, tick)) whose stores this worker holds as of
    there: a task that runs them reads nothing from the changelog."""
    with _lock:
        held = {p: _stores.get((ctx.topic, p, state), (None, 0.0))[0] for p in wanted}
    return {p for p, store in held.items() if _current(store, wanted[p])}


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
