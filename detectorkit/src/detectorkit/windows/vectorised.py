"""The window rule as array operations over the whole batch, for a count or a sum over sliding or
tumbling windows emitted Every() or AtLeast(): the same answers and the same state as the rule
record by record (`rule.py`; the property tests run both), at a fraction of its cost."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from detectorkit.state.columns import lists
from detectorkit.windows.aggregates import Aggregate, Count, Emit, Every, Final, Sum, values_of
from detectorkit.windows.kinds import Sliding, Tumbling, Window, ms, ms_or_zero

_EMPTY = np.zeros(0, dtype=np.int64)


def applies(window: Window, aggregate: Aggregate, emit: Emit) -> bool:
    return type(aggregate) in (Count, Sum) and isinstance(window, Sliding | Tumbling) and not isinstance(emit, Final)


def detect(window: Window, aggregate: Aggregate, emit: Emit, counted: pd.DataFrame, state: pd.DataFrame) -> tuple[list, pd.DataFrame, Any]:
    """(found, new state, slow keys): found as (record index, window start, end, aggregate). The
    slow keys (None if none) are left out of both: over a sliding window, keys whose times go back,
    for which the records a window holds depend on their order; the caller runs them one by one."""
    size, grace = ms(window.seconds), ms_or_zero(window.grace_seconds)
    held_keys = state.index.to_numpy()
    codes, keys = pd.factorize(np.concatenate([held_keys, counted["key"].to_numpy()]))
    held_code, new_code = codes[: len(held_keys)], codes[len(held_keys) :]
    has_state = len(state) > 0
    t_len = state["t"].list.len().to_numpy() if has_state else _EMPTY
    e_len = state["emitted"].list.len().to_numpy() if has_state else _EMPTY
    old_t = state["t"].list.flatten().to_numpy().astype(np.int64) if has_state else _EMPTY
    old_v = state["v"].list.flatten().to_numpy().astype(np.float64) if has_state else np.zeros(0)
    old_e = state["emitted"].list.flatten().to_numpy().astype(np.int64) if has_state else _EMPTY
    e_code = np.repeat(held_code, e_len)
    # Each key's records in arrival order, its held ones first: a stable sort by key.
    code = np.concatenate([np.repeat(held_code, t_len), new_code])
    t = np.concatenate([old_t, counted["event_time"].astype("int64").to_numpy() // 1_000_000])
    v = np.concatenate([old_v, values_of(aggregate, counted)])
    at = np.concatenate([np.full(len(old_t), -1), np.arange(len(counted))])  # -1: held
    order = np.argsort(code, kind="stable")
    code, t, v, at = code[order], t[order], v[order], at[order]
    # Late: older than the key's newest before it by more than the grace (a late record moves no newest).
    same = np.concatenate([[False], code[1:] == code[:-1]])
    if (same[1:] & (t[1:] < t[:-1])).any():
        before = pd.Series(t).groupby(code).cummax().groupby(code).shift(1).to_numpy()
        kept = ~((at >= 0) & (t < before - grace))
        code, t, v, at = code[kept], t[kept], v[kept], at[kept]
        same = np.concatenate([[False], code[1:] == code[:-1]])
    slow = None
    if isinstance(window, Sliding):
        back = same[1:] & (t[1:] < t[:-1])
        if back.any():
            slow_codes = np.unique(code[1:][back])
            fast = ~np.isin(code, slow_codes)
            code, t, v, at = code[fast], t[fast], v[fast], at[fast]
            held_e = ~np.isin(e_code, slow_codes)
            e_code, old_e = e_code[held_e], old_e[held_e]
            slow = keys[slow_codes]
        span = (t.max() - t.min() + size + 1) if len(t) else 1
        place = code * span + (t - (t.min() if len(t) else 0))
        lo = np.searchsorted(place, place - size, side="left")  # a key's first record inside [t - size, t]
        sums = np.concatenate([[0.0], np.cumsum(v if isinstance(aggregate, Sum) else np.ones(len(v)))])
        result = sums[1:] - sums[lo]
        starts, ends = t - size, t
    else:
        starts = t // size * size
        ends = starts + size
        per_window = pd.Series(v if isinstance(aggregate, Sum) else np.ones(len(v))).groupby([code, starts])
        result = per_window.cumsum().to_numpy()
    fresh = at >= 0
    if isinstance(emit, Every):
        emitting, new_e_code, new_e = fresh, e_code, old_e
    elif isinstance(window, Tumbling):
        emitting, new_e_code, new_e = _first_per_window(fresh & (result >= emit.threshold), code, starts, e_code, old_e)
    else:
        emitting, new_e_code, new_e = _spaced(fresh & (result >= emit.threshold), code, t, size, e_code, old_e)
    # What can still count: a key's records within the window and grace of its newest.
    newest = np.full(len(keys), np.iinfo(np.int64).min)
    np.maximum.at(newest, code, t)
    horizon = newest - grace - size
    keep = t >= horizon[code] if isinstance(window, Sliding) else t > horizon[code]
    if isinstance(window, Tumbling) and not isinstance(emit, Every):
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
    if slow is not None:
        new_state = new_state[~new_state.index.isin(slow)]
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
    return found, new_state, slow


def _first_per_window(candidate: np.ndarray, code: np.ndarray, starts: np.ndarray, e_code: np.ndarray, old_e: np.ndarray):
    """Tumbling AtLeast: the first record to reach the threshold in each window not emitted before."""
    if len(old_e) and candidate.any():
        done = set(zip(e_code.tolist(), old_e.tolist(), strict=True))
        candidate &= np.array([(c, s) not in done for c, s in zip(code.tolist(), starts.tolist(), strict=True)], dtype=bool)
    first = pd.Series(np.arange(len(code)))[candidate].groupby([code[candidate], starts[candidate]]).head(1).to_numpy()
    emitting = np.zeros(len(code), dtype=bool)
    emitting[first] = True
    new_e_code = np.concatenate([e_code, code[emitting]])
    new_e = np.concatenate([old_e, starts[emitting]])
    order = np.argsort(new_e_code, kind="stable")
    return emitting, new_e_code[order], new_e[order]


def _spaced(candidate: np.ndarray, code: np.ndarray, t: np.ndarray, size: int, e_code: np.ndarray, old_e: np.ndarray):
    """Sliding AtLeast: a record reaching the threshold emits unless its key emitted within a
    window's length before it (a sequential rule: a loop over the candidates only)."""
    last_emit = dict(zip(e_code.tolist(), old_e.tolist(), strict=True))
    emitting = np.zeros(len(code), dtype=bool)
    rows = np.flatnonzero(candidate)
    for i, c, now in zip(rows.tolist(), code[rows].tolist(), t[rows].tolist(), strict=True):
        before = last_emit.get(c)
        if before is not None and now - before <= size:
            continue
        last_emit[c] = now
        emitting[i] = True
    pairs = sorted(last_emit.items())
    return emitting, np.array([c for c, _ in pairs], dtype=np.int64), np.array([e for _, e in pairs], dtype=np.int64)
