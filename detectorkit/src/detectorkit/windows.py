"""Windows over event time, per key: a time-based rule without hand-written state.

    from detectorkit import windows

    DETECTOR = windows.detector(
        name="failed-logins",
        window=windows.Sliding(seconds=60),
        aggregate=windows.Count(),
        emit=windows.AtLeast(5),  # once, on the record that takes a window to 5
        where=lambda records: records["status"] == "failed",
        required_fields=("status",),
    )

A window detector is a stateful `Detector` the runtime runs like any other: its state is the key's
records still inside a window that can change (and the windows it already emitted), kept in the
changelog, restored on a move, expired once no window can take a record any more (the window and
its grace: no TTL to set). Its answers are those of one pass over the records, whatever the
batches, restarts and rebalances, as every stateful detector's.

Windows, per key (the Kafka key) and over the record's event time (its Kafka timestamp):
  - `Tumbling(seconds)`: back to back, [k*size, (k+1)*size);
  - `Hopping(seconds, hop_seconds)`: of `seconds`, one starting every `hop_seconds`;
  - `Sliding(seconds)`: at each record, the `seconds` up to it, (t - size, t].
A record older than its key's newest record by more than `grace_seconds` is late and dropped (as
Kafka Streams drops it), whatever the window. Aggregates: `Count()`, `Sum(field)`, `Min(field)`,
`Max(field)`, `Mean(field)`, `DistinctCount(field)`. Emit: `Every()`, a detection for each record
with its window's aggregate, or `AtLeast(threshold)`, one when a window's aggregate first reaches
the threshold (a sliding window: none again for that key for a window's length).

`where` picks the records that count (the others are ignored, and a key keeps its windows through a
batch that holds none of its counted records).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from detectorkit.detector import Detector, NoConfig
from detectorkit.state.columns import lists
from detectorkit.state.declaration import State

# ---- windows -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Tumbling:
    seconds: float
    grace_seconds: float = 0.0

    def spans(self, t: int) -> list[tuple[int, int]]:
        size = _ms(self.seconds)
        start = t // size * size
        return [(start, start + size)]


@dataclasses.dataclass(frozen=True)
class Hopping:
    seconds: float
    hop_seconds: float
    grace_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.hop_seconds <= self.seconds:
            raise ValueError("Hopping(seconds, hop_seconds) needs 0 < hop_seconds <= seconds")

    def spans(self, t: int) -> list[tuple[int, int]]:
        size, hop = _ms(self.seconds), _ms(self.hop_seconds)
        last = t // hop * hop
        return [(start, start + size) for start in range(last, t - size, -hop)][::-1]


@dataclasses.dataclass(frozen=True)
class Sliding:
    seconds: float
    grace_seconds: float = 0.0

    def spans(self, t: int) -> list[tuple[int, int]]:
        return [(t - _ms(self.seconds), t)]


Window = Tumbling | Hopping | Sliding


def _ms(seconds: float) -> int:
    ms = int(round(seconds * 1000))
    if ms <= 0:
        raise ValueError(f"a window's length must be above 0 s, not {seconds}")
    return ms


def _members(window: Window, times: np.ndarray, span: tuple[int, int]) -> np.ndarray:
    start, end = span
    # A sliding window ends at its record, included; the others include their start.
    return (times > start) & (times <= end) if isinstance(window, Sliding) else (times >= start) & (times < end)


# ---- aggregates --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Aggregate:
    """Of a field of the window's records (`field`), named `name` in the detection."""

    field: str | None = None
    name: str = ""
    default_name: ClassVar[str]
    reduce: ClassVar[Callable[[np.ndarray], Any]]

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.default_name)

    def of(self, values: np.ndarray) -> float:
        return float(type(self).reduce(values))


class Count(_Aggregate):
    default_name, reduce = "count", len


class Sum(_Aggregate):
    default_name, reduce = "sum", np.sum


class Min(_Aggregate):
    default_name, reduce = "min", np.min


class Max(_Aggregate):
    default_name, reduce = "max", np.max


class Mean(_Aggregate):
    default_name, reduce = "mean", np.mean


class DistinctCount(_Aggregate):
    default_name = "distinct"

    @staticmethod
    def reduce(values: np.ndarray) -> int:
        return len(np.unique(values))


