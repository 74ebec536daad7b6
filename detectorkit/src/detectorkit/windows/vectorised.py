"""The rule as array operations over the whole batch, for its commonest shape: a count or a sum over
sliding or tumbling windows, emitted for every record or the first time a window reaches a
threshold (`Every()`, `AtLeast`). The same answers and the same state as the engine (`rule.py`;
the tests run both), at a fraction of its cost per record: the template's burst rule.

Keys whose times go back under a sliding window (a late record within the grace: the windows of
later records change) are left out of both answers and state, for the engine to run."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from detectorkit.state.columns import lists
from detectorkit.state.declaration import EVENT_TIME, KEY

_EMPTY = np.zeros(0, dtype=np.int64)


def detect(
    size: int, grace: int, sliding: bool, field: str | None, threshold: float | None, counted: pd.DataFrame, state: pd.DataFrame
) -> tuple[dict[str, np.ndarray], pd.DataFrame, Any, int] | None:
    """(found, new state of the counted keys, slow keys, late records): found as columns (the
    record's index, key, window start, end, the window's count of records and, with a `field`, its
    sum of it); a `threshold` is on the sum (no field: the count), None: every record. The slow keys
    (None if none) are left out of all four. None: values whose sums would not be exact, for the
    engine."""
    held_keys = state.index.to_numpy()
    codes, keys = pd.factorize(np.concatenate([held_keys, counted[KEY].to_numpy()]))
    keys = np.asarray(keys, dtype=object)
    held_code, new_code = codes[: len(held_keys)], codes[len(held_keys) :]
    has_state = len(state) > 0
    t_len = state["t"].list.len().to_numpy() if has_state else _EMPTY
    e_len = state["emitted"].list.len().to_numpy() if has_state else _EMPTY
    old_t = state["t"].list.flatten().to_numpy().astype(np.int64) if has_state else _EMPTY
    old_v = state["v"].list.flatten().to_numpy().astype(np.float64) if has_state else np.zeros(0)
    old_e = state["emitted"].list.flatten().to_numpy().astype(np.int64) if has_state else _EMPTY
    e_code = np.repeat(held_code, e_len)
    new_values = np.zeros(len(counted)) if field is None else pd.to_numeric(counted[field], errors="raise").to_numpy(dtype=np.float64)
    # Each key's records in arrival order, its held ones first: a stable sort by key.
    code = np.concatenate([np.repeat(held_code, t_len), new_code])
    t = np.concatenate([old_t, counted[EVENT_TIME].astype("int64").to_numpy() // 1_000_000])
    v = np.concatenate([old_v, new_values])
    # Sums of fractions through integers (exact, as the engine's are); whole numbers add exactly as floats.
    exact = None
    if field is not None and not _whole(v):
        exact = _Exact.of(v)
        if exact is None:
            return None
    at = np.concatenate([np.full(len(old_t), -1), np.arange(len(counted))])  # -1: held
    order = np.argsort(code, kind="stable")
    code, t, v, at = code[order], t[order], v[order], at[order]
    ints = None if exact is None else exact.ints[order]
    # Late: older than the key's newest before it by more than the grace (a late record moves no newest).
    same = np.concatenate([[False], code[1:] == code[:-1]])
    dropped = _EMPTY  # the late records' keys
    if (same[1:] & (t[1:] < t[:-1])).any():
        before = pd.Series(t).groupby(code).cummax().groupby(code).shift(1).to_numpy()
        kept = ~((at >= 0) & (t < before - grace))
        dropped = code[~kept]
        code, t, v, at = code[kept], t[kept], v[kept], at[kept]
        ints = None if ints is None else ints[kept]
        same = np.concatenate([[False], code[1:] == code[:-1]])
    slow = None
    if sliding:
        back = same[1:] & (t[1:] < t[:-1])
        if back.any():
            slow_codes = np.unique(code[1:][back])
            fast = ~np.isin(code, slow_codes)
            dropped = dropped[~np.isin(dropped, slow_codes)]  # the engine counts the slow keys' own
            code, t, v, at = code[fast], t[fast], v[fast], at[fast]
            ints = None if ints is None else ints[fast]
            held_e = ~np.isin(e_code, slow_codes)
            e_code, old_e = e_code[held_e], old_e[held_e]
            slow = keys[slow_codes]
        span = (t.max() - t.min() + size + 1) if len(t) else 1
        place = code * span + (t - (t.min() if len(t) else 0))
        lo = np.searchsorted(place, place - size, side="left")  # a key's first record inside [t - size, t]
        counts = (np.arange(1, len(t) + 1) - lo).astype(np.float64)
        if field is None:
            sums = None
        elif ints is None:
            prefix = np.concatenate([[0.0], np.cumsum(v)])
            sums = prefix[1:] - prefix[lo]
        else:
            prefix = np.concatenate([np.array([0], dtype=object), np.cumsum(ints)])
            sums = exact.floats(prefix[1:] - prefix[lo])
        starts, ends = t - size, t
    else:
        starts = t // size * size
        ends = starts + size
        counts = pd.Series(np.ones(len(t))).groupby([code, starts]).cumsum().to_numpy()
        if field is None:
            sums = None
        elif ints is None:
            sums = pd.Series(v).groupby([code, starts]).cumsum().to_numpy()
        else:
            sums = exact.floats(_cumsum_per_window(ints, code, starts))
    result = counts if sums is None else sums  # what a threshold is on: the one aggregate
    fresh = at >= 0
    if threshold is None:
        emitting, new_e_code, new_e = fresh, e_code, old_e
    elif not sliding:
        emitting, new_e_code, new_e = _first_per_window(fresh & (result >= threshold), code, starts, e_code, old_e)
    else:
        emitting, new_e_code, new_e = _spaced(fresh & (result >= threshold), code, t, size, e_code, old_e)
    # What can still count, as the engine keeps it: a sliding window's records within the window and
    # grace of the key's newest; a tumbling window's while a record not late may land in its window.
    newest = np.full(len(keys), np.iinfo(np.int64).min)
    np.maximum.at(newest, code, t)
    earliest = newest - grace
    if sliding:
        keep = t >= (earliest - size)[code]
        alive = new_e >= (earliest - size)[new_e_code]
    else:
        keep = ends > earliest[code]
        alive = new_e + size > earliest[new_e_code]
    new_e_code, new_e = new_e_code[alive], new_e[alive]
    held_t, held_v, held_code = t[keep], v[keep], code[keep]
    if not sliding:  # held in time order, as the engine holds them (equal times in arrival order)
        order = np.lexsort((held_t, held_code))
        held_t, held_v, held_code = held_t[order], held_v[order], held_code[order]
    new_state = pd.DataFrame(
        {
            "t": lists(held_t, np.bincount(held_code, minlength=len(keys))),
            "v": lists(held_v, np.bincount(held_code, minlength=len(keys))),
            "emitted": lists(new_e, np.bincount(new_e_code, minlength=len(keys))),
        },
        index=pd.Index(keys, dtype=object),
    )
    # The counted keys' state, as the engine writes it (a key held but not counted here is not written).
    written = np.zeros(len(keys), dtype=bool)
    written[new_code] = True
    if slow is not None:
        written[slow_codes] = False
    new_state = new_state[written]
    rows = np.flatnonzero(emitting)
    order = np.argsort(at[rows], kind="stable")  # in the records' order
    rows = rows[order]
    found = {
        "index": counted.index.to_numpy()[at[rows]],
        "key": keys[code[rows]],
        "start": starts[rows],
        "end": ends[rows],
        "count": counts[rows],
        "sum": None if sums is None else sums[rows].astype(np.float64),
    }
    return found, new_state, slow, len(dropped)


def _whole(v: np.ndarray) -> bool:
    """Whether float running sums of these values are exact (whole numbers, summing below 2^53), as
    the engine's sums are (`accumulate`)."""
    return bool(np.all(np.floor(v) == v)) and float(np.abs(v).sum()) < 2.0**53


