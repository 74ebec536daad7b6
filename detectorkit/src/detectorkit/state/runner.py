"""A stateful detector over one partition's records: its state read from the store, its function
called on the records, the new state written back, and its timers fired as event time passes them.
A key the function leaves out of its new state (`detect`'s or `on_timer`'s) keeps the state it was
given, read again from the store (which the call did not change); a row all missing deletes its key
(`State.completed`).

Event time is the partition's: the newest time of the records kept so far. Before each record,
every timer at or before that time (the record's own included) fires (`on_timer`), as a single pass
over the records one by one would do. Since a key's state, records and timer are its own, only each
key's order matters: the records go in rounds (`_Run.rounds`), each firing the timers due before
each key's next record, then running every key's records up to where its own timer falls due (one
set by `detect` within the call included: that key is run again up to there) or it would expire (the
State's TTL, judged by the partition's event time at a key's first record of a call), in one call.
A batch thus costs as many calls as its most interrupted key needs, not one per timer of any key,
and the answers depend neither on where batches begin and end nor on which partitions share a task.

If `detect` raises, the rounds are undone and the records run in order (`_Run.records`), split in
halves, each run as above (timers fire between them, and cut them where they fall due), down to
single records: only the records that make it fail go
to the dead-letter topic, their keys keep the state they had, and they move no event time: a
firing their time set off is undone. What is answered is thus one pass over the records that were
not rejected. If `on_timer` raises, the keys are split the same way; a key on which it fails goes
to the dead-letter topic with its state, loses its timer and keeps its state.
"""

from __future__ import annotations

import json
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import structlog

from detectorkit import records as rec
from detectorkit.state.answers import (
    Result,
    TimerDetection,
    TimerFailure,
    key_timers,
    key_timers_of_records,
    left_out,
    record_timers,
    timer_detections,
    unpack,
)
from detectorkit.state.declaration import DEADLINE, KEY, PARTITION_TIME
from detectorkit.state.in_store import KeyColumns
from detectorkit.state.slots import NO_TIMER
from detectorkit.state.store import PartitionStore

# Firings in a row at one event time before `on_timer` is deemed to loop (it keeps setting timers
# at or before the time they fire).
MAX_FIRINGS = 100

