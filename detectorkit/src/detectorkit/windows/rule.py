"""A window rule's `detect` and `on_timer`: each key's counted records in arrival order, over the
key's records still inside a window that can change, with the partition's event time at each.

A record goes through three steps. First, for a rule that emits when windows close (`Final`,
episodes), the key's windows that the partition's event time has closed by then are closed: their
aggregates are taken. Then the record is admitted, or dropped as late: older than its key's newest
counted record by more than the grace, or taken by no open window. Then, for a rule that emits as
records come (`Every`, `When`, `AtLeast`), each window the record changed is a candidate with its
aggregates after it. The condition (`having`) is judged once over all the candidates and closed
windows of the call, a frame of them, and each key's detections are then chosen in order: what a
window or an episode already emitted is remembered in the key's state.

A key's state (typed columns): `t`, its counted records' times still needed, in time order; `v`
(and `v1`, `v2`, ...), their values for the aggregates that read a field; `emitted`, what it
emitted (the starts of tumbling and hopping windows, the ends of sliding ones, a time inside each
session) or, for a rule that emits when windows close, how far its windows are closed (one value:
windows ending there or before; a session's last record); `episodes`, each open episode's start,
end, number of windows and each aggregate's peak, end to end.
"""

from __future__ import annotations

import functools
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from detectorkit.records import utc_times
from detectorkit.state.declaration import EVENT_TIME, KEY, PARTITION_TIME
from detectorkit.state.in_store import KeyColumns
from detectorkit.windows import vectorised
from detectorkit.windows.accumulate import COUNT, DISTINCT, MEAN, SUM, Accumulator, Run, needs_of, over
from detectorkit.windows.closing import Closing
from detectorkit.windows.emitting import END, START, Emitting
from detectorkit.windows.held import Calls, Held, Key
from detectorkit.windows.kinds import Hopping, Session, Sliding, Tumbling, Window, ms, ms_or_zero

NO_TIME = np.iinfo(np.int64).min  # NaT, as nanoseconds
# A window holding more records than this keeps its aggregates running through a call, instead of
# taking them over its records at each one (a busy key's window: thousands of records).
BUSY = 16
# Whether the commonest rules run as array operations over the batch (`vectorised`): off, the
# engine runs them too (the tests compare the two).
VECTORISED = True
# Whether a sliding window emitted at every record runs compiled on the store's columns
# (`detect_in_store`, `compiled`): off, `detect` runs it (the tests compare the two).
COMPILED = True