class _Exact:
    """Values as integers, each exactly the value times 2^-base: their sums are exact, and a sum
    converted back is the correctly rounded sum of the values, which is what the engine's sums
    (math.fsum, Shewchuk's partials) give."""

    def __init__(self, ints: np.ndarray, base: int):
        self.ints, self.base = ints, base

    @classmethod
    def of(cls, v: np.ndarray) -> _Exact | None:
        """None where the integers would not stay small or a sum could round twice (values not
        finite, or far apart in magnitude, or near the edges of a float's range): the engine's."""
        if not np.isfinite(v).all():
            return None
        fractions, exponents = np.frexp(v)
        mantissas = (fractions * 2.0**53).astype(np.int64)  # exact: a double has 53 bits
        exponents = exponents.astype(np.int64) - 53
        nonzero = mantissas != 0
        if not nonzero.any():
            return cls(np.zeros(len(v), dtype=object), 0)
        base = int(exponents[nonzero].min())
        shifts = np.where(nonzero, exponents - base, 0)
        if base < -1000 or int(shifts.max()) > 900:
            return None
        ints = np.empty(len(v), dtype=object)
        ints[:] = [m << s for m, s in zip(mantissas.tolist(), shifts.tolist(), strict=True)]
        return cls(ints, base)

    def floats(self, sums: np.ndarray) -> np.ndarray:
        # int -> float rounds correctly (to nearest, ties to even); times a power of two is exact.
        return np.ldexp(np.asarray(sums, dtype=object).astype(np.float64), self.base)


def _cumsum_per_window(ints: np.ndarray, code: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Each record's running sum within its key's window, in arrival order (a tumbling window's
    records need not be together: a late one lands in an earlier window)."""
    order = np.lexsort((starts, code))  # stable: arrival order within a window
    c, s = code[order], starts[order]
    first = np.concatenate([[True], (c[1:] != c[:-1]) | (s[1:] != s[:-1])])
    begins = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
    prefix = np.concatenate([np.array([0], dtype=object), np.cumsum(ints[order])])
    out = np.empty(len(order), dtype=object)
    out[order] = prefix[1:] - prefix[begins]
    return out


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
