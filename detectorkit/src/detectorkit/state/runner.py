"""A stateful detector over one partition's records: its state read from the store, its function
called on the records, the new state written back, and its timers fired as event time passes them.
A key the function leaves out of its new state (`detect`'s or `on_timer`'s) keeps the state it was
given, read again from the store (which the call did not change); a row all missing deletes its key
(`State.completed`).

Event time is the partition's: the newest time of the records kept so far. Before each record,
every timer at or before that time (the record's own included) fires (`on_timer`), as a single pass
over the records one by one would do. The records between two firings go to `detect` at once, so
a batch costs one call unless a timer falls inside it; a timer that `detect` sets and that falls
due within the same records cuts them there, and the rest is run after it fired. A key's expiry
(the State's TTL) is judged by the partition's event time at its first record of a call, and the
records are cut where a key would expire between two of its records. The answers thus depend
neither on where batches begin and end nor on which partitions share a task.

If `detect` raises, the records are split in halves, each run as above (timers fire between them,
and cut them where they fall due), down to single records: only the records that make it fail go
to the dead-letter topic, their keys keep the state they had, and they move no event time: a
firing their time set off is undone. What is answered is thus one pass over the records that were
not rejected. If `on_timer` raises, the keys are split the same way; a key on which it fails goes
to the dead-letter topic with its state, loses its timer and keeps its state.
"""

from __future__ import annotations

import json
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from detectorkit import records as rec
from detectorkit.state.declaration import DEADLINE, KEY
from detectorkit.state.store import PartitionStore

# Firings in a row at one event time before `on_timer` is deemed to loop (it keeps setting timers
# at or before the time they fire).
MAX_FIRINGS = 100


@dataclass
class TimerDetection:
    key: str
    fields: dict
    deadline_ms: int


@dataclass
class TimerFailure:
    key: str
    message: str
    value: bytes  # the key's state and timer, as JSON, for the dead letter


@dataclass
class Result:
    found: list[tuple[int, dict]] = field(default_factory=list)  # (record position, fields)
    rejected: list[rec.Rejected] = field(default_factory=list)
    fired: list[TimerDetection] = field(default_factory=list)
    failed_timers: list[TimerFailure] = field(default_factory=list)


def run_stateful(
    detector: Any, config: Any, frame: pd.DataFrame, stamps: pd.Series, store: PartitionStore, tag: int, idle_ms: int | None = None
) -> Result:
    """`frame`: one partition's records in offset order, with the `key` and `event_time` columns;
    `stamps` their event times in ms, on the same index. `idle_ms`: with no records, the event time
    the partition is taken to have reached (the processing-time fallback of a quiet partition)."""
    result = Result()
    if frame.empty:
        if idle_ms is not None:
            store.advance(idle_ms)
        _fire(detector, config, store, store.event_ms, tag, result)
        return result
    _Run(detector, config, frame, stamps.to_numpy(dtype="int64"), store, tag, result).records(0, len(frame))
    _fire(detector, config, store, store.event_ms, tag, result)
    return result


