"""One input partition's state, in memory in the process that runs the partition's tasks.

The changelog is the truth; a store is a cache of it that knows how far it reflects both the input
(`position`, the input offset its last change was made at) and the changelog (`changelog_offset`,
the next changelog record it has not seen). A task whose range starts at the store's position needs
nothing from Kafka; any other start means another process (or instance) moved the partition on, or
this store holds a batch that was never committed, and the store catches up or is rebuilt (`cache`).

Expiry is event time: a key's state is gone once the partition's newest record is more than the TTL
past the key's newest record (a key with a pending timer stays until it fires). Keys are swept as
event time advances, each with a tombstone for the changelog. Timers are kept with their key's state.

The store is columnar: its keys live in slots of NumPy arrays (`slots.Slots`, which it builds on).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from detectorkit.state import codec
from detectorkit.state.columns import TypeMismatch
from detectorkit.state.declaration import State, StateSchemaError
from detectorkit.state.slots import NEVER, NO_TIMER, Slots

# A change for the changelog: (key, encoded value or None for a tombstone).
Change = tuple[str, bytes | None]
# The changelog record that holds the partition's event time (no customer key looks like it): a
# restore gets the time a quiet partition reached from the wall clock, not only its keys' times.
EVENT_TIME_KEY = "\x00detectorkit.event_ms"
# A typed key's change, encoded from the store's columns when the changes are taken.
_CHANGED = True
# A key with no change pending, in a savepoint.
_NO_CHANGE = object()


@dataclass
class Prepared:
    """What `prepare` gives `write`: each key with its encoded value (None: it loses its state), its
    event time and its timer (NO_TIMER: none). Keys are distinct. Typed state: the values are
    `_CHANGED` or None, and `columns` holds the kept keys' values, in order."""

    keys: list[str]
    values: np.ndarray  # object: bytes (or _CHANGED) or None
    seen: np.ndarray  # int64
    timers: np.ndarray  # int64
    slots: np.ndarray | None = None  # the keys' slots when prepared (-1: not held), valid while the store's generation is
    generation: int = -1
    columns: dict[str, Any] | None = None

    @classmethod
    def of(cls, rows: Iterable[tuple[str, bytes | None, int, int | None]]) -> Prepared:
        """From (key, value, seen_ms, timer_ms) rows."""
        rows = list(rows)
        values = np.empty(len(rows), dtype=object)
        values[:] = [v for _, v, _, _ in rows]
        return cls(
            [k for k, _, _, _ in rows],
            values,
            np.array([s for _, _, s, _ in rows], dtype=np.int64),
            np.array([NO_TIMER if t is None else t for *_, t in rows], dtype=np.int64),
        )


@dataclass
class Savepoint:
    """Some keys of a store as they were (`PartitionStore.savepoint`): the held ones first, with
    their values; then those it did not hold."""

    keys: list[str]
    values: np.ndarray
    sizes: np.ndarray
    seen: np.ndarray
    tags: np.ndarray
    timers: np.ndarray
    typed: dict[str, Any] | None
    changes: list[Any]  # each key's pending change, or _NO_CHANGE


