"""The rule as array operations over the whole batch, for its commonest shapes: counts, sums, means
and distinct counts of any fields over sliding or tumbling windows emitted for every record (a
model's features), or a count or a sum the first time a window reaches a threshold (`AtLeast`: the
template's burst rule). The same answers and the same state as the engine (`rule.py`; the tests run
both), at a fraction of its cost per record.

A sliding window's distinct count is a count of intervals: a record counts for each later record
of its key until its value comes again or it leaves the window, whichever is first, so each
record's count is how many of those intervals cover it, one cumulative sum over the batch.

Keys whose times go back under a sliding window (a late record within the grace: the windows of
later records change) are left out of both answers and state, for the engine to run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from detectorkit.state.columns import lists
from detectorkit.state.declaration import EVENT_TIME, KEY
from detectorkit.windows.accumulate import COUNT, DISTINCT, MEAN, SUM
from detectorkit.windows.exact import Exact

_EMPTY = np.zeros(0, dtype=np.int64)


def detect(
    size: int,
    grace: int,
    sliding: bool,
    plan: Sequence[tuple[str, int]],
    threshold: float | None,
    counted: pd.DataFrame,
    values: Sequence[np.ndarray],
    state: pd.DataFrame,
    value_columns: Sequence[str],
) -> tuple[dict[str, Any], pd.DataFrame, Any, int] | None:
    """(found, new state of the counted keys, slow keys, late records): found as columns (the
    record's index, key, window start, end and, under "aggregates", each of the `plan`'s aggregates
    (kind, value column) of the window); `values` are the counted records' value columns, held in
    the state as `value_columns`. A `threshold` is on the plan's one aggregate, None: every record.
    The slow keys (None if none) are left out of all four. None: values whose sums would not be
    exact, for the engine."""
    held_keys = state.index.to_numpy()
    # The counted keys first, in the order of their first record: the new state's rows come in the
    # batch's order of keys, which the runner takes as it is (no look-up of each key).
    codes, keys = pd.factorize(np.concatenate([counted[KEY].to_numpy(), held_keys]))
    keys = np.asarray(keys, dtype=object)
    new_code, held_code = codes[: len(counted)], codes[len(counted) :]
    has_state = len(state) > 0
    t_len = state["t"].list.len().to_numpy() if has_state else _EMPTY
    e_len = state["emitted"].list.len().to_numpy() if has_state else _EMPTY
    old_t = state["t"].list.flatten().to_numpy().astype(np.int64) if has_state else _EMPTY
    old_e = state["emitted"].list.flatten().to_numpy().astype(np.int64) if has_state else _EMPTY
    e_code = np.repeat(held_code, e_len)
    # Each key's records in arrival order, its held ones first: a stable sort by key.
    code = np.concatenate([np.repeat(held_code, t_len), new_code])
    t = np.concatenate([old_t, counted[EVENT_TIME].astype("int64").to_numpy() // 1_000_000])
    held_v = [state[name].list.flatten().to_numpy().astype(np.float64) if has_state else np.zeros(0) for name in value_columns]
    v = np.stack([np.concatenate([old, new]) for old, new in zip(held_v, values, strict=True)])
    summed = sorted({c for kind, c in plan if kind in (SUM, MEAN)})
    # Sums of fractions through integers (exact, as the engine's are); whole numbers add exactly as floats.
    exact: dict[int, Exact] = {}
    for c in summed:
        if not _whole(v[c]):
            as_ints = Exact.of(v[c])
            if as_ints is None:
                return None
            exact[c] = as_ints
    at = np.concatenate([np.full(len(old_t), -1), np.arange(len(counted))])  # -1: held
    rows = _Rows(code, t, v, at, exact)
    rows.take(np.argsort(code, kind="stable"))
    # Late: older than the key's newest before it by more than the grace (a late record moves no newest).
    dropped = _EMPTY  # the late records' keys
    same = rows.same_key()
    if (same[1:] & (rows.t[1:] < rows.t[:-1])).any():
        before = pd.Series(rows.t).groupby(rows.code).cummax().groupby(rows.code).shift(1).to_numpy()
        kept = ~((rows.at >= 0) & (rows.t < before - grace))
        dropped = rows.code[~kept]
        rows.take(kept)
    slow = None
    if sliding:
        same = rows.same_key()
        back = same[1:] & (rows.t[1:] < rows.t[:-1])
        if back.any():
            slow_codes = np.unique(rows.code[1:][back])
            dropped = dropped[~np.isin(dropped, slow_codes)]  # the engine counts the slow keys' own
            rows.take(~np.isin(rows.code, slow_codes))
            held_e = ~np.isin(e_code, slow_codes)
            e_code, old_e = e_code[held_e], old_e[held_e]
            slow = keys[slow_codes]
        starts, ends, aggregates = _sliding(size, plan, summed, rows)
    else:
        starts = rows.t // size * size
        ends = starts + size
        aggregates = _tumbling(plan, summed, rows, starts)
    fresh = rows.at >= 0
    if threshold is None:
        emitting, new_e_code, new_e = fresh, e_code, old_e
    elif not sliding:
        emitting, new_e_code, new_e = _first_per_window(fresh & (aggregates[0] >= threshold), rows.code, starts, e_code, old_e)
    else:
        emitting, new_e_code, new_e = _spaced(fresh & (aggregates[0] >= threshold), rows.code, rows.t, size, e_code, old_e)
    new_state = _new_state(size, grace, sliding, rows, keys, new_e_code, new_e, value_columns)
    # The counted keys' state, as the engine writes it (a key held but not counted here is not written).
    written = np.zeros(len(keys), dtype=bool)
    written[new_code] = True
    if slow is not None:
        written[slow_codes] = False
    new_state = new_state[written]
    out = np.flatnonzero(emitting)
    out = out[np.argsort(rows.at[out], kind="stable")]  # in the records' order
    found = {
        "index": counted.index.to_numpy()[rows.at[out]],
        "key": keys[rows.code[out]],
        "start": starts[out],
        "end": ends[out],
        "aggregates": [a[out] for a in aggregates],
    }
    return found, new_state, slow, len(dropped)


class _Rows:
    """The key's held records and the batch's, as columns taken together: each key's code, time,
    value columns (a row each), index in the batch (-1: held) and, for sums of fractions, the value
    column as integers (`exact`, by column)."""

    def __init__(self, code: np.ndarray, t: np.ndarray, v: np.ndarray, at: np.ndarray, exact: dict[int, Exact]):
        self.code, self.t, self.v, self.at, self.exact = code, t, v, at, exact

    def take(self, which: np.ndarray) -> None:
        self.code, self.t, self.v, self.at = self.code[which], self.t[which], self.v[:, which], self.at[which]
        self.exact = {c: e.take(which) for c, e in self.exact.items()}

    def same_key(self) -> np.ndarray:
        """Whether each record's key is the one before's."""
        return np.concatenate([[False], self.code[1:] == self.code[:-1]])


def _sliding(size: int, plan, summed: list[int], rows: _Rows) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Each record's window [t - size, t] of its key's records up to it, and its aggregates."""
    t, code = rows.t, rows.code
    span = (t.max() - t.min() + size + 1) if len(t) else 1
    place = code * span + (t - (t.min() if len(t) else 0))
    lo = np.searchsorted(place, place - size, side="left")  # a key's first record inside [t - size, t]
    n = len(t)
    counts = (np.arange(1, n + 1) - lo).astype(np.float64)
    sums: dict[int, np.ndarray] = {}
    fresh = np.flatnonzero(rows.at >= 0)  # the batch's records: their exact sums alone are read
    for c in summed:
        if c not in rows.exact:
            prefix = np.concatenate([[0.0], np.cumsum(rows.v[c])])
            sums[c] = prefix[1:] - prefix[lo]
        else:
            sums[c] = rows.exact[c].window_sums(lo, fresh)
    distinct = {c: _distinct_sliding(code, rows.v[c], lo) for c in {c for kind, c in plan if kind == DISTINCT}}
    return t - size, t, _read(plan, counts, sums, distinct)


