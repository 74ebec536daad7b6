"""The stores of a worker process: one per changelog partition, kept between tasks.

Spark reuses a Python worker for the job's tasks, so a store outlives its task and the next task of
the same partition usually finds it current (its position is the task's start offset) and reads
nothing from Kafka. Otherwise (another worker or instance moved the partition on, or fired its
timers in a tick, or this store holds a batch that was never committed) the store catches up from
the changelog, or is rebuilt from its first record, up to the task's start offset: the group's
committed offset.
"""

from __future__ import annotations

import threading
import time
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


# Keyed by the declaration too: a detector that declares other state never reads this one's store.
_stores: dict[tuple[str, int, State], tuple[PartitionStore, float]] = {}
_lock = threading.Lock()


def open_stores(ctx: StateContext, state: State, wanted: dict[int, tuple[int, int]]) -> dict[int, Opened]:
    """Each partition's store, reflecting its input up to the start offset and the source's ticks
    up to the tick of `wanted` (partition -> (start, tick); timers fired on a quiet partition change
    state at the same offset). The stores not current here are read from the changelog together,
    through one assignment: a task's partitions cost one round of fetches, not one each."""
    began = time.monotonic()
    with _lock:
        _drop_idle(ctx.idle_seconds, began)
        cached = {p: _stores.pop((ctx.topic, p, state), (None, 0.0))[0] for p in wanted}
    opened, reads, tombs = {}, {}, {}
    for p, (start, tick) in wanted.items():
        store = cached[p]
        if store is not None and (store.position, store.tick) == (start, tick):
            opened[p] = Opened(store, 0, 0.0)
            continue
        if store is None or (store.position, store.tick) > (start, tick):
            store, reads[p] = PartitionStore(state, p, f"state changelog {ctx.topic}-{p}"), None
        else:
            reads[p] = store.changelog_offset
        opened[p], tombs[p] = Opened(store, 0, 0.0, reads[p] is None), {}
    if reads:
        for p, records in changelog.read(ctx, reads):
            opened[p].restored += opened[p].store.restore(records, wanted[p][0], tombs[p])
        seconds = time.monotonic() - began
        for p in reads:
            opened[p].store.position, opened[p].store.tick = wanted[p]
            opened[p].seconds = seconds
    return opened


def held(ctx: StateContext, state: State) -> set[int]:
    """The partitions whose stores this worker holds (current or a catch-up away)."""
    with _lock:
        return {p for topic, p, s in _stores if topic == ctx.topic and s == state}


def current(ctx: StateContext, state: State, wanted: dict[int, tuple[int, int]]) -> set[int]:
    """The partitions of `wanted` (partition -> (start, tick)) whose stores this worker holds as of
    there: a task that runs them reads nothing from the changelog."""
    with _lock:
        held = {p: _stores.get((ctx.topic, p, state)) for p in wanted}
    return {p for p, entry in held.items() if entry is not None and (entry[0].position, entry[0].tick) == wanted[p]}


def keep(ctx: StateContext, store: PartitionStore) -> None:
    """Back in the worker's cache once its task has written everything: a store whose task failed
    is not kept (it may hold changes the changelog never got), and the next task restores it."""
    with _lock:
        _stores[(ctx.topic, store.partition, store.state)] = (store, time.monotonic())


def _drop_idle(idle_seconds: float, now: float) -> None:
    for key in [k for k, (_, used) in _stores.items() if now - used >= idle_seconds]:
        del _stores[key]