@dataclass
class _Run:
    detector: Any
    config: Any
    frame: pd.DataFrame
    times: np.ndarray
    store: PartitionStore
    tag: int
    result: Result

    def records(self, lo: int, hi: int) -> None:
        """Records lo to hi, in order. Before a record, the timers at or before the event time it
        brings fire; then the records up to the next timer due (or to a key's expiry) go to
        `detect` at once. What raises is split in halves, each run the same way, down to the
        records that make it fail: those go to the dead letters and move no event time (a timer
        their time set off is undone)."""
        store = self.store
        pos, newest, counted = lo, None, -1
        while pos < hi:
            saved = self._fire_before(pos)
            if counted != len(self.result.rejected):
                # The newest time from here on, once (not once a chunk), and again after a record
                # was rejected: before it, every record's time is in the event time already.
                newest, since, counted = np.maximum.accumulate(self.times[pos:hi]), pos, len(self.result.rejected)
            ahead = newest[pos - since :]
            deadline = store.next_timer()  # later than the event time at `pos`: those due fired
            end = hi if deadline is None else max(pos + 1, pos + int(np.searchsorted(ahead, deadline, side="left")))
            # The event time before each record: the newest time of the records kept so far and its own.
            marks = np.maximum(ahead[: end - pos], store.event_ms)
            expiring = self._expiry_cut(pos, end, marks)
            if expiring is not None:
                end = pos + expiring
            while True:
                attempt = self._attempt(pos, end, marks[: end - pos])
                if isinstance(attempt, Exception) or attempt[2] is None:
                    break
                end = pos + attempt[2]  # a timer it set falls due before these records end: run up to there first
            if not isinstance(attempt, Exception):
                found, prepared, _ = attempt
                store.write(prepared, self.tag)
                self.result.found += found
                store.advance(int(marks[end - 1 - pos]))
            elif end - pos > 1 and saved is None:
                middle = (pos + end) // 2
                self.records(pos, middle)
                self.records(middle, end)
            else:
                if saved is not None:
                    self._undo(saved)
                if end - pos > 1:  # its first record set timers off: it is judged alone, before the rest
                    self.records(pos, pos + 1)
                    self.records(pos + 1, end)
                else:
                    message = "".join(traceback.format_exception_only(type(attempt), attempt)).strip()
                    self.result.rejected.append(rec.Rejected(int(self.frame.index[pos]), rec.DETECTOR_ERROR, message[:2000]))
            pos = end

    def _fire_before(self, pos: int):
        """The timers that record `pos`'s time makes due, fired; what they changed, to undo if the
        record is rejected (None if none fired)."""
        store = self.store
        if self.detector.on_timer is None:
            return None
        _fire(self.detector, self.config, store, store.event_ms, self.tag, self.result)  # due whatever the record
        at = max(store.event_ms, int(self.times[pos]))
        due = store.due(at, clear=False)
        if not due:
            return None
        saved = (store.savepoint(list(dict.fromkeys(k for k, _ in due))), len(self.result.fired), len(self.result.failed_timers))
        _fire(self.detector, self.config, store, at, self.tag, self.result)
        return saved

    def _undo(self, saved) -> None:
        point, fired, failed = saved
        self.store.rollback(point)
        del self.result.fired[fired:], self.result.failed_timers[failed:]

    def _expiry_cut(self, pos: int, end: int, marks: np.ndarray) -> int | None:
        """Where records pos to end must be cut so that no key expires between two of its records
        within one call (`detect` sees a key's state once, at its first record): the first record
        whose key's previous record here is more than the TTL before the event time at it. None
        where none is, which is what records spanning less than the TTL always give."""
        ttl = self.store.state.ttl_ms
        times = self.times[pos:end]
        if ttl is None or len(times) < 2 or int(marks[-1]) - int(times.min()) <= ttl:
            return None
        codes = pd.factorize(self.frame[KEY].to_numpy()[pos:end])[0]
        newest = pd.Series(times).groupby(codes).cummax().groupby(codes).shift(1).to_numpy()
        expired = np.flatnonzero(newest + ttl < marks)  # NaN (a key's first record) compares False
        return int(expired[0]) if len(expired) else None

    def _attempt(self, pos: int, end: int, marks: np.ndarray):
        """(detections, prepared changes, where the records must be cut) of one call over records
        pos to end, or what it raised.

        The cut: a record's timer that falls due before the key's next record with a timer (or
        before the records end) must fire before the records after it are run; None if none does."""
        detector, store = self.detector, self.store
        frame = self.frame.iloc[pos:end]
        # Each key once, in the order of its first record, with the partition's event time at its
        # first record (what its expiry is judged by) and its last record's time.
        codes, uniques = pd.factorize(frame[KEY].to_numpy())
        first = np.full(len(uniques), np.iinfo(np.int64).max)
        last = np.full(len(uniques), np.iinfo(np.int64).min)
        np.minimum.at(first, codes, marks)
        np.maximum.at(last, codes, self.times[pos:end])
        batch_keys = pd.Index(uniques, dtype=object)
        keys = uniques.tolist()
        try:
            out = detector.detect(frame, store.read(keys, first), self.config)
            found, new_state, timers = _unpack(out, frame.index, len(frame) == 1, "detect")
            new_state = detector.state.check_returned(new_state, batch_keys)
            new_state = detector.state.completed(new_state, _left_out(new_state, batch_keys, first, store.read))
            final, cut = _record_timers(timers, frame, marks if detector.on_timer is not None else None)
            prepared = store.prepare(new_state, keys, last, final, batch_keys, tag=self.tag, first_ms=first)
        except Exception as exc:  # noqa: BLE001 - user code: isolated by splitting
            return exc
        return found, prepared, cut


