"""A window detector's `detect` and `on_timer`: the rule record by record, in arrival order, over
each key's records still inside a window that can change (the `vectorised` module does the common
cases over the whole batch at once, with the same answers).

A key's state: `t` and `v`, the times and values of its counted records a window can still take;
`emitted`, what it already emitted: window starts (tumbling, hopping), the time of the last
emission (sliding), the records that took a session over the threshold (AtLeast) or the last
record of the newest closed session (Final).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd

from detectorkit.state.columns import lists
from detectorkit.windows import vectorised
from detectorkit.windows.aggregates import Aggregate, Count, DistinctCount, Emit, Every, Final, values_of
from detectorkit.windows.kinds import Session, Sliding, Window, members, ms, ms_or_zero

STATE_COLUMNS = {"t": "list<int64>", "v": "list<float64>", "emitted": "list<int64>"}
Held = tuple[list[int], list[float], list[int]]


@dataclasses.dataclass(frozen=True)
class Rule:
    window: Window
    aggregate: Aggregate
    emit: Emit
    where: Callable[[pd.DataFrame], Any] | None

    def detect(self, records: pd.DataFrame, state: pd.DataFrame, config: Any) -> tuple:
        counted = records if self.where is None else records[np.asarray(self.where(records), dtype=bool)]
        timers = None
        if not vectorised.applies(self.window, self.aggregate, self.emit):
            found, new_state, timers = self._one_by_one(counted, state)
        else:
            found, new_state, slow = vectorised.detect(self.window, self.aggregate, self.emit, counted, state)
            if slow is not None:
                # The keys whose times go back take the rule record by record.
                slow_found, slow_state, _ = self._one_by_one(counted[counted["key"].isin(slow)], state[state.index.isin(slow)])
                found = sorted(found + slow_found, key=lambda f: records.index.get_loc(f[0]))
                new_state = pd.concat([new_state, slow_state])
        out = (self.detections(found, records), new_state)
        if isinstance(self.emit, Final):
            out += (_times(timers, records.index.dtype),)
        if len(counted) == len(records):
            return out
        # A key whose records here all go uncounted is still seen: its state (empty, if it had none)
        # is written, so the runtime's expiry judges it by all its records, as one pass does, and
        # not by those of the batch its first counted record happens to share.
        unseen = pd.Index(records["key"].unique()).difference(out[1].index)
        if not len(unseen):
            return out
        return (out[0], pd.concat([out[1], frame_of(dict.fromkeys(unseen, ([], [], [])))]), *out[2:])

    def _one_by_one(self, counted: pd.DataFrame, state: pd.DataFrame) -> tuple[list, pd.DataFrame, dict[Any, int | None]]:
        """(found, new state, Final()'s timer after each record) of the rule, record by record."""
        times = counted["event_time"].astype("int64").to_numpy() // 1_000_000
        values = values_of(self.aggregate, counted)
        keys = counted["key"].to_numpy()
        positions = counted.index.to_numpy()
        found: list[tuple[Any, int, int, float]] = []
        new: dict[str, Held] = {}
        held = {k: (list(t), list(v), list(e)) for k, t, v, e in _rows(state)}
        by_key = pd.Series(np.arange(len(keys))).groupby(pd.factorize(keys)[0], sort=False).indices if len(keys) else {}
        timers: dict[Any, int | None] = {}
        for rows in by_key.values():
            key = keys[rows[0]]
            t, v, e = held.pop(key, ([], [], []))
            for i in rows:
                emitted = self._record(t, v, e, int(times[i]), float(values[i]))
                if emitted is not None:
                    found.append((positions[i], *emitted))
                if isinstance(self.emit, Final):
                    # After each record, not only the key's last: the runner fires a timer between
                    # the records it falls among, before the records that come after it.
                    timers[positions[i]] = self._next_close(t, e)
            new[key] = self._pruned(t, v, e)
        new.update(held)  # keys with state and no counted record here keep it as it was
        return found, frame_of(new), timers

    def on_timer(self, fired: pd.DataFrame, config: Any) -> tuple[pd.DataFrame, pd.DataFrame, pd.Series]:
        """Final(): the windows of each fired key that close by its timer, each once."""
        found, new, timers = [], {}, {}
        grace = ms_or_zero(self.window.grace_seconds)
        deadlines = fired["deadline"].astype("int64").to_numpy() // 1_000_000
        for (key, t, v, e), deadline in zip(_rows(fired), deadlines.tolist(), strict=True):
            t, v, e = list(t), list(v), list(e)
            times, vals = np.asarray(t, dtype=np.int64), np.asarray(v, dtype=np.float64)
            for span in self._open(times, e):
                if self._closes(span) + grace > deadline:
                    continue
                found.append((key, *span, self.aggregate.of(vals[members(self.window, times, span)])))
                e.append(span[1] if isinstance(self.window, Session) else span[0])
            new[key] = self._pruned(t, v, e)
            timers[key] = self._next_close(new[key][0], new[key][2])
        return self.detections(found, None), frame_of(new), _times(timers, object)

    def _open(self, times: np.ndarray, e: list[int]) -> list[tuple[int, int]]:
        """Final(): the key's windows not emitted yet, in the order they close."""
        if isinstance(self.window, Session):
            closed = max(e) if e else None
            return [s for s in self.window.sessions(times) if closed is None or s[1] > closed]
        return sorted({s for x in times.tolist() for s in self.window.spans(x) if s[0] not in e})

    def _closes(self, span: tuple[int, int]) -> int:
        return span[1] + self.window.gap_ms if isinstance(self.window, Session) else span[1]

    def _next_close(self, t: list[int], e: list[int]) -> int | None:
        """When the earliest window of the key's records that has not closed closes (Final())."""
        spans = self._open(np.asarray(t, dtype=np.int64), e)
        return min(self._closes(s) for s in spans) + ms_or_zero(self.window.grace_seconds) if spans else None

    def _record(self, t: list[int], v: list[float], e: list[int], at: int, value: float) -> tuple[int, int, float] | None:
        """One record, in arrival order: appended to its key's records (unless late), its windows'
        aggregates taken over the key's records seen so far; the detection it makes, if any."""
        grace = ms_or_zero(self.window.grace_seconds)
        if t and at < max(t) - grace:
            return None  # late: its windows are closed
        session = isinstance(self.window, Session)
        if session and isinstance(self.emit, Final) and e and at < max(e) + self.window.gap_ms:
            return None  # it would join a session already closed
        t.append(at)
        v.append(value)
        if isinstance(self.emit, Final):
            return None  # its windows are emitted when they close (on_timer)
        times, vals = np.asarray(t), np.asarray(v)
        if session:
            span = next(s for s in self.window.sessions(times) if s[0] <= at <= s[1])
            result = self.aggregate.of(vals[members(self.window, times, span)])
            if isinstance(self.emit, Every):
                return (*span, result)
            if result < self.emit.threshold or any(span[0] <= x <= span[1] for x in e):
                return None  # below, or the session (or one it merged with) emitted already
            e.append(at)
            return (*span, result)
        made = None
        for span in self.window.spans(at):
            result = self.aggregate.of(vals[members(self.window, times, span)])
            if isinstance(self.emit, Every):
                return (*span, result)
            if result < self.emit.threshold:
                continue
            if isinstance(self.window, Sliding):
                if e and at - e[-1] <= ms(self.window.seconds):
                    return None  # a window emitted lately: none again for a window's length
                e[:] = [at]
                return (*span, result)
            if span[0] not in e:
                e.append(span[0])
                made = made or (*span, result)
        return made

    def _pruned(self, t: list[int], v: list[float], e: list[int]) -> Held:
        """What can still count: records and emitted windows a record not late may still land with."""
        if not t:
            return t, v, e
        grace, newest = ms_or_zero(self.window.grace_seconds), max(t)
        if isinstance(self.window, Session):
            return self._pruned_sessions(t, v, e, newest - grace)
        horizon = newest - grace - ms(self.window.seconds)
        if isinstance(self.emit, Final):
            # Until its windows have closed; the newest stays, for the lateness of the next record.
            keep = [i for i, x in enumerate(t) if x == newest or any(s not in e for s, _ in self.window.spans(x))]
        else:
            keep = [i for i, x in enumerate(t) if x >= horizon] if isinstance(self.window, Sliding) else [i for i, x in enumerate(t) if x > horizon]
        # A window that starts at or before the horizon can take no record any more (unless a
        # record kept is in it: the newest, whose closed windows must stay closed).
        held = {s for i in keep for s, _ in self.window.spans(t[i])} if isinstance(self.emit, Final) else set()
        emitted = e if isinstance(self.window, Sliding) else [s for s in e if s > horizon or s in held]
        return [t[i] for i in keep], [v[i] for i in keep], emitted

    def _pruned_sessions(self, t: list[int], v: list[float], e: list[int], earliest: int) -> Held:
        """A session a record not late (at or after `earliest`) can still join, with its records; for
        Final() the newest record too (for lateness) and the newest closed session's last record."""
        gap, times = self.window.gap_ms, np.asarray(t, dtype=np.int64)
        if isinstance(self.emit, Final):
            closed = max(e) if e else None
            keep = [i for i, x in enumerate(t) if closed is None or x > closed or x == max(t)]
            return [t[i] for i in keep], [v[i] for i in keep], [] if closed is None else [closed]
        alive = [s for s in self.window.sessions(times) if s[1] + gap > earliest]
        keep = [i for i, x in enumerate(t) if any(a <= x <= b for a, b in alive)]
        oldest = min((t[i] for i in keep), default=None)
        return [t[i] for i in keep], [v[i] for i in keep], [x for x in e if oldest is not None and x >= oldest]

    def detections(self, found: list[tuple[Any, int, int, float]], records: pd.DataFrame | None) -> pd.DataFrame:
        """Detections indexed by record (by key for timers, `records` None), each naming its key."""
        name = self.aggregate.name
        if not found:
            index = records.index[:0] if records is not None else pd.Index([], dtype=object)
            return pd.DataFrame({"key": [], "window_start_ms": [], "window_end_ms": [], name: []}, index=index)
        at, starts, ends, results = zip(*found, strict=True)
        if isinstance(self.aggregate, Count | DistinctCount):
            results = [int(r) for r in results]  # a count reads as one
        if records is None:
            index = pd.Index(at, dtype=object)
            keys = list(at)
        else:
            index = pd.Index(at)
            keys = records["key"].to_numpy()[records.index.get_indexer(index)].tolist()
        return pd.DataFrame({"key": keys, "window_start_ms": list(starts), "window_end_ms": list(ends), name: list(results)}, index=index)


def _times(timers: dict[Any, int | None], dtype: Any) -> pd.Series:
    return pd.Series(
        [pd.NaT if at is None else pd.Timestamp(at, unit="ms", tz="UTC") for at in timers.values()],
        index=pd.Index(list(timers), dtype=dtype),
        dtype="datetime64[ns, UTC]",
    )


def _rows(state: pd.DataFrame) -> Iterator[tuple[str, Any, Any, Any]]:
    if state.empty:
        return iter(())
    return zip(state.index, state["t"].tolist(), state["v"].tolist(), state["emitted"].tolist(), strict=True)


def frame_of(new: dict[str, Held]) -> pd.DataFrame:
    keys = list(new)
    columns = {}
    for n, (name, dtype) in enumerate(((c, np.int64 if t == "list<int64>" else np.float64) for c, t in STATE_COLUMNS.items())):
        rows = [new[k][n] for k in keys]
        columns[name] = lists(np.array([x for r in rows for x in r], dtype=dtype), [len(r) for r in rows])
    return pd.DataFrame(columns, index=pd.Index(keys, dtype=object))