class Rule(Held, Emitting, Closing):
    """A window rule resolved for one config: `where` and `having` take the records (the windows)
    alone, the config bound."""

    def __init__(
        self,
        window: Window,
        aggregates: dict[str, Any],
        emit: Any,
        where: Callable[[pd.DataFrame], Any] | None,
        having: Callable[[pd.DataFrame], Any] | None,
        threshold: tuple[str, float] | None,
        mode: str,
    ):
        self.window, self.emit, self.where, self.having, self.threshold, self.mode = window, emit, where, having, threshold, mode
        self.names = tuple(aggregates)
        self.kinds = {n: a for n, a in aggregates.items()}
        # A value column per field an aggregate reads (a distinct count reads a hash of any value).
        fields: list[tuple[str, bool]] = []
        plan = []
        for a in aggregates.values():
            if a.field is None:
                plan.append((COUNT, -1))
                continue
            column = (a.field, a.kind == DISTINCT)
            if column not in fields:
                fields.append(column)
            plan.append((a.kind, fields.index(column)))
        self.fields, self.plan = tuple(fields), tuple(plan)
        self.needs = needs_of(self.plan, len(fields))
        self.width = max(1, len(fields))  # value columns held: "v" always, for the state's shape
        self.grace = ms_or_zero(window.grace_seconds)
        self.sliding = isinstance(window, Sliding)
        # A window closes once the partition's event time passes the last instant a record may land
        # in it, plus the grace: a sliding window holds its end, [t - size, t], so it closes a
        # millisecond after the others' would (their end is not theirs: [start, end)).
        self.after = self.grace + (1 if self.sliding else 0)
        self.session = isinstance(window, Session)
        self.size = window.gap_ms if self.session else ms(window.seconds)
        self.hop = ms(window.hop_seconds) if isinstance(window, Hopping) else self.size
        self.closing = mode in ("final", "episode", "silent")
        self.late = 0  # records dropped as late since `take_late`
        if mode == "silent":
            # A window is judged once no record can come within the silence after its end: a
            # record at its end + the silence would not break it, so the last that could is a
            # millisecond before, and the grace after that.
            self.after = self.grace + ms(emit.seconds)
        # Counts, sums, means and distinct counts of any fields over sliding or tumbling windows for
        # every record, or a count or a sum on reaching a threshold: array operations over the batch
        # (`vectorised`), the same answers and state.
        kinds = {a.kind for a in aggregates.values()}
        self.vectorised = isinstance(window, Sliding | Tumbling) and (
            (mode == "every" and having is None and kinds <= {COUNT, SUM, MEAN, DISTINCT})
            or (mode == "when" and threshold is not None and len(aggregates) == 1 and kinds <= {COUNT, SUM})
        )
        # The sliding windows among those, for every record: compiled, on the store's columns.
        self.compiled = self.sliding and mode == "every" and where is None and having is None and kinds <= {COUNT, SUM, MEAN, DISTINCT}

    def detect_in_store(self, records: pd.DataFrame, held: KeyColumns, arrays: bool = False) -> tuple | None:
        """`detect` on the store's columns (`state.in_store`), compiled (`windows.compiled`): the
        detections, the keys' new columns and newest times, and how many records were late; None
        where `detect` must run it. With `arrays`, the detections as (the positions of the records
        answered, each aggregate at them by name) rather than a frame: a model scores them as they are."""
        if not COMPILED:
            return None
        from detectorkit.windows import compiled  # numba's import and compiling: only for the rules that use it

        t = records[EVENT_TIME].astype("int64").to_numpy() // 1_000_000
        values = np.stack(self._value_arrays(records) or [np.zeros(len(records))])
        got = compiled.sliding_every_of(self.size, self.grace, self.plan, self.value_columns, t, values, held)
        if got is None:
            return None
        at, aggregates, columns, seen, late = got
        # Counts as integers from the start (`_counts_as_ints`' types), not converted in the frame.
        named = {
            name: a.astype(np.int64) if kind in (COUNT, DISTINCT) else a for name, (kind, _), a in zip(self.names, self.plan, aggregates, strict=True)
        }
        if arrays:
            return (at, named), columns, seen, late
        found = pd.DataFrame({KEY: records[KEY].to_numpy()[at], START: t[at] - self.size, END: t[at], **named}, index=records.index[at])
        return found, columns, seen, late

    def warm(self, state: Any) -> None:
        """The compiled code `detect_in_store` runs, loaded from numba's cache (or compiled): run
        on a record of a store of its own (`state`, the rule's State), as a batch runs it."""
        if not COMPILED:
            return
        from detectorkit.state.store import PartitionStore  # the runner's store, only where a worker warms it

        store = PartitionStore(state, 0)
        fields = {name: ["k"] if hashed else [1.0] for name, hashed in self.fields}
        records = pd.DataFrame({KEY: np.array(["k"], dtype=object), EVENT_TIME: utc_times([0]), **fields})
        slots, seen, columns = store.lists_of(["k"])
        out = self.detect_in_store(records, KeyColumns(np.zeros(1, dtype=np.int64), ["k"], seen, columns, np.zeros(1, dtype=np.int64), state.ttl_ms))
        if out is not None:
            store.write_lists(["k"], slots, out[2], out[1], 0)
            store.take_changes()

    # ---- the state's columns ----------------------------------------------------------------

    @functools.cached_property
    def value_columns(self) -> list[str]:
        return ["v", *(f"v{i}" for i in range(1, len(self.fields)))]

    @property
    def state_columns(self) -> dict[str, str]:
        columns = {"t": "list<int64>", **dict.fromkeys(self.value_columns, "list<float64>"), "emitted": "list<int64>"}
        if self.mode == "episode":
            columns["episodes"] = "list<float64>"
        return columns

    # ---- detect and on_timer -----------------------------------------------------------------

    def detect(self, records: pd.DataFrame, state: pd.DataFrame, config: Any) -> tuple:
        counted = records if self.where is None else records[np.asarray(self.where(records), dtype=bool)]
        if self.vectorised and VECTORISED and len(counted):
            return self._detect_vectorised(records, counted, state)
        return self._detect(records, counted, state)

    def _detect(self, records: pd.DataFrame, counted: pd.DataFrame, state: pd.DataFrame, values: list[list[float]] | None = None) -> tuple:
        """The engine: a record at a time. `values`: the counted records' value columns, if already read."""
        held = self._held(state)
        calls = Calls()
        times = counted[EVENT_TIME].astype("int64").to_numpy() // 1_000_000
        marks = counted[PARTITION_TIME].astype("int64").to_numpy() // 1_000_000 if self.closing else times
        if values is None:
            values = self._values(counted)
        keys = counted[KEY].to_numpy()
        index = counted.index.to_numpy()
        by_key = pd.Series(np.arange(len(keys))).groupby(pd.factorize(keys)[0], sort=False).indices if len(keys) else {}
        touched: dict[str, Key] = {}
        last_mark: dict[str, int] = {}
        times, marks, index = times.tolist(), marks.tolist(), index.tolist()
        for rows in by_key.values():
            key = keys[rows[0]]
            k = touched[key] = held.pop(key, None) or self._new_key()
            for i in rows.tolist():
                if self.closing:
                    self._close(key, k, marks[i], calls)
                self._record(key, k, index[i], times[i], [column[i] for column in values], calls)
            last_mark[key] = marks[rows[-1]]
        self.late += calls.late
        found, fired = self._choose(calls, touched, records.index.dtype)
        if self.mode == "episode":
            fired = _joined_frames(fired, self._end_episodes(touched, last_mark))
        for k in touched.values():
            self._prune(k)
        new_state = self._with_uncounted(records, counted, self._frame(touched), pd.Index(list(held), dtype=object))
        if not self.closing:
            return found, new_state
        # Each counted key's timer, on its last record: when its earliest open window closes.
        last = records[records[KEY].isin(list(touched))].groupby(KEY, sort=False).tail(1)
        at = [self._next_close(touched[key]) for key in last[KEY].tolist()]
        timers = pd.Series(_times(at), index=last.index)
        return found, new_state, timers, fired

    def _detect_vectorised(self, records: pd.DataFrame, counted: pd.DataFrame, state: pd.DataFrame) -> tuple:
        """`detect` as array operations; the keys they leave (a record back in time under a sliding
        window) through the engine."""
        arrays = self._value_arrays(counted)
        threshold = None if self.threshold is None else self.threshold[1]
        done = vectorised.detect(
            self.size, self.grace, self.sliding, self.plan, threshold, counted, arrays or [np.zeros(len(counted))], state, self.value_columns
        )
        if done is None:
            return self._detect(records, counted, state, [a.tolist() for a in arrays])
        found, new_state, slow, late = done
        self.late += late
        columns = dict(zip(self.names, found["aggregates"], strict=True))
        out = pd.DataFrame(
            {KEY: found["key"], START: found["start"], END: found["end"], **columns},
            index=pd.Index(found["index"], dtype=records.index.dtype),
        )
        self._counts_as_ints(out)
        if slow is not None:
            mine = counted[KEY].isin(slow).to_numpy()
            more, more_state = self._detect(counted[mine], counted[mine], state[state.index.isin(slow)], [a[mine].tolist() for a in arrays])
            out = _joined_frames(out, more)
            new_state = pd.concat([new_state, more_state])
        return out, self._with_uncounted(records, counted, new_state, state.index)

    def _with_uncounted(self, records: pd.DataFrame, counted: pd.DataFrame, new_state: pd.DataFrame, held: pd.Index) -> pd.DataFrame:
        """`new_state` and a state for each key whose records here all went uncounted and that
        `held` (keys with a state left as it was) does not hold: such a key is still seen, its state
        (empty) written, so the runtime's expiry judges it by all its records, as one pass does."""
        if counted is records:
            return new_state  # every key counted: each has its new state
        unseen = pd.Index(records[KEY].unique()).difference(new_state.index).difference(held)
        if not len(unseen):
            return new_state
        return pd.concat([new_state, self._frame({k: self._new_key() for k in unseen})])

    def on_timer(self, fired: pd.DataFrame, config: Any) -> tuple:
        """The windows (and episodes) of each fired key that the partition's event time has closed."""
        held = self._held(fired)
        calls = Calls()
        marks = dict(zip(fired.index, (fired[PARTITION_TIME].astype("int64") // 1_000_000).tolist(), strict=True))
        for key, k in held.items():
            self._close(key, k, marks[key], calls)
        _, detections = self._choose(calls, held, object)
        if self.mode == "episode":
            detections = _joined_frames(detections, self._end_episodes(held, marks))
        for k in held.values():
            self._prune(k)
        timers = {key: self._next_close(k) for key, k in held.items()}
        at = pd.Series(
            _times(list(timers.values())),
            index=pd.Index(list(timers), dtype=object),
        )
        return detections, self._frame(held), at

    def take_late(self) -> int:
        """How many records were dropped as late since the last call."""
        late, self.late = self.late, 0
        return late

    # ---- a record ----------------------------------------------------------------------------

    def _record(self, key: str, k: Key, index: int, at: int, values: list[float], calls: Calls) -> None:
        """Admits one counted record (or drops it as late) and, for a rule that emits as records
        come, adds the windows it changed to the candidates."""
        t = k.t
        if t and at < t[-1] - self.grace:
            calls.late += 1
            return  # late for its key
        if self.session:
            self._record_session(key, k, index, at, values, calls)
            return
        if self.closing and not self._open_for(k, at):
            calls.late += 1
            return  # every window it would land in has closed
        place = bisect_right(t, at)
        if place < len(t):
            k.run = None  # a record among the others: the run's indices shift
        t.insert(place, at)
        for c, column in enumerate(k.cols):
            column.insert(place, values[c] if c < len(values) else 0.0)
        if self.sliding:
            if not self.closing:
                self._sliding_candidates(key, k, index, at, calls)
            return
        if self.closing:
            return  # its windows' aggregates are taken when they close (`_close`), once
        for start in self._starts(at):
            calls.rows.append((key, start, start + self.size, *self._window(k, start, values, at)))
            calls.owner.append(index)
            if self.mode == "every":
                break  # a tumbling window: one

    def _starts(self, at: int) -> list[int]:
        """The starts of the tumbling or hopping windows a time is in, oldest first."""
        last = at // self.hop * self.hop
        if self.hop == self.size:
            return [last]
        return list(range((at - self.size) // self.hop * self.hop + self.hop, last + 1, self.hop))

    def _window(self, k: Key, start: int, values: list[float], at: int) -> tuple[float, ...]:
        """A tumbling or hopping window's aggregates after a record at `at` (in the key's records):
        over its records, or, for a busy window, kept running from then on in the call."""
        acc = k.accs.get(start)
        if acc is not None:
            acc.add(values, at)
            return acc.read(self.plan)
        lo, hi = bisect_left(k.t, start), bisect_left(k.t, start + self.size)
        if hi - lo > BUSY:
            acc = k.accs[start] = self._accumulated(k, lo, hi)
            return acc.read(self.plan)
        return over(self.plan, k.cols, lo, hi)

    def _accumulated(self, k: Key, lo: int, hi: int) -> Accumulator:
        """The running aggregates of the key's records lo to hi."""
        acc = Accumulator(self.needs)
        width = len(self.fields)
        for i in range(lo, hi):
            acc.add([column[i] for column in k.cols[:width]], k.t[i])
        return acc

    def _sliding_candidates(self, key: str, k: Key, index: int, at: int, calls: Calls) -> None:
        """A sliding window per record, [t - size, t]: the record's own, and (a late record) the
        windows of the records after it in time that it falls in, over the records so far."""
        t, size = k.t, self.size
        ends = [at]
        if self.mode != "every":
            above = bisect_right(t, at)
            ends += sorted(set(t[above : bisect_right(t, at + size)]))
        for end in ends:
            lo, hi = bisect_left(t, end - size), bisect_right(t, end)
            calls.rows.append((key, end - size, end, *self._sliding(k, lo, hi)))
            calls.owner.append(index)

    def _sliding(self, k: Key, lo: int, hi: int) -> tuple[float, ...]:
        """The aggregates of the key's records lo to hi: over them, or (a window of many records
        with values to read) from the key's run, moved forward."""
        if not self.fields or hi - lo <= BUSY:
            return over(self.plan, k.cols, lo, hi)
        run = k.run
        if run is None or lo < run.lo or hi < run.hi:
            run = k.run = Run(self.plan, self.needs, lo)
        return run.moved(k.cols, lo, hi)

    def _record_session(self, key: str, k: Key, index: int, at: int, values: list[float], calls: Calls) -> None:
        gap, sessions = self.size, self._sessions(k)
        j = bisect_right([s[0] for s in sessions], at) - 1
        if self.closing and at < k.closed + gap:
            calls.late += 1
            return  # it would join a session already closed
        t = k.t
        place = bisect_right(t, at)
        t.insert(place, at)
        for c, column in enumerate(k.cols):
            column.insert(place, values[c] if c < len(values) else 0.0)
        joins_before = j >= 0 and at - sessions[j][1] < gap
        joins_after = j + 1 < len(sessions) and sessions[j + 1][0] - at < gap
        if joins_before and joins_after:  # it bridges two sessions: one
            first, second = sessions[j], sessions.pop(j + 1)
            merged = k.accs.pop(first[0])
            merged.merge(k.accs.pop(second[0]))
            first[1] = second[1]
            k.accs[first[0]] = merged
            session = first
        elif joins_before:
            session = sessions[j]
            session[1] = max(session[1], at)
        elif joins_after:
            session = sessions[j + 1]
            k.accs[at] = k.accs.pop(session[0])
            session[0] = at
        elif self.closing and at + gap + self.grace <= k.now:
            del t[place]
            for column in k.cols:
                del column[place]
            calls.late += 1
            return  # a session of its own, closed already
        else:
            session = [at, at]
            sessions.insert(j + 1, session)
            k.accs[at] = Accumulator(self.needs)
        acc = k.accs[session[0]]
        acc.add(values, at)
        if not self.closing:
            calls.rows.append((key, session[0], session[1], *acc.read(self.plan)))
            calls.owner.append(index)

    def _sessions(self, k: Key) -> list[list[int]]:
        """The key's sessions, made from its records once a call, with their aggregates."""
        if k.sessions is None:
            k.sessions = []
            t = k.t
            lo = 0
            for i in range(1, len(t) + 1):
                if i == len(t) or t[i] - t[i - 1] >= self.size:
                    k.sessions.append([t[lo], t[i - 1]])
                    acc = k.accs[t[lo]] = Accumulator(self.needs)
                    for r in range(lo, i):
                        acc.add([column[r] for column in k.cols[: len(self.fields)]], t[r])
                    lo = i
        return k.sessions


def _times(ms: list[int | None]) -> pd.DatetimeIndex:
    """Times in epoch ms (None: none) as UTC times, NaT for none: as arrays, not one Timestamp each."""
    ns = np.array([NO_TIME if m is None else m * 1_000_000 for m in ms], dtype=np.int64)
    return pd.DatetimeIndex(ns.view("datetime64[ns]")).tz_localize("UTC")


def _joined_frames(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    return b if not len(a) else a if not len(b) else pd.concat([a, b])