def _record_timers(timers: Any, frame: pd.DataFrame, marks: np.ndarray | None) -> tuple[dict[str, int | None] | None, int | None]:
    """detect()'s timers (a Series on the records' index: the key's timer after that record; NaT
    clears it; a record left out changes nothing) -> each key's last timer, and the cut."""
    if timers is None:
        return None, None
    if not isinstance(timers, pd.Series):
        raise TypeError(f"timers must be a pandas Series of times indexed like the records (each record's key's timer), not {type(timers).__name__}")
    if not timers.index.isin(frame.index).all():
        raise ValueError("timers has an index that is not the index of an input record: one timer per record, indexed like the records")
    times = pd.to_datetime(timers, utc=True)
    by_record = {i: (None if pd.isna(t) else t.value // 1_000_000) for i, t in times.items()}
    entries = np.flatnonzero(frame.index.isin(times.index))  # positions of records that set a timer
    keys = frame[KEY].to_numpy()[entries]
    ms = [by_record[i] for i in frame.index[entries]]
    final = dict(zip(keys, ms, strict=True))  # the last record of a key wins
    if marks is None or not len(entries):
        return final, None
    # Each timer is in force from its record to the key's next record with a timer (or the end).
    following = pd.Series(entries).groupby(keys).shift(-1).to_numpy()
    limit = np.where(np.isnan(following), len(frame) - 1, following).astype("int64")
    armed = np.array([m is not None for m in ms])
    if not armed.any():
        return final, None
    taus = np.array([m for m in ms if m is not None], dtype="int64")
    due = np.maximum(entries[armed] + 1, np.searchsorted(marks, taus, side="left"))
    hit = due <= limit[armed]
    return final, (int(due[hit].min()) if hit.any() else None)


def _fire(detector, config, store: PartitionStore, event_ms: int, tag: int, result: Result) -> None:
    if detector.on_timer is None:
        return
    for _ in range(MAX_FIRINGS):
        due = store.due(event_ms)
        if not due:
            return
        _fire_keys(detector, config, store, due, tag, result)
    raise RuntimeError(f"on_timer keeps setting timers at or before event time {event_ms}: a timer must be later than the time it fires at")


def _fire_keys(detector, config, store: PartitionStore, due: list[tuple[str, int]], tag: int, result: Result) -> None:
    keys = [k for k, _ in due]
    index = pd.Index(keys, dtype=object, name=KEY)
    fired = store.frame_of(keys)
    fired[DEADLINE] = pd.to_datetime([at for _, at in due], unit="ms", utc=True).astype("datetime64[ns, UTC]")
    try:
        out = detector.on_timer(fired, config)
        detections, new_state, timers = _unpack(out, None, False, "on_timer")
        if not detections.index.isin(index).all():
            raise ValueError("on_timer() returned detections whose index is not a key whose timer fired")
        new_state = detector.state.check_returned(new_state, index)
        new_state = detector.state.completed(new_state, _left_out(new_state, index, None, lambda keys, _: store.frame_of(keys)))
        # A fired timer is spent: the key has a timer again only if on_timer sets one.
        timers = {k: None for k in keys} | _key_timers(timers, index)
        prepared = store.prepare(new_state, keys, [store.seen_of(k) for k in keys], timers, tag=tag)
    except Exception as exc:  # noqa: BLE001 - user code: a dead letter, never a crash
        if len(due) > 1:
            middle = len(due) // 2
            _fire_keys(detector, config, store, due[:middle], tag, result)
            _fire_keys(detector, config, store, due[middle:], tag, result)
            return
        message = "".join(traceback.format_exception_only(type(exc), exc)).strip()[:2000]
        (key, at), values = due[0], store.values_of(due[0][0])
        value = json.dumps({"key": key, "state": values, "deadline_ms": at}, default=str).encode()
        result.failed_timers.append(TimerFailure(key, message, value))
        store.clear_timer(key, tag)  # spent, as if it had fired: it would fail again, and hold its key past the TTL
        return
    store.write(prepared, tag)
    at_of = dict(due)
    for key, fields in zip(detections.index, detections.to_dict(orient="records"), strict=True):
        result.fired.append(TimerDetection(str(key), fields, at_of[key]))


def _left_out(new_state: pd.DataFrame, keys: pd.Index, first: np.ndarray | None, read) -> pd.DataFrame | None:
    """The state of the `keys` that `new_state` (checked: distinct keys of `keys`) leaves out, read
    again (`read(keys, first)`: the store has not changed since the call began, and the frame the
    detector was given may have been changed in place); None when it leaves none out, what a
    detector usually returns (as many rows as keys tell it without a look at them)."""
    if len(new_state) == len(keys):
        return None
    out = ~keys.isin(new_state.index)
    return read(keys[out].tolist(), None if first is None else first[out])


def _unpack(out: Any, index: pd.Index | None, single: bool, name: str):
    if not isinstance(out, tuple) or len(out) not in (2, 3):
        raise TypeError(f"a stateful {name}() returns (detections, new_state) or (detections, new_state, timers), not {type(out).__name__}")
    detections, new_state = out[0], out[1]
    timers = out[2] if len(out) == 3 else None
    if index is None:
        if not isinstance(detections, pd.DataFrame):
            raise TypeError(f"{name}() must return a pandas DataFrame of detections, not {type(detections).__name__}")
        return detections, new_state, timers
    return rec.detections_of(detections, index, single), new_state, timers


def _key_timers(timers: Any, keys: pd.Index) -> dict[str, int]:
    """on_timer()'s timers (a Series of times indexed by key; NaT: none) -> {key: ms}."""
    if timers is None:
        return {}
    if not isinstance(timers, pd.Series):
        raise TypeError(f"timers must be a pandas Series of times indexed by key, not {type(timers).__name__}")
    stray = timers.index.difference(keys)
    if len(stray):
        raise ValueError(f"timers has keys that are not in the batch: {list(stray[:3])}")
    times = pd.to_datetime(timers, utc=True).dropna()
    return {str(k): int(t.value // 1_000_000) for k, t in times.items()}
