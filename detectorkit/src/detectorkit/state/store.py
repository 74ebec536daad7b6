"""One input partition's state, in memory in the process that runs the partition's tasks.

The changelog is the truth; a store is a cache of it that knows how far it reflects both the input
(`position`, the input offset its last change was made at) and the changelog (`changelog_offset`,
the next changelog record it has not seen). A task whose range starts at the store's position needs
nothing from Kafka; any other start means another process (or instance) moved the partition on, or
this store holds a batch that was never committed, and the store catches up or is rebuilt (`cache`).

Expiry is event time: a key's state is gone once the partition's newest record is more than the TTL
past the key's newest record (a key with a pending timer stays until it fires). Keys are swept as
event time advances, oldest first (a heap, so a sweep costs what it removes, not what the store
holds), each with a tombstone for the changelog. Timers are kept with their key's state, in a heap
of their own.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from detectorkit.state import codec
from detectorkit.state.declaration import KEY, State

# A change for the changelog: (key, encoded value or None for a tombstone).
Change = tuple[str, bytes | None]
# A key prepared for `write`: (key, encoded value or None: it loses its state, seen_ms, timer_ms).
Prepared = tuple[str, bytes | None, int, int | None]
# The changelog record that holds the partition's event time (no customer key looks like it): a
# restore gets the time a quiet partition reached from the wall clock, not only its keys' times.
EVENT_TIME_KEY = "\x00detectorkit.event_ms"


# One key's state in a store: (changelog value, newest event time of the key's records, the input
# offset (batch end) of the change that wrote it, its timer or None). The value is decoded afresh on
# every read, so a detector sees exactly what a restore would give it (JSON's types) and cannot change
# the store in place. A plain tuple of atoms, not a NamedTuple: the garbage collector stops tracking
# those, where it would walk every key's entry on each full collection (measured over 1M records
# and a store of ~300,000 keys: 1.4 s of full collections with a NamedTuple, 0.3 s with a tuple).
Entry = tuple[bytes, int, int, int | None]
VALUE, SEEN, TAG, TIMER = range(4)


class PartitionStore:
    def __init__(self, state: State, partition: int, where: str = ""):
        self.state = state
        self.partition = partition
        self.where = where or f"state store partition {partition}"
        self.entries: dict[str, Entry] = {}
        self.position = -1  # input offset reflected; -1: nothing yet
        self.tick = 0  # the source's tick reflected: a tick fires timers without moving the offset
        self.changelog_offset = 0  # next changelog offset to read
        self.event_ms = 0  # the partition's event time: its newest record's
        self.bytes = 0
        self._expiry: list[tuple[int, str]] = []  # (seen_ms, key), stale entries skipped
        self._timers: list[tuple[int, str]] = []  # (timer_ms, key), stale entries skipped
        self._changes: dict[str, bytes | None] = {}
        self._event_written = 0  # the event time the changelog has

    def __len__(self) -> int:
        return len(self.entries)

    # ---- what a batch reads and writes ------------------------------------------------------------

    def read(self, keys: Sequence[str], first_ms: Sequence[int] | np.ndarray | None = None) -> pd.DataFrame:
        """The state of `keys` that have one, indexed by key; a key whose state expired before its
        first record here (`first_ms`, one per key) has none."""
        get, ttl = self.entries.get, self.state.ttl_ms
        # Without a TTL or first times, no key's state has expired.
        firsts = [-math.inf] * len(keys) if ttl is None or first_ms is None else np.asarray(first_ms).tolist()
        ttl = ttl or 0
        found, values = [], []
        for key, first in zip(keys, firsts, strict=True):
            entry = get(key)
            if entry is not None and entry[SEEN] + ttl >= first:
                found.append(key)
                values.append(entry[VALUE])
        if not found:
            return self.state.empty()
        return self._frame(found, [codec.state_of(v) for v in values])

    def prepare(
        self,
        new_state: pd.DataFrame,
        keys: Sequence[str],
        last_ms: Sequence[int] | np.ndarray,
        timers: dict[str, int | None] | None = None,
    ) -> list[Prepared]:
        """Every key of `keys` with the row `new_state` has for it, encoded, or None: it loses its
        state; `last_ms` is each key's newest record time. `timers` sets the timer of each key in it
        (None clears it); the others keep theirs. Raises (and changes nothing) when a value cannot
        be written."""
        columns = self.state.columns
        # Column by column, as Python objects (numbers as int and float, not NumPy's).
        rows = dict(zip(new_state.index.tolist(), zip(*(new_state[c].tolist() for c in columns), strict=True), strict=True)) if len(new_state) else {}
        timers = timers or {}
        if timers:
            stateless = [k for k, at in timers.items() if at is not None and k not in rows]
            if stateless:
                raise ValueError(f"a timer needs state for its key; no new state for {stateless[:3]}")
        get, encode = self.entries.get, codec.encode
        prepared: list[Prepared] = []
        for key, last in zip(keys, np.asarray(last_ms).tolist(), strict=True):
            values = rows.get(key)
            if values is None:
                prepared.append((key, None, last, None))
                continue
            entry = get(key)
            if entry is None:
                seen, timer = last, timers.get(key)
            else:
                seen = last if last > entry[SEEN] else entry[SEEN]
                timer = timers[key] if key in timers else entry[TIMER]
            prepared.append((key, encode(dict(zip(columns, values, strict=True)), seen, timer), seen, timer))
        return prepared

    def write(self, prepared: Iterable[Prepared], tag: int) -> None:
        """What `prepare` gave, into the store and the changes for the changelog."""
        self.position = max(self.position, tag)
        changes = self._changes
        for key, value, seen, timer in prepared:
            if value is None:
                self._delete(key)
            else:
                self._put(key, (value, seen, tag, timer))
                changes[key] = value

    def advance(self, event_ms: int) -> None:
        """The partition's event time moves on (never back)."""
        self.event_ms = max(self.event_ms, int(event_ms))

    def next_timer(self) -> int | None:
        """The earliest pending timer's time."""
        while self._timers:
            at, key = self._timers[0]
            entry = self.entries.get(key)
            if entry is not None and entry[TIMER] == at:
                return at
            heapq.heappop(self._timers)  # stale: moved or cleared
        return None

    def due(self, event_ms: int) -> list[tuple[str, int]]:
        """(key, timer time) of the timers at or before `event_ms`, earliest first; each is cleared
        in the store (its firing writes the key again)."""
        fired: dict[str, int] = {}
        while (at := self.next_timer()) is not None and at <= event_ms:
            _, key = heapq.heappop(self._timers)
            fired.setdefault(key, at)  # once: a key deleted and written again with the same timer is in the heap twice
        return list(fired.items())

    def frame_of(self, keys: Sequence[str]) -> pd.DataFrame:
        """The state of `keys`, each of which has one, indexed by key."""
        return self._frame(list(keys), [codec.state_of(self.entries[k][VALUE]) for k in keys])

    def seen_of(self, key: str) -> int:
        return self.entries[key][SEEN]

    def expire(self, tag: int) -> int:
        """Drop the keys unseen for longer than the TTL before the partition's event time; returns how many."""
        ttl = self.state.ttl_ms
        if ttl is None:
            return 0
        dropped = 0
        while self._expiry and self._expiry[0][0] + ttl < self.event_ms:
            seen, key = heapq.heappop(self._expiry)
            entry = self.entries.get(key)
            if entry is None:
                continue  # deleted since
            if entry[SEEN] != seen:
                heapq.heappush(self._expiry, (entry[SEEN], key))  # seen since: back in at its newest time
            elif entry[TIMER] is None:
                self._delete(key)
                dropped += 1
            # else: a key with a timer stays until it fires; `_put` brings it back here once it has none.
        self.position = max(self.position, tag)
        return dropped

    def take_changes(self) -> list[Change]:
        """The changes since the last call, one per key (its last), and the event time if it moved."""
        changes, self._changes = self._changes, {}
        if self.event_ms > self._event_written:
            changes[EVENT_TIME_KEY] = str(self.event_ms).encode()
            self._event_written = self.event_ms
        return list(changes.items())

    def clear_timer(self, key: str, tag: int) -> None:
        """`key` loses its timer and keeps its state (its firing failed: a dead letter)."""
        entry = self.entries[key]
        self.write([(key, codec.encode(codec.state_of(entry[VALUE]), entry[SEEN]), entry[SEEN], None)], tag)

    # ---- the changelog read back ------------------------------------------------------------------

    def restore(self, records: Iterable[tuple[str, bytes | None, int | None, int]], until: int, tombs: dict[str, int] | None = None) -> int:
        """Changelog records (key, value, input offset tag, changelog offset) read back, in order,
        onto what the store holds; returns how many were read. A record is applied when it reflects
        input before `until` (the group's committed offset) and is not older than what its key
        holds (a zombie's late write). `tombs` (deleted keys' tags) carries over between the calls
        of one restore read in parts. One loop, the heaps built once at its end: a restore reads
        every key of a partition, and each call and heap push per record shows in its time."""
        entries, state, where = self.entries, self.state, self.where
        tombs = {} if tombs is None else tombs
        decode, get = codec.decode, entries.get
        added: list[tuple[int, str]] = []  # (seen_ms, key) of what was written: the expiry heap's
        timed: list[tuple[int, str]] = []  # (timer_ms, key)
        read, size = 0, self.bytes
        for key, value, tag, offset in records:
            read += 1
            self.changelog_offset = offset + 1
            if tag is not None and tag > until:
                continue  # written by a batch that was never committed: the replay writes it again
            if key == EVENT_TIME_KEY:
                self.event_ms = self._event_written = max(self.event_ms, int(value or b"0"))
                continue
            held = get(key)
            if tag is None:
                tag = -1
            elif tag < (held[TAG] if held is not None else tombs.get(key, -1)):
                continue  # tombs: deleted keys' tags, for the length of this restore
            if held is not None:
                size -= len(held[VALUE])
            if value is None:
                entries.pop(key, None)
                tombs[key] = tag
                continue
            _, seen, timer = decode(value, state, where)  # a shape the detector cannot read stops here
            entries[key] = (value, seen, tag, timer)
            size += len(value)
            added.append((seen, key))
            if timer is not None:
                timed.append((timer, key))
            if seen > self.event_ms:
                self.event_ms = seen
        self.bytes = size
        if self.state.ttl_ms is not None:
            self._expiry = _merged(self._expiry, added)
        self._timers = _merged(self._timers, timed)
        return read

    # ---- inside ---------------------------------------------------------------------------------

    def _frame(self, keys: list[str], states: list[dict[str, Any]]) -> pd.DataFrame:
        columns = self.state.columns
        return pd.DataFrame({c: [s[c] for s in states] for c in columns}, index=pd.Index(keys, dtype=object, name=KEY), columns=list(columns))

    def _put(self, key: str, entry: Entry) -> None:
        old = self.entries.get(key)
        self.bytes += len(entry[VALUE]) - (len(old[VALUE]) if old is not None else 0)
        self.entries[key] = entry
        # A key's time in the expiry heap may lag its newest (a write that moves it on pushes nothing;
        # `expire` pushes the key again when it finds it moved): one push per key, not per write. A
        # key that loses its timer goes in again: `expire` may have passed it over while it had one.
        if self.state.ttl_ms is not None and (old is None or entry[SEEN] < old[SEEN] or (old[TIMER] is not None and entry[TIMER] is None)):
            heapq.heappush(self._expiry, (entry[SEEN], key))
            if len(self._expiry) > 2 * len(self.entries) + 1024:
                self._expiry = [(e[SEEN], k) for k, e in self.entries.items()]
                heapq.heapify(self._expiry)
        if entry[TIMER] is not None and (old is None or old[TIMER] != entry[TIMER]):
            heapq.heappush(self._timers, (entry[TIMER], key))
            if len(self._timers) > 2 * len(self.entries) + 1024:
                self._timers = [(e[TIMER], k) for k, e in self.entries.items() if e[TIMER] is not None]
                heapq.heapify(self._timers)

    def _delete(self, key: str) -> None:
        old = self.entries.pop(key, None)
        if old is not None:
            self.bytes -= len(old[VALUE])
        # Also for a key this store never held: a batch that was written but not committed may have
        # given it state, and this tombstone is what overrides that in the changelog.
        self._changes[key] = None

    def snapshot(self) -> dict[str, Any]:
        """What the store holds, for tests: key -> values."""
        return {k: codec.state_of(e[VALUE]) for k, e in self.entries.items()}


def _merged(heap: list[tuple[int, str]], items: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """`items` into `heap`: pushed one by one when they are few, the whole heapified once when not.
    Stale items (a key's older time, a deleted key) are skipped where the heap is read."""
    if len(items) < len(heap) // 8:
        for item in items:
            heapq.heappush(heap, item)
        return heap
    heap.extend(items)
    heapq.heapify(heap)
    return heap
