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
from collections.abc import Iterable
from typing import Any

import pandas as pd

from detectorkit.state import codec
from detectorkit.state.codec import Entry
from detectorkit.state.declaration import KEY, State

# A change for the changelog: (key, encoded value or None for a tombstone).
Change = tuple[str, bytes | None]
# The changelog record that holds the partition's event time (no customer key looks like it): a
# restore gets the time a quiet partition reached from the wall clock, not only its keys' times.
EVENT_TIME_KEY = "\x00detectorkit.event_ms"


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

    def read(self, keys: Iterable[str], first_ms: dict[str, int] | None = None) -> pd.DataFrame:
        """The state of `keys` that have one, indexed by key; a key whose state expired before its
        first record here (`first_ms`) has none."""
        ttl = self.state.ttl_ms
        found = []
        for key in keys:
            entry = self.entries.get(key)
            if entry is None:
                continue
            if ttl is not None and first_ms is not None and entry.seen_ms + ttl < first_ms.get(key, entry.seen_ms):
                continue
            found.append((key, codec.decode(entry.value, self.state, self.where)[0]))
        if not found:
            return self.state.empty()
        return pd.DataFrame([v for _, v in found], index=pd.Index([k for k, _ in found], dtype=object, name=KEY), columns=list(self.state.columns))

    def prepare(
        self, new_state: pd.DataFrame, keys: Iterable[str], last_ms: dict[str, int], timers: dict[str, int | None] | None = None
    ) -> list[tuple[str, bytes | None, int, int | None]]:
        """Every key of `keys` with the row `new_state` has for it, encoded, or None: it loses its
        state. `timers` sets the timer of each key in it (None clears it); the others keep theirs.
        Raises (and changes nothing) when a value cannot be written."""
        rows = new_state.to_dict(orient="index") if len(new_state) else {}
        timers = timers or {}
        if timers:
            stateless = [k for k, at in timers.items() if at is not None and k not in rows]
            if stateless:
                raise ValueError(f"a timer needs state for its key; no new state for {stateless[:3]}")
        prepared = []
        for key in keys:
            values = rows.get(key)
            if values is None:
                prepared.append((key, None, last_ms.get(key, 0), None))
                continue
            entry = self.entries.get(key)
            seen = max(last_ms.get(key, 0), entry.seen_ms if entry is not None else 0)
            timer = timers[key] if key in timers else (entry.timer_ms if entry is not None else None)
            prepared.append((key, codec.encode(values, seen, timer), seen, timer))
        return prepared

    def write(self, prepared: list[tuple[str, bytes | None, int, int | None]], tag: int) -> None:
        """What `prepare` gave, into the store and the changes for the changelog."""
        self.position = max(self.position, tag)
        for key, value, seen, timer in prepared:
            if value is None:
                self._delete(key)
            else:
                self._put(key, Entry(value, seen, tag, timer))
                self._changes[key] = value

    def advance(self, event_ms: int) -> None:
        """The partition's event time moves on (never back)."""
        self.event_ms = max(self.event_ms, int(event_ms))

    def next_timer(self) -> int | None:
        """The earliest pending timer's time."""
        while self._timers:
            at, key = self._timers[0]
            entry = self.entries.get(key)
            if entry is not None and entry.timer_ms == at:
                return at
            heapq.heappop(self._timers)  # stale: moved or cleared
        return None

    def due(self, event_ms: int) -> list[tuple[str, int]]:
        """(key, timer time) of the timers at or before `event_ms`, earliest first; each is cleared
        in the store (its firing writes the key again)."""
        fired = []
        while (at := self.next_timer()) is not None and at <= event_ms:
            _, key = heapq.heappop(self._timers)
            fired.append((key, at))
        return fired

    def values_of(self, keys: Iterable[str]) -> list[dict[str, Any]]:
        return [codec.decode(self.entries[k].value, self.state, self.where)[0] for k in keys]

    def seen_of(self, key: str) -> int:
        return self.entries[key].seen_ms

    def expire(self, tag: int) -> int:
        """Drop the keys unseen for longer than the TTL before the partition's event time; returns how many."""
        ttl = self.state.ttl_ms
        if ttl is None:
            return 0
        dropped = 0
        while self._expiry and self._expiry[0][0] + ttl < self.event_ms:
            seen, key = heapq.heappop(self._expiry)
            entry = self.entries.get(key)
            # A key with a timer stays until it fires: its firing writes it again, and back it comes here.
            if entry is not None and entry.seen_ms == seen and entry.timer_ms is None:
                self._delete(key)
                dropped += 1
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
        values = codec.decode(entry.value, self.state, self.where)[0]
        self.write([(key, codec.encode(values, entry.seen_ms), entry.seen_ms, None)], tag)

    # ---- the changelog read back ------------------------------------------------------------------

    def apply(self, key: str, value: bytes | None, tag: int | None, until: int, tombs: dict[str, int]) -> bool:
        """A changelog record read back: applied when it reflects input before `until` (the group's
        committed offset) and is not older than what the key holds (a zombie's late write);
        `tombs` remembers deleted keys' tags for the length of one restore."""
        if tag is not None and tag > until:
            return False  # written by a batch that was never committed: the replay writes it again
        if key == EVENT_TIME_KEY:
            self.event_ms = self._event_written = max(self.event_ms, int(value or b"0"))
            return True
        held = self.entries.get(key)
        held_tag = held.tag if held is not None else tombs.get(key, -1)
        if tag is not None and tag < held_tag:
            return False
        if value is None:
            self._delete(key, record=False)
            tombs[key] = tag if tag is not None else -1
        else:
            _, seen, timer = codec.decode(value, self.state, self.where)  # a shape the detector cannot read stops here
            self._put(key, Entry(value, seen, tag if tag is not None else -1, timer))
            tombs.pop(key, None)
            self.event_ms = max(self.event_ms, seen)
        return True

    # ---- inside ---------------------------------------------------------------------------------

    def _put(self, key: str, entry: Entry) -> None:
        old = self.entries.get(key)
        self.bytes += len(entry.value) - (len(old.value) if old is not None else 0)
        self.entries[key] = entry
        if self.state.ttl_ms is not None:
            heapq.heappush(self._expiry, (entry.seen_ms, key))
            if len(self._expiry) > 2 * len(self.entries) + 1024:
                self._expiry = [(e.seen_ms, k) for k, e in self.entries.items()]
                heapq.heapify(self._expiry)
        if entry.timer_ms is not None and (old is None or old.timer_ms != entry.timer_ms):
            heapq.heappush(self._timers, (entry.timer_ms, key))
            if len(self._timers) > 2 * len(self.entries) + 1024:
                self._timers = [(e.timer_ms, k) for k, e in self.entries.items() if e.timer_ms is not None]
                heapq.heapify(self._timers)

    def _delete(self, key: str, record: bool = True) -> None:
        old = self.entries.pop(key, None)
        if old is not None:
            self.bytes -= len(old.value)
        if record:
            # Also for a key this store never held: a batch that was written but not committed may
            # have given it state, and this tombstone is what overrides that in the changelog.
            self._changes[key] = None

    def snapshot(self) -> dict[str, Any]:
        """What the store holds, for tests: key -> values."""
        return {k: codec.decode(e.value, self.state, self.where)[0] for k, e in self.entries.items()}
