"""A sliding window emitted at every record (a model's window features: counts, sums, means and
distinct counts over `Sliding`, `Every`) as compiled code over a batch and its keys' held records,
with the engine's answers and state (`rule.py`; the tests run both).

Each key's records go through one loop: its state expires if the partition's event time passed
its newest record by more than the TTL, a record older than the key's newest by more than the grace
is late, and any other joins the key's records in time order. A record in order moves the window
on: the records it leaves are taken out of the running aggregates and it is added; the sums are
exact (Shewchuk's partials, which hold the exact sum of what was added and taken out, rounded as
`math.fsum` rounds), the distinct count a table of each value's count. A record back in time (within
the grace) is put among the others and its window is taken over its records; the running
aggregates are made again at the next record in order. A key's records a window can still take
are kept (within the window and grace of its newest).

Compiled by numba on first use in a process, or loaded from its cache (beside this file, or the
user's cache directory where that is not writable): the engine's work per record is Python's or
NumPy passes over the batch, this is a few machine instructions per value.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from detectorkit.state.in_store import KeyColumns
from detectorkit.state.slots import NEVER
from detectorkit.windows.accumulate import COUNT, DISTINCT, MEAN, SUM

KINDS = {COUNT: 0, SUM: 1, MEAN: 2, DISTINCT: 3}
# An exact sum's partials never overlap, and a float spans about 2,100 bits: finite values never
# need more than about 40. A batch that would goes to the engine.
PARTIALS = 128
OK, TOO_MANY_PARTIALS = 0, 1


@njit(cache=True)
def _add(partials, n, x):
    """Adds x to the exact sum held in partials[:n] (non-overlapping, smallest first); the new n,
    or -1 when they would not fit."""
    i = 0
    for j in range(n):
        y = partials[j]
        if abs(x) < abs(y):
            x, y = y, x
        high = x + y
        low = y - (high - x)
        if low != 0.0:
            partials[i] = low
            i += 1
        x = high
    if x != 0.0:
        if i >= len(partials):
            return -1
        partials[i] = x
        i += 1
    return i


@njit(cache=True)
def _rounded(partials, n):
    """The exact sum held in partials[:n], rounded to the nearest float, as math.fsum rounds it."""
    if n == 0:
        return 0.0
    n -= 1
    total = partials[n]
    low = 0.0
    while n > 0:
        x = total
        n -= 1
        y = partials[n]
        total = x + y
        low = y - (total - x)
        if low != 0.0:
            break
    # Half-way cases round to even as the exact sum would: CPython's correction.
    if n > 0 and ((low < 0.0 and partials[n - 1] < 0.0) or (low > 0.0 and partials[n - 1] > 0.0)):
        y = low * 2.0
        x = total + y
        if y == x - total:
            total = x
    return total


@njit(cache=True)
def _counted(keys, counts, x):
    """x into a table of values and their counts (NaN: an empty place); 1 if it was not there."""
    mask = len(keys) - 1
    h = np.int64(x) & mask
    while True:
        y = keys[h]
        if y != y:
            keys[h] = x
            counts[h] = 1
            return 1
        if y == x:
            counts[h] += 1
            return 1 if counts[h] == 1 else 0
        h = (h + 1) & mask


@njit(cache=True)
def _uncounted(keys, counts, x):
    """x out of the table (it is there); 1 if none is left."""
    mask = len(keys) - 1
    h = np.int64(x) & mask
    while keys[h] != x:
        h = (h + 1) & mask
    counts[h] -= 1
    return 1 if counts[h] == 0 else 0


@njit(cache=True)
def _power_of_two(n):
    size = 16
    while size < n:
        size *= 2
    return size


@njit(cache=True)
def _made(bv, lo, hi, summed, distinct, partials, used, tkeys, tcounts, tsize, nd):
    """The running aggregates of records lo to hi, made afresh; False if a sum needs too many partials."""
    for c in range(len(summed)):
        if summed[c]:
            used[c] = 0
            for j in range(lo, hi):
                used[c] = _add(partials[c], used[c], bv[c, j])
                if used[c] < 0:
                    return False
        if distinct[c]:
            tkeys[c, :tsize] = np.nan
            nd[c] = 0
            for j in range(lo, hi):
                nd[c] += _counted(tkeys[c, :tsize], tcounts[c, :tsize], bv[c, j])
    return True


@njit(cache=True)
def sliding_every(size, grace, ttl, kinds, of, summed, distinct, order, starts, t, values, marks, held_len, held_t, held_v, seen, out, fresh):
    """Each key's records (`order[starts[k]:starts[k + 1]]`: positions, in offset order) over its
    held ones (`held_len[k]` of `held_t`, `held_v`: its records' times and value columns, end to
    end; `seen[k]`: its newest record's time, NEVER if none). `kinds`, `of`: each aggregate's kind
    and value column; `summed`, `distinct`: which columns those read. `ttl` < 0: none.

    Fills `out` (each aggregate's value at each record) and `fresh` (the records not late); returns
    (status, each key's kept length, their times, values, each key's newest time, late records)."""
    n_keys = len(starts) - 1
    width = values.shape[0]
    held_at = np.zeros(n_keys + 1, np.int64)
    biggest = 0
    for k in range(n_keys):
        held_at[k + 1] = held_at[k] + held_len[k]
        biggest = max(biggest, held_len[k] + starts[k + 1] - starts[k])
    bt = np.empty(biggest, np.int64)
    bv = np.empty((width, biggest))
    room = len(held_t) + len(t)
    new_len = np.zeros(n_keys, np.int64)
    new_t = np.empty(room, np.int64)
    new_v = np.empty((width, room))
    new_seen = np.empty(n_keys, np.int64)
    partials = np.empty((width, PARTIALS))
    used = np.zeros(width, np.int64)
    table = _power_of_two(2 * biggest)
    tkeys = np.empty((width, table))
    tcounts = np.empty((width, table), np.int64)
    nd = np.zeros(width, np.int64)
    late = 0
    top = 0
    for k in range(n_keys):
        n = held_len[k]
        h0 = held_at[k]
        for j in range(n):
            bt[j] = held_t[h0 + j]
            for c in range(width):
                bv[c, j] = held_v[c, h0 + j]
        tsize = _power_of_two(2 * (n + starts[k + 1] - starts[k]))
        s = seen[k]
        valid = False
        lo = 0
        for r in range(starts[k], starts[k + 1]):
            i = order[r]
            at = t[i]
            if ttl >= 0 and s != NEVER and s < marks[i] - ttl:
                n = 0  # expired before this record: it starts afresh
                valid = False
            if at > s:
                s = at
            if n > 0 and at < bt[n - 1] - grace:
                late += 1
                fresh[i] = False
                continue
            fresh[i] = True
            if n == 0 or at >= bt[n - 1]:
                bt[n] = at
                for c in range(width):
                    bv[c, n] = values[c, i]
                n += 1
                if valid:
                    for c in range(width):
                        if summed[c]:
                            used[c] = _add(partials[c], used[c], values[c, i])
                            if used[c] < 0:
                                return TOO_MANY_PARTIALS, new_len, new_t, new_v, new_seen, late
                        if distinct[c]:
                            nd[c] += _counted(tkeys[c, :tsize], tcounts[c, :tsize], values[c, i])
                    while bt[lo] < at - size:
                        for c in range(width):
                            if summed[c]:
                                used[c] = _add(partials[c], used[c], -bv[c, lo])
                                if used[c] < 0:
                                    return TOO_MANY_PARTIALS, new_len, new_t, new_v, new_seen, late
                            if distinct[c]:
                                nd[c] -= _uncounted(tkeys[c, :tsize], tcounts[c, :tsize], bv[c, lo])
                        lo += 1
                else:
                    lo = np.searchsorted(bt[:n], at - size, side="left")
                    if not _made(bv, lo, n, summed, distinct, partials, used, tkeys, tcounts, tsize, nd):
                        return TOO_MANY_PARTIALS, new_len, new_t, new_v, new_seen, late
                    valid = True
                w_lo, w_hi = lo, n
            else:
                # Back in time: among the others, and its window over its records.
                place = np.searchsorted(bt[:n], at, side="right")
                for j in range(n, place, -1):
                    bt[j] = bt[j - 1]
                    for c in range(width):
                        bv[c, j] = bv[c, j - 1]
                bt[place] = at
                for c in range(width):
                    bv[c, place] = values[c, i]
                n += 1
                w_lo, w_hi = np.searchsorted(bt[:n], at - size, side="left"), np.searchsorted(bt[:n], at, side="right")
                if not _made(bv, w_lo, w_hi, summed, distinct, partials, used, tkeys, tcounts, tsize, nd):
                    return TOO_MANY_PARTIALS, new_len, new_t, new_v, new_seen, late
                valid = False  # the running aggregates are this window's, not the newest record's
            count = w_hi - w_lo
            for a in range(len(kinds)):
                kind, c = kinds[a], of[a]
                if kind == 0:
                    out[a, i] = count
                elif kind == 3:
                    out[a, i] = nd[c]
                else:
                    total = _rounded(partials[c], used[c])
                    out[a, i] = total if kind == 1 else total / count
        # What a window can still take: within the window and grace of the key's newest.
        keep = np.searchsorted(bt[:n], bt[n - 1] - grace - size, side="left") if n > 0 else 0
        for j in range(keep, n):
            new_t[top] = bt[j]
            for c in range(width):
                new_v[c, top] = bv[c, j]
            top += 1
        new_len[k] = n - keep
        new_seen[k] = s
    return OK, new_len, new_t[:top], new_v[:, :top], new_seen, late


def sliding_every_of(size: int, grace: int, plan, value_columns, t: np.ndarray, values: np.ndarray, held: KeyColumns):
    """`sliding_every` over a batch (`t`, its records' times in ms; `values`, their value columns)
    and its keys' state (`held`): (the records not late, each aggregate of the `plan` at them, the
    keys' new columns, their newest times, how many records were late); None where it cannot run
    (values near a float's limits, whose partials could overflow: far below them, 2^960, no window
    holds the 2^63 values a sum would need to)."""
    summed = np.zeros(len(values), dtype=bool)
    distinct = np.zeros(len(values), dtype=bool)
    for kind, c in plan:
        summed[c] |= kind in (SUM, MEAN)
        distinct[c] |= kind == DISTINCT
    held_t, lengths = held.columns["t"]
    held_v = np.stack([held.columns[name][0] for name in value_columns])
    if not (np.abs(values[summed]) < 2.0**960).all() or not (np.abs(held_v[summed]) < 2.0**960).all():
        return None
    n_keys = len(held.keys)
    starts = np.zeros(n_keys + 1, dtype=np.int64)
    np.cumsum(np.bincount(held.codes, minlength=n_keys), out=starts[1:])
    out = np.empty((len(plan), len(t)))
    fresh = np.empty(len(t), dtype=bool)
    status, new_len, new_t, new_v, seen, late = sliding_every(
        size,
        grace,
        -1 if held.ttl_ms is None else held.ttl_ms,
        np.array([KINDS[kind] for kind, _ in plan], dtype=np.int64),
        np.array([max(c, 0) for _, c in plan], dtype=np.int64),
        summed,
        distinct,
        np.argsort(held.codes, kind="stable"),
        starts,
        t,
        values,
        held.marks,
        lengths,
        held_t.astype(np.int64, copy=False),
        held_v,
        held.seen,
        out,
        fresh,
    )
    if status != OK:
        return None
    at = np.flatnonzero(fresh)
    columns = {"t": (new_t, new_len), **{name: (new_v[c], new_len) for c, name in enumerate(value_columns)}}
    columns["emitted"] = (np.zeros(0, dtype=np.int64), np.zeros(n_keys, dtype=np.int64))  # every record emits: nothing to remember
    return at, out[:, at], columns, seen, int(late)