Aggregate = Count | Sum | Min | Max | Mean | DistinctCount


def _values(aggregate: Aggregate, records: pd.DataFrame) -> np.ndarray:
    """The numbers an aggregate takes of each record; a distinct count takes a hash of any value."""
    if aggregate.field is None:
        return np.zeros(len(records))
    column = records[aggregate.field]
    if isinstance(aggregate, DistinctCount):
        # 53 bits: a float64 holds it exactly, and two of a window's values collide with odds of 1 in 2^53.
        return (pd.util.hash_array(column.astype(str).to_numpy()) >> np.uint64(11)).astype(np.float64)
    return pd.to_numeric(column, errors="raise").to_numpy(dtype=np.float64)


# ---- emit --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Every:
    """A detection for each counted record, with its window's aggregate."""


@dataclasses.dataclass(frozen=True)
class AtLeast:
    """One detection when a window's aggregate first reaches `threshold`."""

    threshold: float


@dataclasses.dataclass(frozen=True)
class Final:
    """One detection per window once it closes: when the partition's event time passes its end and
    grace (a timer). Its aggregate is over the records that reached it by then."""


Emit = Every | AtLeast | Final


# ---- the detector ------------------------------------------------------------------------------

STATE_COLUMNS = {"t": "list<int64>", "v": "list<float64>", "emitted": "list<int64>"}


def detector(
    name: str,
    window: Window,
    aggregate: Aggregate,
    emit: Emit,
    where: Callable[[pd.DataFrame], Any] | None = None,
    required_fields: tuple[str, ...] = (),
    config: type = NoConfig,
    event_time_field: str | None = None,
    key_field: str | None = None,
) -> Detector:
    """A stateful `Detector` computing `aggregate` over `window` for each key and emitting by `emit`."""
    if isinstance(window, Hopping) and isinstance(emit, Every):
        raise TypeError("Hopping windows emit AtLeast(threshold) or Final(): with Every a record would be a detection once per window it is in")
    if isinstance(emit, Final) and isinstance(window, Sliding):
        raise TypeError("Final() closes Tumbling or Hopping windows; a sliding window, one per record, never closes alone")
    if isinstance(emit, Final) and isinstance(window, Hopping) and window.seconds / window.hop_seconds > 50:
        raise ValueError("Final() with Hopping windows takes at most 50 windows per record (seconds / hop_seconds <= 50)")
    if aggregate.field is not None and aggregate.field not in required_fields:
        required_fields = (*required_fields, aggregate.field)
    # A key's state can change only while a record may still land in one of its windows: within the
    # window and the grace of its newest record. Past that, nothing of it is needed.
    ttl = window.seconds + window.grace_seconds
    rule = _Rule(window, aggregate, emit, where)
    return Detector(
        name=name,
        detect=rule.detect,
        config=config,
        required_fields=required_fields,
        state=State(columns=dict(STATE_COLUMNS), ttl_seconds=ttl, name=name),
        on_timer=rule.on_timer if isinstance(emit, Final) else None,
        event_time_field=event_time_field,
        key_field=key_field,
    )