_log = structlog.get_logger("detectorkit.state")
# (detector, error type) already logged by this process: a run on the store that raises again and
# again (numba that cannot compile here) says so once, not once a batch.
_TOLD: set[tuple[str, str]] = set()


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
    run = _Run(detector, config, frame, stamps.to_numpy(dtype="int64"), store, tag, result)
    if not run.rounds():
        run.records(0, len(frame))
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
    # The batch's keys factorised (`rounds`), which a call over the whole batch takes as they are.
    _whole: tuple[np.ndarray, np.ndarray] | None = None

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
                call, prepared, _ = attempt
                store.write(prepared, self.tag)
                self.result.found += call.found
                self.result.fired += call.fired
                self.result.late += call.late
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
                    self.result.rejected.append(rec.detector_error(int(self.frame.index[pos]), attempt))
            pos = end

    def rounds(self) -> bool:
        """Every record, in rounds: each round fires the timers due before each key's next record,
        then runs every key's records up to where its own timer falls due or it would expire, in
        one call. A key's records and timers keep their order, and no key sees another's: its
        answers are those of `records`, in as many calls as the most interrupted key needs, not
        one per timer of any key. False, with nothing changed, when a call raised: `records` then
        runs them, splitting down to the records that make it fail."""
        if self.detector.in_store is not None:
            done = self._in_store()
            if done is not None:
                return done
        store, n = self.store, len(self.frame)
        keys = self.frame[KEY].to_numpy()
        codes, uniques = self._whole = pd.factorize(keys)
        names = uniques.tolist()
        # Each key's records in offset order, the keys one after another.
        order = np.argsort(codes, kind="stable")
        bounds = np.zeros(len(names) + 1, dtype=np.int64)
        np.cumsum(np.bincount(codes, minlength=len(names)), out=bounds[1:])
        ahead, stop = bounds[:-1].copy(), bounds[1:]
        marks = np.maximum(np.maximum.accumulate(self.times), store.event_ms)
        by_key = codes[order]
        # A record whose key's previous record here is more than the TTL before the event time at
        # it starts a call of its own: its key's state is judged afresh there (`_expiry_cut`).
        ttl = store.state.ttl_ms
        expiring = np.zeros(n, dtype=bool)
        if ttl is not None and n > 1 and int(marks[-1]) - int(self.times.min()) > ttl:
            newest = pd.Series(self.times[order]).groupby(by_key).cummax().groupby(by_key).shift(1).to_numpy()
            expiring = newest + ttl < marks[order]
        # What to undo if a call raises after others wrote: none without timers and expiries, where
        # every key's records go in one call and nothing is written before it answers.
        saved = store.savepoint(names) if self.detector.on_timer is not None or expiring.any() else None
        fired, failed, late = len(self.result.fired), len(self.result.failed_timers), self.result.late
        found: list[tuple[int, dict]] = []
        try:
            while True:
                active = np.flatnonzero(ahead < stop)
                if not len(active):
                    break
                timers = self._fire_due(names, active, marks[order[ahead[active]]])
                # Where each key's records must stop: its timer due, or its state expiring.
                due = np.full(len(names), NO_TIMER, dtype=np.int64)
                due[active] = timers
                flagged = np.where(expiring | (marks[order] >= due[by_key]), np.arange(n), n)
                first_flag = np.append(np.minimum.accumulate(flagged[::-1])[::-1], n)
                ends = np.minimum(stop[active], first_flag[ahead[active] + 1])
                found += self._run_segments(active, ahead, ends, order, marks, names)
        except _Raised:
            if saved is not None:
                store.rollback(saved)
            del self.result.fired[fired:], self.result.failed_timers[failed:]
            self.result.late = late
            return False
        self.result.found += sorted(found, key=lambda f: f[0])
        self.result.fired[fired:] = sorted(self.result.fired[fired:], key=lambda d: d.deadline_ms)
        store.advance(int(marks[-1]))
        return True

    def _in_store(self) -> bool | None:
        """Every record through the detector's own run on its keys' columns (`in_store`), in one
        call: True once written; False if it raised (`records` then runs them through `detect`,
        splitting down to the records that make it fail); None where it cannot run them (`detect`
        runs the rounds)."""
        store = self.store
        codes, uniques = pd.factorize(self.frame[KEY].to_numpy())
        keys = uniques.tolist()
        marks = np.maximum(np.maximum.accumulate(self.times), store.event_ms)
        slots, seen, columns = store.lists_of(keys)
        try:
            out = self.detector.in_store(self.frame, KeyColumns(codes, keys, seen, columns, marks, store.state.ttl_ms))
            if out is None:
                return None
            detections, new_columns, new_seen, late = out
            found = rec.detections_of(detections, self.frame.index, len(self.frame) == 1)
        except Exception as exc:  # noqa: BLE001 - user code (a model's): run again record by record, which isolates it
            if not isinstance(exc, rec.Refused):  # a record it cannot score: a dead letter, said as one
                _tell_once(self.detector.name, exc)
            return False
        store.write_lists(keys, slots, new_seen, new_columns, self.tag)
        self.result.found += found
        self.result.late += late
        store.advance(int(marks[-1]))
        return True

    def _fire_due(self, names: list[str], active: np.ndarray, next_marks: np.ndarray) -> np.ndarray:
        """Fires each active key's timer that is due by the event time at its next record (again
        while `on_timer` sets one due there too), before the key's expiry is judged there; returns
        each key's timer then (NO_TIMER: none, or one `detect` fires itself when it falls due)."""
        store = self.store
        none = np.full(len(active), NO_TIMER, dtype=np.int64)
        if self.detector.on_timer is None:
            return none  # without a name looked up per key
        keys = [names[c] for c in active.tolist()]
        for _ in range(MAX_FIRINGS):
            timers = store.timers_of(keys)
            due = np.flatnonzero(timers <= next_marks)
            if not len(due):
                return timers if self._cuts_at_timers else none
            fired = store.take_timers([keys[i] for i in due.tolist()])
            _fire_keys(self.detector, self.config, store, fired, self.tag, self.result, next_marks[due])
        raise RuntimeError("on_timer keeps setting timers at or before the event time they fire at: a timer must be later than the time it fires at")

    def _run_segments(self, active, ahead, ends, order, marks, names) -> list[tuple[int, dict]]:
        """Each active key's records from `ahead` to `ends` (positions in `order`), in one call;
        a key whose own timer, set in the call, falls due before one of its later records there is
        run again up to that record. Moves `ahead` past what was written."""
        found: list[tuple[int, dict]] = []
        starts, ends = ahead[active], ends
        while len(active):
            lengths = ends - starts
            total = int(lengths.sum())
            # Every record at once (no timer or expiry cut any key): the batch as it is.
            if total == len(order):
                positions = np.arange(total)
            else:
                positions = np.sort(order[np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(total)])
            call = self._call(positions, marks)
            if isinstance(call, Exception):
                raise _Raised from call
            got, fired, prepared, cuts, late = call
            self.result.fired += fired
            self.result.late += late
            cut = np.array([cuts.get(names[c], -1) for c in active.tolist()], dtype=np.int64) if cuts else np.full(len(active), -1)
            kept = cut < 0
            self.store.write(prepared, self.tag)
            found += got
            ahead[active[kept]] = ends[kept]
            active, starts, ends = active[~kept], starts[~kept], starts[~kept] + cut[~kept]
        return found

    def _call(self, positions: np.ndarray, marks: np.ndarray):
        """(detections, prepared changes, {key: how many of its records to run instead}) of one
        call over the records at `positions` (offset order), written only for the keys without a
        cut; or what it raised."""
        try:
            call = self._invoke(positions, marks[positions])
            final, cuts = key_timers_of_records(call.timers, call.frame, call.codes, call.keys, marks[positions] if self._cuts_at_timers else None)
            found, new_state, fired, keys = call.found, call.new_state, call.fired, call.keys
            batch_keys, first, last = call.batch_keys, call.first, call.last
            if cuts:
                keep = ~batch_keys.isin(list(cuts))
                written = {k for k, c in zip(keys, keep.tolist(), strict=True) if c}
                found = [f for f, k in zip(found, call.frame[KEY].loc[[i for i, _ in found]].tolist(), strict=True) if k in written]
                fired = [d for d in fired if d.key in written]
                new_state = new_state[new_state.index.isin(list(written))]
                final = {k: v for k, v in final.items() if k in written} if final is not None else None
                batch_keys, first, last, keys = batch_keys[keep], first[keep], last[keep], [k for k in keys if k in written]
            prepared = self.store.prepare(new_state, keys, last, final, batch_keys, tag=self.tag, first_ms=first)
        except Exception as exc:  # noqa: BLE001 - user code: run again record by record, which isolates it
            return exc
        return found, fired, prepared, cuts, call.late

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
        """(the call, its prepared changes, where the records must be cut) of one call over records
        pos to end, or what it raised.

        The cut: a record's timer that falls due before the key's next record with a timer (or
        before the records end) must fire before the records after it are run; None if none does."""
        positions = np.arange(pos, end)
        try:
            call = self._invoke(positions, marks)
            final, cut = record_timers(call.timers, call.frame, marks if self._cuts_at_timers else None)
            prepared = self.store.prepare(call.new_state, call.keys, call.last, final, call.batch_keys, tag=self.tag, first_ms=call.first)
        except Exception as exc:  # noqa: BLE001 - user code: isolated by splitting
            return exc
        return call, prepared, cut

    @property
    def _cuts_at_timers(self) -> bool:
        """Whether a timer `detect` sets must fire between the records of a call: not for a
        detector that fires what falls due among its records itself (`sees_partition_time`)."""
        return self.detector.on_timer is not None and not self.detector.sees_partition_time

    def _invoke(self, positions: np.ndarray, marks: np.ndarray) -> _Call:
        """`detect` over the records at `positions` (offset order), `marks` the event time at each:
        what it answered, checked, with the state of the keys it left out (raises what it raised)."""
        detector, store = self.detector, self.store
        # Positions are distinct and in order: as many as the batch's are all of it, taken without
        # a copy of the values (a column `detect` adds stays its own).
        whole = len(positions) == len(self.frame)
        frame = self.frame.copy(deep=False) if whole else self.frame.iloc[positions]
        if detector.sees_partition_time:
            frame = frame.assign(**{PARTITION_TIME: rec.utc_times(marks)})
        # Each key once, in the order of its first record, with the partition's event time at its
        # first record (what its expiry is judged by) and its last record's time.
        codes, uniques = self._whole if whole and self._whole is not None else pd.factorize(frame[KEY].to_numpy())
        first = np.full(len(uniques), np.iinfo(np.int64).max)
        last = np.full(len(uniques), np.iinfo(np.int64).min)
        np.minimum.at(first, codes, marks)
        np.maximum.at(last, codes, self.times[positions])
        batch_keys = pd.Index(uniques, dtype=object)
        keys = uniques.tolist()
        if detector.take_late is not None:
            detector.take_late()  # what a call that raised counted: its records are run again
        out = detector.detect(frame, store.read(keys, first), self.config)
        late = 0 if detector.take_late is None else detector.take_late()
        found, new_state, timers, fired = unpack(out, frame.index, len(frame) == 1, "detect", detector.sees_partition_time)
        new_state = detector.state.check_returned(new_state, batch_keys)
        new_state = detector.state.completed(new_state, left_out(new_state, batch_keys, first, store.read))
        return _Call(frame, codes, keys, batch_keys, first, last, found, new_state, timers, timer_detections(fired, batch_keys, None), late)