class PartitionStore(Slots):
    def __init__(self, state: State, partition: int, where: str = ""):
        super().__init__(state)
        self.partition = partition
        self.where = where or f"state store partition {partition}"
        self.position = -1  # input offset reflected; -1: nothing yet
        self.tick = 0  # the source's tick reflected: a tick fires timers without moving the offset
        self.changelog_offset = 0  # next changelog offset to read
        # (changelog offset, key, value, tag) of the last change it wrote since it last read the
        # changelog, where it lands if nobody else wrote in between: a catch-up checks it (state.cache).
        self.last_written: tuple[int, str, bytes | None, int | None] | None = None
        self.event_ms = 0  # the partition's event time: its newest record's
        self.late = 0  # records its detector dropped as late since the last report
        # Lower bounds, so a batch with nothing to expire or fire scans nothing: the oldest time of
        # a key without a timer, and the earliest timer.
        self._expiry_floor = NO_TIMER
        self._timer_floor = NO_TIMER
        self._changes: dict[str, bytes | None] = {}
        self._rows = None  # the compiled copies, once a detector that runs on the store wrote (`write_lists`)
        self._event_written = 0  # the event time the changelog has
        # When its changes last went to the changelog (a task writes them once an interval): a new
        # store is what the changelog holds, or empty.
        self.flushed_at = time.monotonic()

    @property
    def pending(self) -> bool:
        """It holds changes the changelog has not got: its content is not the changelog's at any offset."""
        return bool(self._changes) or self.event_ms > self._event_written

    # ---- what a batch reads and writes ------------------------------------------------------------

    def read(self, keys: Sequence[str], first_ms: Sequence[int] | np.ndarray | None = None) -> pd.DataFrame:
        """The state of `keys` that have one, indexed by key; a key that expired before its first
        record here has none: `first_ms` (one per key) is the partition's event time at that record.
        The values are decoded afresh, so a detector sees exactly what a restore would give it
        (JSON's types) and cannot change the store in place."""
        slots = self._slots_of(keys)
        found = slots[self._alive(slots, first_ms)]
        if not len(found):
            return self.state.empty()
        return self._frame(self._key[found].tolist(), found)

    def _alive(self, slots: np.ndarray, first_ms: Sequence[int] | np.ndarray | None) -> np.ndarray:
        """Which `slots` hold state that has not expired by `first_ms`: a key lives until the
        partition's event time is more than the TTL past its newest record, or while it has a
        timer. Judged by the partition's time, not the record's own, so a late record, a batch's
        bounds and a sweep's timing all give the same answer (Kafka Streams judges by stream time)."""
        held = slots >= 0
        ttl = self.state.ttl_ms
        if ttl is None or first_ms is None or not len(slots):
            return held
        seen = np.where(held, self._seen[slots], NEVER + ttl)
        return held & ((seen + ttl >= np.asarray(first_ms, dtype=np.int64)) | (self._timer[slots] != NO_TIMER))

    def prepare(
        self,
        new_state: pd.DataFrame,
        keys: Sequence[str],
        last_ms: Sequence[int] | np.ndarray,
        timers: dict[str, int | None] | None = None,
        index: pd.Index | None = None,
        *,
        tag: int,
        first_ms: Sequence[int] | np.ndarray | None = None,
    ) -> Prepared:
        """Every key of `keys` (distinct) with the row `new_state` has for it, encoded, or None: it
        loses its state (the runner has given `new_state` the state of the keys a detector left out,
        and dropped the rows it deleted: `State.completed`); `last_ms` is each key's newest record
        time. `timers` sets the timer of each key in it (None clears it); the others keep theirs. Raises (and changes nothing) when a value
        cannot be written. `index`: `keys` as an Index, if the caller has one; `tag`: the input
        offset the values reflect (what `write` will be given), written into each; `first_ms`: as
        `read` was given, so a key that had expired starts afresh (its old time and timer gone)."""
        slots = self._slots_of(keys)
        index = pd.Index(keys, dtype=object) if index is None else index
        keys = list(keys)
        if not len(new_state):
            rows = np.full(len(keys), -1, dtype=np.intp)
        elif new_state.index.equals(index):  # every key, in order (the usual answer): no hashing
            rows = np.arange(len(keys))
        else:
            rows = new_state.index.get_indexer(index)
        held = self._alive(slots, first_ms)
        seen = np.maximum(np.asarray(last_ms, dtype=np.int64), np.where(held, self._seen[slots], NEVER))
        timer = np.where(held, self._timer[slots], NO_TIMER)
        if timers:
            stateless = [k for k, at in timers.items() if at is not None and k not in new_state.index]
            if stateless:
                raise ValueError(f"a timer needs state for its key; no new state for {stateless[:3]}")
            at = pd.Index(list(timers), dtype=object).get_indexer(keys)
            given = np.flatnonzero(at >= 0)
            asked = list(timers.values())
            timer[given] = [NO_TIMER if asked[i] is None else asked[i] for i in at[given].tolist()]
        values = np.empty(len(keys), dtype=object)
        kept = np.flatnonzero(rows >= 0)
        if self._typed is not None:
            try:
                taken = self._typed.take(new_state, rows[kept])
            except TypeMismatch as exc:
                raise TypeError(str(exc)) from None
            values[kept] = _CHANGED
            return Prepared(keys, values, seen, timer, slots, self._generation, taken)
        if len(kept):
            # Column by column, as Python objects (numbers as int and float, not NumPy's).
            columns = self.state.columns
            states = _as_dicts(columns, [new_state[c].tolist() for c in columns])
            values[kept] = codec.encode_many(
                [states[r] for r in rows[kept].tolist()],
                seen[kept].tolist(),
                [None if t == NO_TIMER else t for t in timer[kept].tolist()],
                tag,
            )
        return Prepared(keys, values, seen, timer, slots, self._generation)

    def write(self, prepared: Prepared, tag: int) -> None:
        """What `prepare` gave, into the store and the changes for the changelog."""
        self.position = max(self.position, tag)
        keys, values = prepared.keys, prepared.values
        slots = prepared.slots if prepared.generation == self._generation else None
        gone = np.equal(values, None)
        if gone.any():
            for i in np.flatnonzero(gone).tolist():
                self._delete(keys[i])
            slots = None  # freed slots: the others stay, but they are looked up again
        kept = np.flatnonzero(~gone)
        if not len(kept):
            return
        if len(kept) < len(keys):
            keys = [keys[i] for i in kept.tolist()]
            values = values[kept]
        self._put(keys, values, prepared.seen[kept], tag, prepared.timers[kept], slots if slots is None else slots[kept], prepared.columns)
        self._changes.update(zip(keys, values.tolist(), strict=True))

    def write_lists(self, keys: list[str], slots: np.ndarray, seen: np.ndarray, columns: dict[str, tuple[np.ndarray, np.ndarray]], tag: int) -> None:
        """`Slots.lists_of`'s keys with new values (every list column, each key's length) and newest
        times, written as `write` writes a prepared batch: `slots` as `lists_of` gave them, while
        no key got or lost a slot since."""
        from detectorkit.state import compiled_rows  # numba: loaded already by such a detector

        self._rows = compiled_rows
        self.position = max(self.position, tag)
        timers = np.where(slots >= 0, self._timer[slots], NO_TIMER)
        values = np.full(len(keys), _CHANGED, dtype=object)
        self._put(keys, values, seen, tag, timers, slots, columns, compiled_rows)
        self._changes.update(dict.fromkeys(keys, _CHANGED))

    def advance(self, event_ms: int) -> None:
        """The partition's event time moves on (never back)."""
        self.event_ms = max(self.event_ms, int(event_ms))

    def pending_timers(self) -> int:
        """How many keys have a timer that has not fired."""
        return int(np.count_nonzero(self._live[: self._used] & (self._timer[: self._used] != NO_TIMER)))

    def next_timer(self) -> int | None:
        """The earliest pending timer's time."""
        if self._timer_floor == NO_TIMER:
            return None
        self._timer_floor = int(self._timer[: self._used].min())
        return None if self._timer_floor == NO_TIMER else self._timer_floor

    def due(self, event_ms: int, clear: bool = True) -> list[tuple[str, int]]:
        """(key, timer time) of the timers at or before `event_ms`, earliest first; each is cleared
        in the store (its firing writes the key again) unless not `clear`."""
        if self._timer_floor > event_ms:
            return []
        timers = self._timer[: self._used]
        slots = np.flatnonzero(timers <= event_ms)
        if not len(slots):
            return []
        fired = sorted(zip(timers[slots].tolist(), self._key[slots].tolist(), strict=True))
        if not clear:
            return [(key, at) for at, key in fired]
        timers[slots] = NO_TIMER
        self._expiry_floor = min(self._expiry_floor, int(self._seen[slots].min()))
        return [(key, at) for at, key in fired]

    def frame_of(self, keys: Sequence[str]) -> pd.DataFrame:
        """The state of `keys`, each of which has one, indexed by key."""
        return self._frame(list(keys), np.array([self._slot[k] for k in keys], dtype=np.intp))

    def values_of(self, key: str) -> dict[str, Any]:
        """The state of `key`, which has one, as JSON values (what the changelog holds)."""
        slot = self._slot[key]
        return codec.state_of(self._value[slot]) if self._typed is None else self._typed.rows(np.array([slot]))[0]

    def seen_of(self, key: str) -> int:
        return int(self._seen[self._slot[key]])

    def expire(self, tag: int) -> int:
        """Drop the keys unseen for longer than the TTL before the partition's event time; returns how many."""
        ttl = self.state.ttl_ms
        if ttl is None:
            return 0
        self.position = max(self.position, tag)
        limit = self.event_ms - ttl
        if self._expiry_floor >= limit:
            return 0
        n = self._used
        # A key with a timer stays until it fires; once it has none, `_put` or `due` lower the floor.
        seen = np.where(self._live[:n] & (self._timer[:n] == NO_TIMER), self._seen[:n], NO_TIMER)
        doomed = seen < limit
        for key in self._key[:n][doomed].tolist():
            self._delete(key)
        seen[doomed] = NO_TIMER
        self._expiry_floor = int(seen.min()) if n else NO_TIMER
        return int(doomed.sum())

    def take_changes(self) -> list[Change]:
        """The changes since the last call, one per key (its last), and last the event time if it
        moved. Each value carries the input offset of its batch (`prepare`); the event time and a
        tombstone do not."""
        changes, self._changes = self._changes, {}
        if self._typed is not None:
            changed = [k for k, v in changes.items() if v is _CHANGED]
            if changed:
                slots = np.fromiter(map(self._slot.__getitem__, changed), dtype=np.intp, count=len(changed))
                columns, rows = self._typed.gathered(slots, self._rows), self._rows
                values = codec.encode_columns(columns, self._seen[slots], self._timer[slots], self._tag[slots], NO_TIMER, rows)
                changes.update(zip(changed, values, strict=True))
        if self.event_ms > self._event_written:
            changes[EVENT_TIME_KEY] = str(self.event_ms).encode()
            self._event_written = self.event_ms
        return list(changes.items())

    def drop_changes(self) -> None:
        """Forget the changes since the last `take_changes` without encoding them: nothing keeps
        them (a backtest)."""
        self._changes = {}
        self._event_written = self.event_ms

    def clear_timer(self, key: str, tag: int) -> None:
        """`key` loses its timer and keeps its state (its firing failed: a dead letter)."""
        slot = self._slot[key]
        seen = int(self._seen[slot])
        if self._typed is None:
            self.write(Prepared.of([(key, codec.encode(self.values_of(key), seen, tag=tag), seen, None)]), tag)
            return
        prepared = Prepared.of([(key, _CHANGED, seen, None)])
        prepared.columns = self._typed.from_rows([self.values_of(key)])
        self.write(prepared, tag)

    def savepoint(self, keys: Sequence[str]) -> Savepoint:
        """What `keys` are now (held or not), for `rollback`: firing timers writes only the keys
        that fire, and a firing may have to be undone (the record whose time set it off is
        rejected, and a rejected record moves no event time); a batch run in rounds is undone
        whole when a call in it raises, and run again record by record."""
        keys = list(keys)
        slots = self._slots_of(keys)
        held = slots >= 0
        keys = [k for k, h in zip(keys, held.tolist(), strict=True) if h] + [k for k, h in zip(keys, held.tolist(), strict=True) if not h]
        slots = np.concatenate([slots[held], slots[~held]])
        kept = slots[: int(held.sum())]
        return Savepoint(
            keys,
            self._value[kept],
            self._size[kept],
            self._seen[kept],
            self._tag[kept],
            self._timer[kept],
            None if self._typed is None else self._typed.save(kept),
            [self._changes.get(k, _NO_CHANGE) for k in keys],
        )

    def rollback(self, saved: Savepoint) -> None:
        """Back to `saved`: its keys as they were (state, time, timer, pending change); a key it
        did not hold is let go again."""
        count = len(saved.values)
        held, absent = saved.keys[:count], saved.keys[count:]
        for key in absent:
            self._remove(key)
        slots = self._place(held, self._slots_of(held))
        self._value[slots] = saved.values
        sizes = saved.sizes if self._typed is None else self._typed.load(slots, saved.typed)
        self.bytes += int(sizes.sum() - self._size[slots].sum())
        self._size[slots] = sizes
        self._seen[slots], self._tag[slots], self._timer[slots] = saved.seen, saved.tags, saved.timers
        for key, change in zip(saved.keys, saved.changes, strict=True):
            if change is _NO_CHANGE:
                self._changes.pop(key, None)
            else:
                self._changes[key] = change
        untimed = saved.seen[saved.timers == NO_TIMER]
        if len(untimed):
            self._expiry_floor = min(self._expiry_floor, int(untimed.min()))
        if len(saved.timers):
            self._timer_floor = min(self._timer_floor, int(saved.timers.min()))

    def timers_of(self, keys: Sequence[str]) -> np.ndarray:
        """Each key's timer (NO_TIMER: none, or not held)."""
        slots = self._slots_of(keys)
        return np.where(slots >= 0, self._timer[slots], NO_TIMER)

    def take_timers(self, keys: Sequence[str]) -> list[tuple[str, int]]:
        """(key, timer time) of `keys` (each with a timer), in their order; cleared, as `due` clears
        them: their firing writes the keys again."""
        slots = np.array([self._slot[k] for k in keys], dtype=np.intp)
        at = self._timer[slots]
        self._timer[slots] = NO_TIMER
        if len(slots):
            self._expiry_floor = min(self._expiry_floor, int(self._seen[slots].min()))
        return list(zip(keys, at.tolist(), strict=True))

    # ---- the changelog read back ------------------------------------------------------------------

    def restore(self, records: Iterable[tuple[str, bytes | None, int | None, int]], until: int, tombs: dict[str, int] | None = None) -> int:
        """Changelog records (key, value, input offset tag, changelog offset) read back, in order,
        onto what the store holds; returns how many were read. A record is applied when it reflects
        input before `until` (the group's committed offset) and is not older than what its key
        holds (a zombie's late write). `tombs` (deleted keys' tags) carries over between the calls
        of one restore read in parts. Each key's last applicable record is found first, then only
        those are decoded and stored, in one pass: a restore reads every key of a partition."""
        tombs = {} if tombs is None else tombs
        slot_of, tags = self._slot.get, self._tag
        latest: dict[str, tuple[bytes | None, int]] = {}
        read = 0
        for key, value, tag, offset in records:
            read += 1
            self.changelog_offset = offset + 1
            if tag is not None and tag > until:
                continue  # written by a batch that was never committed: the replay writes it again
            if key == EVENT_TIME_KEY:
                self.event_ms = self._event_written = max(self.event_ms, int(value or b"0"))
                continue
            if tag is None:
                tag = -1
            prior = latest.get(key)
            if prior is not None:
                held = prior[1]
            else:
                slot = slot_of(key)
                held = tombs.get(key, -1) if slot is None else int(tags[slot])
            if tag >= held:
                latest[key] = (value, tag)
        keys, values, written = [], [], []
        for key, (value, tag) in latest.items():
            if value is None:
                self._remove(key)
                tombs[key] = tag
            else:
                keys.append(key)
                values.append(value)
                written.append(tag)
        if keys:
            states, seen, timers = codec.decode_many(values, self.state, self.where)  # a shape the detector cannot read stops here
            columns = None
            if self._typed is not None:
                try:
                    columns = self._typed.from_rows(states)
                except TypeMismatch as exc:
                    raise StateSchemaError(f"{self.where} holds state that does not fit the declared types ({exc}); {codec.ADVICE}") from None
            array = np.empty(len(values), dtype=object)
            array[:] = values if columns is None else None
            seen_ms = np.array(seen, dtype=np.int64)
            timer_ms = np.array([NO_TIMER if t is None else t for t in timers], dtype=np.int64)
            self._put(keys, array, seen_ms, np.array(written, dtype=np.int64), timer_ms, columns=columns)
            self.event_ms = max(self.event_ms, int(seen_ms.max()))
        self._event_written = max(self._event_written, self.event_ms)  # read back, not a change
        return read

    # ---- inside ---------------------------------------------------------------------------------

    def _put(
        self,
        keys: list[str],
        values: np.ndarray,
        seen: np.ndarray,
        tag: int | np.ndarray,
        timers: np.ndarray,
        slots: np.ndarray | None = None,
        columns: dict[str, Any] | None = None,
        rows: Any = None,
    ) -> None:
        slots = self._place(keys, self._slots_of(keys) if slots is None else slots)
        if self._typed is None:
            sizes = np.fromiter(map(len, values.tolist()), dtype=np.int64, count=len(values))
            self._value[slots] = values
        else:
            sizes = self._typed.put(slots, columns, rows)
        self.bytes += int(sizes.sum() - self._size[slots].sum())
        self._size[slots] = sizes
        self._seen[slots] = seen
        self._tag[slots] = tag
        self._timer[slots] = timers
        untimed = seen[timers == NO_TIMER]
        if len(untimed):
            self._expiry_floor = min(self._expiry_floor, int(untimed.min()))
        self._timer_floor = min(self._timer_floor, int(timers.min()))

    def _delete(self, key: str) -> None:
        self._remove(key)
        # Also for a key this store never held: a batch that was written but not committed may have
        # given it state, and this tombstone is what overrides that in the changelog.
        self._changes[key] = None

    def snapshot(self) -> dict[str, Any]:
        """What the store holds, for tests: key -> values."""
        if self._typed is not None:
            keys = list(self._slot)
            return dict(zip(keys, self._typed.rows(np.array([self._slot[k] for k in keys], dtype=np.intp)), strict=True))
        return {k: self.values_of(k) for k in self._slot}


def _as_dicts(columns: tuple[str, ...], values: list[list[Any]]) -> list[dict[str, Any]]:
    """Rows of column values as dicts: for one or two columns (most states) without a zip per row."""
    if len(columns) == 1:
        (c,) = columns
        return [{c: v} for v in values[0]]
    if len(columns) == 2:
        c, d = columns
        return [{c: v, d: w} for v, w in zip(values[0], values[1], strict=True)]
    return [dict(zip(columns, row, strict=True)) for row in zip(*values, strict=True)]
