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


# Keyed by the declaration too: a detector that declares other state never reads this one's store.
_stores: dict[tuple[str, int, State], tuple[PartitionStore, float]] = {}
_lock = threading.Lock()


def open_store(ctx: StateContext, state: State, partition: int, start: int, tick: int = 0) -> Opened:
    """Partition `partition`'s store, reflecting its input up to offset `start` and the source's
    ticks up to `tick` (timers fired on a quiet partition change state at the same offset)."""
    began = time.monotonic()
    key = (ctx.topic, partition, state)
    with _lock:
        _drop_idle(ctx.idle_seconds, began)
        store, _ = _stores.pop(key, (None, 0.0))
    if store is not None and (store.position, store.tick) == (start, tick):
        return Opened(store, 0, 0.0)
    if store is None or (store.position, store.tick) > (start, tick):
        store, first = PartitionStore(state, partition, f"state changelog {ctx.topic}-{partition}"), None
    else:
        first = store.changelog_offset
    read = store.restore(changelog.read(ctx, partition, first), start)
    store.position, store.tick = start, tick
    return Opened(store, read, time.monotonic() - began)


def keep(ctx: StateContext, store: PartitionStore) -> None:
    """Back in the worker's cache once its task has written everything: a store whose task failed
    is not kept (it may hold changes the changelog never got), and the next task restores it."""
    with _lock:
        _stores[(ctx.topic, store.partition, store.state)] = (store, time.monotonic())


def _drop_idle(idle_seconds: float, now: float) -> None:
    for key in [k for k, (_, used) in _stores.items() if now - used >= idle_seconds]:
        del _stores[key]
