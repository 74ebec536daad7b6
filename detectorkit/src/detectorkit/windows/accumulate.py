"""A window's aggregates as its records come: count, an exact sum, min, max and the distinct values,
added one record at a time, merged (sessions that join) and read at any time.

The sum is exact (Shewchuk's partials, the algorithm behind `math.fsum`): a window's sum, and its
mean, are the correctly rounded sum of its values whatever the order they came in and wherever a
batch or a restart fell, so a threshold on a sum answers the same in a backtest, live and after a
redeploy.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from typing import NamedTuple

# What an aggregate of the rule reads: its kind, and the value column it reads (-1: none).
COUNT, SUM, MIN, MAX, MEAN, DISTINCT, LAST = "count", "sum", "min", "max", "mean", "distinct", "last"


def add_exact(partials: list[float], x: float) -> None:
    """Adds `x` to the exact sum held as `partials` (non-overlapping floats, smallest first)."""
    i = 0
    for y in partials:
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo:
            partials[i] = lo
            i += 1
        x = hi
    partials[i:] = [x]


class Accumulator:
    """The running aggregates of one window over the value columns it needs: `needs`, per column,
    which of sum, min, max, distinct and last it keeps (a count is always kept)."""

    __slots__ = ("count", "sums", "mins", "maxs", "seen", "newest", "lasts", "needs")

    def __init__(self, needs: Sequence[Needs]):
        self.needs = needs
        self.count = 0
        self.newest = -math.inf
        if not needs:  # a count alone: nothing per column
            self.sums = self.mins = self.maxs = self.seen = self.lasts = ()
            return
        self.sums: list[list[float]] = [[] for _ in needs]
        self.mins = [math.inf] * len(needs)
        self.maxs = [-math.inf] * len(needs)
        self.seen: list[set | None] = [set() if n.distinct else None for n in needs]
        self.lasts = [math.nan] * len(needs)

    def add(self, values: Sequence[float], at: int) -> None:
        """One record's values, at its time (the newest's are the last values; of records at one
        time, the one that came last)."""
        self.count += 1
        if not values:
            return
        if at >= self.newest:
            self.newest = at
            self.lasts = values
        for c, need in enumerate(self.needs):
            x = values[c]
            if need.sum:
                add_exact(self.sums[c], x)
            if need.min and x < self.mins[c]:
                self.mins[c] = x
            if need.max and x > self.maxs[c]:
                self.maxs[c] = x
            if need.distinct:
                self.seen[c].add(x)

    def merge(self, other: Accumulator) -> None:
        """`other`'s records too (a session that joined this one, later in time)."""
        self.count += other.count
        if other.newest >= self.newest:
            self.newest, self.lasts = other.newest, other.lasts
        for c, need in enumerate(self.needs):
            if need.sum:
                for x in other.sums[c]:
                    add_exact(self.sums[c], x)
            self.mins[c] = min(self.mins[c], other.mins[c])
            self.maxs[c] = max(self.maxs[c], other.maxs[c])
            if need.distinct:
                self.seen[c] |= other.seen[c]

    def read(self, plan: Sequence[tuple[str, int]]) -> tuple[float, ...]:
        out = []
        for kind, c in plan:
            if kind == COUNT:
                out.append(self.count)
            elif kind == SUM:
                out.append(math.fsum(self.sums[c]))
            elif kind == MEAN:
                out.append(math.fsum(self.sums[c]) / self.count)
            elif kind == MIN:
                out.append(self.mins[c])
            elif kind == MAX:
                out.append(self.maxs[c])
            elif kind == LAST:
                out.append(self.lasts[c])
            else:
                out.append(len(self.seen[c]))
        return tuple(out)


class Needs(NamedTuple):
    """What an accumulator keeps of one value column."""

    sum: bool
    min: bool
    max: bool
    distinct: bool


def needs_of(plan: Sequence[tuple[str, int]], columns: int) -> tuple[Needs, ...]:
    kinds = [{kind for kind, c in plan if c == column} for column in range(columns)]
    return tuple(Needs(bool(k & {SUM, MEAN}), MIN in k, MAX in k, DISTINCT in k) for k in kinds)


def over(plan: Sequence[tuple[str, int]], columns: Sequence[list[float]], lo: int, hi: int) -> tuple[float, ...]:
    """The aggregates of the records lo to hi of a key's (time-ordered) value columns: the last is
    the newest's (of records at one time, the one that came last: it was put after them)."""
    out = []
    for kind, c in plan:
        if kind == COUNT:
            out.append(hi - lo)
            continue
        values = columns[c][lo:hi]
        if kind == SUM:
            out.append(math.fsum(values))
        elif kind == MEAN:
            out.append(math.fsum(values) / len(values))
        elif kind == MIN:
            out.append(min(values))
        elif kind == MAX:
            out.append(max(values))
        elif kind == LAST:
            out.append(values[-1])
        else:
            out.append(len(set(values)))
    return tuple(out)


class Run:
    """The aggregates of a key's records lo to hi (indices into its time-ordered columns) kept as
    the range moves forward: records added at hi, taken away at lo, each once; a sliding window's
    over a key's records in time order, at the cost of the records it moves past, not of its size.
    A sum takes a value away exactly (its negation, in the partials); min and max keep the records
    that can still be one (a monotonic queue of indices); a distinct count counts each value."""

    __slots__ = ("lo", "hi", "plan", "needs", "sums", "mins", "maxs", "seen")

    def __init__(self, plan: Sequence[tuple[str, int]], needs: Sequence[Needs], at: int):
        self.plan, self.needs = plan, needs
        self.lo = self.hi = at  # empty, from record `at` on
        self.sums: list[list[float]] = [[] for _ in needs]
        self.mins: list[collections.deque] = [collections.deque() for _ in needs]
        self.maxs: list[collections.deque] = [collections.deque() for _ in needs]
        self.seen: list[collections.Counter | None] = [collections.Counter() if n.distinct else None for n in needs]

    def moved(self, columns: Sequence[list[float]], lo: int, hi: int) -> tuple[float, ...]:
        """The aggregates of records lo to hi, both at or past where the run stood."""
        for c, need in enumerate(self.needs):
            values = columns[c]
            for i in range(self.hi, hi):
                x = values[i]
                if need.sum:
                    add_exact(self.sums[c], x)
                if need.min:
                    queue = self.mins[c]
                    while queue and values[queue[-1]] >= x:
                        queue.pop()
                    queue.append(i)
                if need.max:
                    queue = self.maxs[c]
                    while queue and values[queue[-1]] <= x:
                        queue.pop()
                    queue.append(i)
                if need.distinct:
                    self.seen[c][x] += 1
            for i in range(self.lo, lo):
                x = values[i]
                if need.sum:
                    add_exact(self.sums[c], -x)
                if need.distinct:
                    seen = self.seen[c]
                    seen[x] -= 1
                    if not seen[x]:
                        del seen[x]
            for queue in (self.mins[c], self.maxs[c]):
                while queue and queue[0] < lo:
                    queue.popleft()
        self.lo, self.hi = lo, hi
        out = []
        for kind, c in self.plan:
            if kind == COUNT:
                out.append(hi - lo)
            elif kind == SUM:
                out.append(math.fsum(self.sums[c]))
            elif kind == MEAN:
                out.append(math.fsum(self.sums[c]) / (hi - lo))
            elif kind == MIN:
                out.append(columns[c][self.mins[c][0]])
            elif kind == MAX:
                out.append(columns[c][self.maxs[c][0]])
            elif kind == LAST:
                out.append(columns[c][hi - 1])
            else:
                out.append(len(self.seen[c]))
        return tuple(out)