@dataclass
class _Call:
    """What one `detect` call answered, checked, and what it was about."""

    frame: pd.DataFrame
    codes: np.ndarray
    keys: list[str]
    batch_keys: pd.Index
    first: np.ndarray
    last: np.ndarray
    found: list[tuple[int, dict]]
    new_state: pd.DataFrame
    timers: Any
    fired: list[TimerDetection]
    late: int = 0  # records the detector dropped as late


class _Raised(Exception):
    """A call in a round raised: the rounds are undone and the records run one split at a time."""


def _fire(detector, config, store: PartitionStore, event_ms: int, tag: int, result: Result) -> None:
    if detector.on_timer is None:
        return
    for _ in range(MAX_FIRINGS):
        due = store.due(event_ms)
        if not due:
            return
        _fire_keys(detector, config, store, due, tag, result, np.full(len(due), event_ms, dtype=np.int64))
    raise RuntimeError(f"on_timer keeps setting timers at or before event time {event_ms}: a timer must be later than the time it fires at")


def _fire_keys(detector, config, store: PartitionStore, due: list[tuple[str, int]], tag: int, result: Result, event_ms: np.ndarray) -> None:
    """`on_timer` for the `due` keys, `event_ms` the partition's event time each fires at (given
    to a detector that sees it)."""
    keys = [k for k, _ in due]
    index = pd.Index(keys, dtype=object, name=KEY)
    fired = store.frame_of(keys)
    fired[DEADLINE] = rec.utc_times([at for _, at in due])
    if detector.sees_partition_time:
        fired[PARTITION_TIME] = rec.utc_times(event_ms)
    try:
        out = detector.on_timer(fired, config)
        detections, new_state, timers, _ = unpack(out, None, False, "on_timer")
        if not detections.index.isin(index).all():
            raise ValueError("on_timer() returned detections whose index is not a key whose timer fired")
        found = timer_detections(detections, index, dict(due))
        new_state = detector.state.check_returned(new_state, index)
        new_state = detector.state.completed(new_state, left_out(new_state, index, None, lambda keys, _: store.frame_of(keys)))
        # A fired timer is spent: the key has a timer again only if on_timer sets one, later.
        again = key_timers(timers, index)
        looping = [k for k, at in due if again.get(k, at + 1) <= at]
        if looping:
            raise ValueError(f"on_timer set a timer at or before the deadline it fired at (it would fire for ever), for {looping[:3]}")
        timers = {k: None for k in keys} | again
        prepared = store.prepare(new_state, keys, [store.seen_of(k) for k in keys], timers, tag=tag)
    except Exception as exc:  # noqa: BLE001 - user code: a dead letter, never a crash
        if len(due) > 1:
            middle = len(due) // 2
            _fire_keys(detector, config, store, due[:middle], tag, result, event_ms[:middle])
            _fire_keys(detector, config, store, due[middle:], tag, result, event_ms[middle:])
            return
        message = "".join(traceback.format_exception_only(type(exc), exc)).strip()[:2000]
        (key, at), values = due[0], store.values_of(due[0][0])
        value = json.dumps({"key": key, "state": values, "deadline_ms": at}, default=str).encode()
        result.failed_timers.append(TimerFailure(key, message, value))
        store.clear_timer(key, tag)  # spent, as if it had fired: it would fail again, and hold its key past the TTL
        return
    store.write(prepared, tag)
    result.fired += found


def _tell_once(detector: str, exc: Exception) -> None:
    """A warning, once per detector and error type, that its run on the store raised: its records
    then run through `detect`, with the same answers, more slowly if it raises every batch."""
    said = (detector, type(exc).__name__)
    if said not in _TOLD:
        _TOLD.add(said)
        _log.warning("run on the store failed; the batch runs through detect", detector=detector, error=f"{type(exc).__name__}: {str(exc)[:200]}")