def _distinct_sliding(code: np.ndarray, v: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """Each record's distinct values among its key's records lo to it. Record j counts for the
    records from j on until its value comes again (`again`) or the window's start passes it
    (`gone`: lo never goes back, as times within a key do not)."""
    n = len(v)
    # Each key's records of one value together, in their order: a stable sort of one integer per
    # (key, value), not a sort by three keys. NaN is never "again" (the comparison below), as before.
    values = pd.factorize(v, use_na_sentinel=False)[0]
    order = np.argsort(code * (int(values.max(initial=0)) + 1) + values, kind="stable")
    again = np.full(n, n)
    repeat = (code[order][1:] == code[order][:-1]) & (v[order][1:] == v[order][:-1])
    again[order[:-1][repeat]] = order[1:][repeat]
    gone = np.searchsorted(lo, np.arange(n), side="right")
    ends = np.minimum(again, gone)
    return (np.arange(1, n + 1) - np.cumsum(np.bincount(ends, minlength=n + 1)[:n])).astype(np.float64)


def _tumbling(plan, summed: list[int], rows: _Rows, starts: np.ndarray) -> list[np.ndarray]:
    """Each record's aggregates over its key's window's records come before it and itself."""
    code = rows.code
    counts = pd.Series(np.ones(len(code))).groupby([code, starts]).cumsum().to_numpy()
    sums: dict[int, np.ndarray] = {}
    fresh = np.flatnonzero(rows.at >= 0)  # the batch's records: their exact sums alone are read
    for c in summed:
        if c not in rows.exact:
            sums[c] = pd.Series(rows.v[c]).groupby([code, starts]).cumsum().to_numpy()
        else:
            sums[c] = rows.exact[c].running_sums(code, starts, fresh)
    distinct = {}
    for c in {c for kind, c in plan if kind == DISTINCT}:
        first = ~pd.DataFrame({"k": code, "s": starts, "v": rows.v[c]}).duplicated().to_numpy()
        distinct[c] = pd.Series(first.astype(np.float64)).groupby([code, starts]).cumsum().to_numpy()
    return _read(plan, counts, sums, distinct)


def _read(plan, counts: np.ndarray, sums: dict, distinct: dict) -> list[np.ndarray]:
    read = {COUNT: lambda c: counts, SUM: lambda c: sums[c], MEAN: lambda c: sums[c] / counts, DISTINCT: lambda c: distinct[c]}
    return [read[kind](c) for kind, c in plan]


def _new_state(size, grace, sliding, rows: _Rows, keys, e_code, e, value_columns) -> pd.DataFrame:
    """What can still count, as the engine keeps it: a sliding window's records within the window
    and grace of the key's newest; a tumbling window's while a record not late may land in its
    window."""
    newest = np.full(len(keys), np.iinfo(np.int64).min)
    np.maximum.at(newest, rows.code, rows.t)
    earliest = newest - grace
    if sliding:
        keep = rows.t >= (earliest - size)[rows.code]
        alive = e >= (earliest - size)[e_code]
    else:
        keep = rows.t // size * size + size > earliest[rows.code]
        alive = e + size > earliest[e_code]
    e_code, e = e_code[alive], e[alive]
    held_t, held_v, held_code = rows.t[keep], rows.v[:, keep], rows.code[keep]
    if not sliding:  # held in time order, as the engine holds them (equal times in arrival order)
        order = np.lexsort((held_t, held_code))
        held_t, held_v, held_code = held_t[order], held_v[:, order], held_code[order]
    lengths = np.bincount(held_code, minlength=len(keys))
    columns = {"t": lists(held_t, lengths)}
    columns.update({name: lists(held_v[c], lengths) for c, name in enumerate(value_columns)})
    columns["emitted"] = lists(e, np.bincount(e_code, minlength=len(keys)))
    return pd.DataFrame(columns, index=pd.Index(keys, dtype=object))


def _whole(v: np.ndarray) -> bool:
    """Whether float running sums of these values are exact (whole numbers, summing below 2^53), as
    the engine's sums are (`accumulate`)."""
    return bool(np.all(np.floor(v) == v)) and float(np.abs(v).sum()) < 2.0**53


def _first_per_window(candidate: np.ndarray, code: np.ndarray, starts: np.ndarray, e_code: np.ndarray, old_e: np.ndarray):
    """Tumbling AtLeast: the first record to reach the threshold in each window not emitted before."""
    if len(old_e) and candidate.any():
        done = set(zip(e_code.tolist(), old_e.tolist(), strict=True))
        candidate &= np.array([(c, s) not in done for c, s in zip(code.tolist(), starts.tolist(), strict=True)], dtype=bool)
    first = pd.Series(np.arange(len(code)))[candidate].groupby([code[candidate], starts[candidate]]).head(1).to_numpy()
    emitting = np.zeros(len(code), dtype=bool)
    emitting[first] = True
    return emitting, *_merged(e_code, old_e, code[emitting], starts[emitting])


def _spaced(candidate: np.ndarray, code: np.ndarray, t: np.ndarray, size: int, e_code: np.ndarray, old_e: np.ndarray):
    """Sliding AtLeast: a record reaching the threshold emits unless its window overlaps one its
    key emitted (in time order, the last one's is the nearest): a loop over the candidates only."""
    last_emit: dict[int, int] = {}
    for c, e in zip(e_code.tolist(), old_e.tolist(), strict=True):
        last_emit[c] = max(e, last_emit.get(c, e))
    emitting = np.zeros(len(code), dtype=bool)
    rows = np.flatnonzero(candidate)
    for i, c, now in zip(rows.tolist(), code[rows].tolist(), t[rows].tolist(), strict=True):
        before = last_emit.get(c)
        if before is not None and now - before <= size:
            continue
        last_emit[c] = now
        emitting[i] = True
    return emitting, *_merged(e_code, old_e, code[emitting], t[emitting])


def _merged(e_code: np.ndarray, old_e: np.ndarray, new_code: np.ndarray, new_e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What each key emitted before and now, its own together and in time order."""
    code, e = np.concatenate([e_code, new_code]), np.concatenate([old_e, new_e])
    order = np.lexsort((e, code))
    return code[order], e[order]
