"""Where a partition store keeps its keys: a key maps to a slot, and each slot's value (the
changelog record), size, event time, tag and timer live in NumPy arrays.

A batch reads and writes its keys with one dictionary lookup each and array operations for the
rest, and a sweep or a timer check is one pass over an array: a store of tuples and heaps did a few
microseconds of Python work per key a batch touched, which measured as more than the detector
itself (py-spy, the stateful benchmark). The values themselves are each key's changelog record
(untyped state), or, for typed state, the declared columns as arrays (`columns.TypedColumns`),
encoded for the changelog only when it is written.

Apart from `store.PartitionStore`, which builds on it, because this is the layout, changed for
speed, and that is the meaning (expiry, timers, the changelog's changes and offsets), changed for
correctness: here a slot is handed out, looked up, grown and freed, and its values read into a
frame; what a key's times mean, and what goes to the changelog, is the store's.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import Any

import numpy as np
import orjson
import pandas as pd

from detectorkit.state.columns import TypedColumns
from detectorkit.state.declaration import KEY, State

# The timer of a key without one (and of a free slot): above every time, so the earliest timer is a minimum.
NO_TIMER = np.iinfo(np.int64).max
# The newest record time of a key not held.
NEVER = np.iinfo(np.int64).min


class Slots:
    """A partition's keys in slots of NumPy arrays, and `bytes`, what their values take."""

    def __init__(self, state: State):
        self.state = state
        self.bytes = 0
        self._slot: dict[str, int] = {}
        self._free: list[int] = []  # slots of deleted keys, reused first
        self._used = 0  # slots handed out: the arrays' prefix that matters
        self._key = np.empty(0, dtype=object)
        self._value = np.empty(0, dtype=object)  # the changelog value, decoded afresh on every read
        self._size = np.empty(0, dtype=np.int64)
        self._seen = np.empty(0, dtype=np.int64)  # the key's newest record time
        self._tag = np.empty(0, dtype=np.int64)  # the input offset (batch end) of the change that wrote it
        self._timer = np.empty(0, dtype=np.int64)
        self._live = np.empty(0, dtype=bool)
        self._typed = None if state.types is None else TypedColumns(state.types)
        self._grow(0)  # never empty: a lookup takes the arrays at every slot, -1 (not held) too, and masks those
        self._generation = 0  # moves whenever a key gets or loses a slot
        self._looked_up: tuple[Sequence[str], int, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self._slot)

    def _slots_of(self, keys: Sequence[str]) -> np.ndarray:
        """Each key's slot, -1 for a key not held. A batch reads, then prepares, the same keys: the
        second lookup is the first's, while no key got or lost a slot in between."""
        last = self._looked_up
        if last is not None and last[0] is keys and last[1] == self._generation:
            return last[2]
        slots = np.fromiter(map(self._slot.get, keys, repeat(-1)), dtype=np.int64, count=len(keys))
        self._looked_up = (keys, self._generation, slots)
        return slots

    def lists_of(self, keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]]]:
        """(slots, each key's newest record time (NEVER: not held), each list column's values end
        to end with each key's length) of `keys` (distinct), for a detector that runs on them
        itself (`in_store`); typed state of list columns only."""
        from detectorkit.state import compiled_rows  # numba: loaded already by such a detector

        slots = self._slots_of(keys)
        held = slots >= 0
        seen = np.where(held, self._seen[slots], NEVER)
        columns = {}
        for name, (values, lengths) in self._typed.gathered(slots[held], compiled_rows).items():
            every = np.zeros(len(keys), dtype=np.int64)
            every[held] = lengths
            columns[name] = (values, every)
        return slots, seen, columns

    def _frame(self, keys: list[str], slots: np.ndarray) -> pd.DataFrame:
        if self._typed is not None:
            return self._typed.frame(slots, keys, KEY)
        columns, loads = self.state.columns, orjson.loads
        states = [loads(v)["state"] for v in self._value[slots].tolist()]  # codec.state_of, inlined: once per key a batch reads
        return pd.DataFrame({c: [s[c] for s in states] for c in columns}, index=pd.Index(keys, dtype=object, name=KEY), columns=list(columns))

    def _place(self, keys: list[str], slots: np.ndarray) -> np.ndarray:
        """The slots of `keys` (distinct; `slots`: as looked up), new keys given free slots or new ones."""
        new = np.flatnonzero(slots < 0)
        if not len(new):
            return slots
        self._generation += 1
        slots = slots.copy()
        fresh = [keys[i] for i in new.tolist()]
        reused = min(len(fresh), len(self._free))
        given = self._free[len(self._free) - reused :]
        del self._free[len(self._free) - reused :]
        count = len(fresh) - reused
        if self._used + count > len(self._live):
            self._grow(self._used + count)
        given += range(self._used, self._used + count)
        self._used += count
        self._slot.update(zip(fresh, given, strict=True))
        slots[new] = given
        self._key[given] = fresh
        self._live[given] = True
        return slots

    def _grow(self, needed: int) -> None:
        capacity = max(1024, 2 * len(self._live), needed)

        def grown(array: np.ndarray, fill: Any) -> np.ndarray:
            bigger = np.full(capacity, fill, dtype=array.dtype)
            bigger[: len(array)] = array
            return bigger

        self._key, self._value = grown(self._key, None), grown(self._value, None)
        self._size, self._seen, self._tag = grown(self._size, 0), grown(self._seen, 0), grown(self._tag, -1)
        self._timer, self._live = grown(self._timer, NO_TIMER), grown(self._live, False)
        if self._typed is not None:
            self._typed.grow(capacity)

    def _remove(self, key: str) -> None:
        slot = self._slot.pop(key, None)
        if slot is None:
            return
        self._generation += 1
        self.bytes -= int(self._size[slot])
        self._key[slot] = self._value[slot] = None
        self._size[slot] = 0
        self._timer[slot] = NO_TIMER
        self._live[slot] = False
        if self._typed is not None:
            self._typed.free(slot)
        self._free.append(slot)