@dataclasses.dataclass(frozen=True)
class _Rule:
    window: Window
    aggregate: Aggregate
    emit: Emit
    where: Callable[[pd.DataFrame], Any] | None

    def detect(self, records: pd.DataFrame, state: pd.DataFrame, config: Any) -> tuple[pd.DataFrame, pd.DataFrame]:
        counted = records if self.where is None else records[np.asarray(self.where(records), dtype=bool)]
        fast = self._fast(counted, state, records)
        if fast is not None:
            return fast
        times = counted["event_time"].astype("int64").to_numpy() // 1_000_000
        values = _values(self.aggregate, counted)
        keys = counted["key"].to_numpy()
        positions = counted.index.to_numpy()
        found: list[tuple[Any, int, int, float]] = []
        new: dict[str, tuple[list[int], list[float], list[int]]] = {}
        held = {k: (list(t), list(v), list(e)) for k, t, v, e in _rows(state)}
        order = pd.factorize(keys)[0] if len(keys) else np.array([], dtype=np.int64)
        by_key = pd.Series(np.arange(len(keys))).groupby(order, sort=False).indices if len(keys) else {}
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
                    timers[positions[i]] = self._next_close(t, v, e)
            new[key] = self._pruned(t, v, e)
        new.update(held)  # keys with state and no counted record here keep it as it was
        detections, new_state = self._detections(found, records), _frame(new)
        if not isinstance(self.emit, Final):
            return detections, new_state
        at = pd.Series(
            [pd.NaT if ms is None else pd.Timestamp(ms, unit="ms", tz="UTC") for ms in timers.values()],
            index=list(timers),
            dtype="datetime64[ns, UTC]",
        )
        return detections, new_state, at

    def _fast(self, counted: pd.DataFrame, state: pd.DataFrame, records: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame] | None:
        """`detect` as array operations over the whole batch, for a count or a sum over sliding or
        tumbling windows emitted Every() or AtLeast(): the same answers and the same state as the
        record-by-record rule (the property tests run both). None where it does not apply: another
        window, aggregate or emit, or a sliding window over a key whose times go back."""
        window, emit = self.window, self.emit
        if type(self.aggregate) not in (Count, Sum) or not isinstance(window, Sliding | Tumbling) or isinstance(emit, Final):
            return None
        size, grace = _ms(window.seconds), _ms_or_zero(window.grace_seconds)
        held_keys = state.index.to_numpy()
        codes, keys = pd.factorize(np.concatenate([held_keys, counted["key"].to_numpy()]))
        held_code, new_code = codes[: len(held_keys)], codes[len(held_keys) :]
        t_len = state["t"].list.len().to_numpy() if len(state) else np.zeros(0, dtype=np.int64)
        e_len = state["emitted"].list.len().to_numpy() if len(state) else np.zeros(0, dtype=np.int64)
        old_t = state["t"].list.flatten().to_numpy().astype(np.int64) if len(state) else np.zeros(0, dtype=np.int64)
        old_v = state["v"].list.flatten().to_numpy().astype(np.float64) if len(state) else np.zeros(0)
        old_e = state["emitted"].list.flatten().to_numpy().astype(np.int64) if len(state) else np.zeros(0, dtype=np.int64)
        e_code = np.repeat(held_code, e_len)
        # Each key's records in arrival order, its held ones first: a stable sort by key.
        code = np.concatenate([np.repeat(held_code, t_len), new_code])
        t = np.concatenate([old_t, counted["event_time"].astype("int64").to_numpy() // 1_000_000])
        v = np.concatenate([old_v, _values(self.aggregate, counted)])
        at = np.concatenate([np.full(len(old_t), -1), np.arange(len(counted))])  # -1: held
        order = np.argsort(code, kind="stable")
        code, t, v, at = code[order], t[order], v[order], at[order]
        # Late: older than the key's newest before it by more than the grace (a late record moves no newest).
        before = pd.Series(t).groupby(code).cummax().groupby(code).shift(1).to_numpy()
        kept = ~((at >= 0) & (t < before - grace))
        code, t, v, at = code[kept], t[kept], v[kept], at[kept]
        if isinstance(window, Sliding):
            if ((code[1:] == code[:-1]) & (t[1:] < t[:-1])).any():
                return None  # a key's times go back: which records a window holds depends on their order
            span = (t.max() - t.min() + size + 1) if len(t) else 1
            place = code * span + (t - (t.min() if len(t) else 0))
            lo = np.searchsorted(place, place - size, side="right")  # a key's first record inside (t - size, t]
            sums = np.concatenate([[0.0], np.cumsum(v if isinstance(self.aggregate, Sum) else np.ones(len(v)))])
            result = sums[np.arange(len(t)) + 1] - sums[lo]
            starts, ends = t - size, t
        else:
            starts = t // size * size
            ends = starts + size
            per_window = pd.Series(v if isinstance(self.aggregate, Sum) else np.ones(len(v))).groupby([code, starts])
            result = per_window.cumsum().to_numpy()
        fresh = at >= 0
        last_emit = {}
        if isinstance(emit, Every):
            emitting = fresh
        elif isinstance(window, Tumbling):
            done = set(zip(e_code.tolist(), old_e.tolist(), strict=True))
            candidate = fresh & (result >= emit.threshold)
            candidate &= np.array([(c, s) not in done for c, s in zip(code.tolist(), starts.tolist(), strict=True)], dtype=bool)
            first = pd.Series(np.arange(len(t)))[candidate].groupby([code[candidate], starts[candidate]]).head(1).to_numpy()
            emitting = np.zeros(len(t), dtype=bool)
            emitting[first] = True
        else:
            last_emit = {c: e for c, e in zip(e_code.tolist(), old_e.tolist(), strict=True)}
            emitting = np.zeros(len(t), dtype=bool)
            for i in np.flatnonzero(fresh & (result >= emit.threshold)).tolist():
                c, now = int(code[i]), int(t[i])
                if c in last_emit and now - last_emit[c] <= size:
                    continue
                last_emit[c] = now
                emitting[i] = True
        # What can still count: a key's records within the window and grace of its newest.
        newest = np.full(len(keys), np.iinfo(np.int64).min)
        np.maximum.at(newest, code, t)
        horizon = newest - grace - size
        keep = t > horizon[code]
        if isinstance(window, Sliding):
            e_pairs = sorted(last_emit.items()) if not isinstance(emit, Every) else list(zip(e_code.tolist(), old_e.tolist(), strict=True))
            new_e_code = np.array([c for c, _ in e_pairs], dtype=np.int64)
            new_e = np.array([e for _, e in e_pairs], dtype=np.int64)
        else:
            new_e_code = np.concatenate([e_code, code[emitting]]) if not isinstance(emit, Every) else e_code
            new_e = np.concatenate([old_e, starts[emitting]]) if not isinstance(emit, Every) else old_e
            e_order = np.argsort(new_e_code, kind="stable")
            new_e_code, new_e = new_e_code[e_order], new_e[e_order]
            alive = new_e > horizon[new_e_code]
            new_e_code, new_e = new_e_code[alive], new_e[alive]
        new_state = pd.DataFrame(
            {
                "t": lists(t[keep], np.bincount(code[keep], minlength=len(keys))),
                "v": lists(v[keep], np.bincount(code[keep], minlength=len(keys))),
                "emitted": lists(new_e, np.bincount(new_e_code, minlength=len(keys))),
            },
            index=pd.Index(keys, dtype=object),
        )
        rows = np.flatnonzero(emitting)
        found = list(
            zip(
                counted.index.to_numpy()[at[rows]].tolist(),
                starts[rows].tolist(),
                ends[rows].tolist(),
                result[rows].astype(float).tolist(),
                strict=True,
            )
        )
        return self._detections(found, records), new_state

    def on_timer(self, fired: pd.DataFrame, config: Any) -> tuple[pd.DataFrame, pd.DataFrame, pd.Series]:
        """Final(): the windows of each fired key that close by its timer, each once."""
        found, new, timers = [], {}, {}
        grace = _ms_or_zero(self.window.grace_seconds)
        deadlines = fired["deadline"].astype("int64").to_numpy() // 1_000_000
        for (key, t, v, e), deadline in zip(_rows(fired), deadlines.tolist(), strict=True):
            t, v, e = list(t), list(v), list(e)
            times, vals = np.asarray(t, dtype=np.int64), np.asarray(v, dtype=np.float64)
            for span in sorted({s for x in t for s in self.window.spans(x)}):
                if span[0] in e or span[1] + grace > deadline:
                    continue
                found.append((key, *span, self.aggregate.of(vals[_members(self.window, times, span)])))
                e.append(span[0])
            new[key] = self._pruned(t, v, e)
            timers[key] = self._next_close(*new[key])
        if found:
            keys, starts, ends, results = zip(*found, strict=True)
            detections = pd.DataFrame(
                {"window_start_ms": list(starts), "window_end_ms": list(ends), self.aggregate.name: list(results)}, index=pd.Index(keys, dtype=object)
            )
        else:
            detections = pd.DataFrame({"window_start_ms": [], "window_end_ms": [], self.aggregate.name: []}, index=pd.Index([], dtype=object))
        at = pd.Series(
            [pd.NaT if ms is None else pd.Timestamp(ms, unit="ms", tz="UTC") for ms in timers.values()],
            index=pd.Index(list(timers), dtype=object),
            dtype="datetime64[ns, UTC]",
        )
        return detections, _frame(new), at

    def _next_close(self, t: list[int], v: list[float], e: list[int]) -> int | None:
        """When the earliest window of the key's records that has not closed closes (Final())."""
        ends = [span[1] for x in t for span in self.window.spans(x) if span[0] not in e]
        return min(ends) + _ms_or_zero(self.window.grace_seconds) if ends else None

    def _record(self, t: list[int], v: list[float], e: list[int], at: int, value: float) -> tuple[int, int, float] | None:
        """One record, in arrival order: appended to its key's records (unless late), its windows'
        aggregates taken over the key's records seen so far; the detection it makes, if any."""
        grace = _ms_or_zero(self.window.grace_seconds)
        if t and at < max(t) - grace:
            return None  # late: its windows are closed
        t.append(at)
        v.append(value)
        if isinstance(self.emit, Final):
            return None  # its windows are emitted when they close (on_timer)
        times, vals = np.asarray(t), np.asarray(v)
        made = None
        for span in self.window.spans(at):
            result = self.aggregate.of(vals[_members(self.window, times, span)])
            if isinstance(self.emit, Every):
                return (*span, result)
            if result < self.emit.threshold:
                continue
            if isinstance(self.window, Sliding):
                if e and at - e[-1] <= _ms(self.window.seconds):
                    return None  # a window emitted lately: none again for a window's length
                e[:] = [at]
                return (*span, result)
            if span[0] not in e:
                e.append(span[0])
                made = made or (*span, result)
        return made

    def _pruned(self, t: list[int], v: list[float], e: list[int]) -> tuple[list[int], list[float], list[int]]:
        """What can still count: records and emitted windows a record not late may still land with."""
        if not t:
            return t, v, e
        horizon = max(t) - _ms_or_zero(self.window.grace_seconds) - _ms(self.window.seconds)
        if isinstance(self.emit, Final):
            # Until its windows have closed; the newest stays, for the lateness of the next record.
            newest = max(t)
            keep = [i for i, x in enumerate(t) if x == newest or any(s not in e for s, _ in self.window.spans(x))]
        else:
            keep = [i for i, x in enumerate(t) if x > horizon]
        # A window that starts at or before the horizon can take no record any more (unless a
        # record kept is in it: the newest, whose closed windows must stay closed).
        held = {s for i in keep for s, _ in self.window.spans(t[i])} if isinstance(self.emit, Final) else set()
        emitted = e if isinstance(self.window, Sliding) else [s for s in e if s > horizon or s in held]
        return [t[i] for i in keep], [v[i] for i in keep], emitted

    def _detections(self, found: list[tuple[Any, int, int, float]], records: pd.DataFrame) -> pd.DataFrame:
        name = self.aggregate.name
        if not found:
            return pd.DataFrame({"window_start_ms": [], "window_end_ms": [], name: []}, index=records.index[:0])
        index, starts, ends, results = zip(*found, strict=True)
        return pd.DataFrame({"window_start_ms": list(starts), "window_end_ms": list(ends), name: list(results)}, index=pd.Index(index))


def _ms_or_zero(seconds: float) -> int:
    return int(round(seconds * 1000)) if seconds > 0 else 0


def _rows(state: pd.DataFrame) -> Iterator[tuple[str, Any, Any, Any]]:
    if state.empty:
        return iter(())
    return zip(state.index, state["t"].tolist(), state["v"].tolist(), state["emitted"].tolist(), strict=True)


def _frame(new: dict[str, tuple[list[int], list[float], list[int]]]) -> pd.DataFrame:
    keys = list(new)
    ts = [new[k][0] for k in keys]
    vs = [new[k][1] for k in keys]
    es = [new[k][2] for k in keys]
    return pd.DataFrame(
        {
            "t": lists(np.array([x for r in ts for x in r], dtype=np.int64), [len(r) for r in ts]),
            "v": lists(np.array([x for r in vs for x in r], dtype=np.float64), [len(r) for r in vs]),
            "emitted": lists(np.array([x for r in es for x in r], dtype=np.int64), [len(r) for r in es]),
        },
        index=pd.Index(keys, dtype=object),
    )


__all__ = [
    "AtLeast",
    "Count",
    "DistinctCount",
    "Every",
    "Final",
    "Hopping",
    "Max",
    "Mean",
    "Min",
    "Sliding",
    "Sum",
    "Tumbling",
    "detector",
]
