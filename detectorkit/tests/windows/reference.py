"""One pass over the records, record by record, from the definitions alone: what a window rule must
answer whatever the batches, restarts and partitions. Written without the rule's code, slowly and
plainly: per partition, its event time (the newest record time); per key, its counted records.

- A record is counted if `where` takes it. A counted record is late, and dropped, if older than
  its key's newest counted record by more than the grace, or if no open window would take it.
- Windows: tumbling [s, s + size); hopping the same every hop; sliding one per counted record,
  [t - size, t]; sessions, a key's counted records sorted by time, split where two are a gap or more
  apart, [first, last].
- A window closes once the partition's time reaches its end + the grace (a session's last + the gap
  + the grace); a closed window takes no more records.
- Before each record, the windows the partition's time has closed are closed (rules that emit when
  windows close), and a key whose newest record is more than the TTL behind the partition's time
  starts afresh, unless it has a window or episode still to close.
- Every: each counted record, its window (sliding: its own) after it. When: each window the record
  changed (sliding: its own and, a late record, the windows of later records it falls in; a session:
  the one it is in), the first time it satisfies the condition; each window once, a sliding window
  not if it overlaps one emitted, a session not if it holds a time of one emitted; a record is one
  detection, its first window.
- Final: each closed window that satisfies the condition. Silent: a sliding window that satisfies
  it, once closed a silence after its end, if no record came within the silence. Episodes: closed windows that satisfy it,
  each starting no later than the end of the episode so far, are one episode (a session is one),
  over once the partition's time reaches its end + the window (a session: the gap) + the grace.
- A sliding window holds its end, so it closes (and its episodes end) a millisecond later than the
  end + the grace: once the partition's time has passed them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from detectorkit import windows as w

AGGREGATE_OF = {
    "count": len,
    "sum": math.fsum,
    "min": min,
    "max": max,
    "mean": lambda vs: math.fsum(vs) / len(vs),
    "distinct": lambda vs: len(set(vs)),
}
# The newest record's value (of records at one time, the one that came last): over (time, value)
# in arrival order.
LAST = "last"


@dataclass
class _Key:
    counted: list[tuple[int, float]] = field(default_factory=list)  # (time, value), in arrival order
    seen: int | None = None
    emitted: list[int] = field(default_factory=list)
    closed_sessions: list[tuple[int, int]] = field(default_factory=list)
    closed_windows: set[tuple[int, int]] = field(default_factory=set)
    episodes: list[list] = field(default_factory=list)


def one_pass(window, aggregates: dict, mode: str, having, rows, partition_of, where=lambda row: True, ttl_ms: int | None = None, silence_ms: int = 0):
    """(record detections [(n, start, end, *aggregates)], key detections [(key, start, end, *rest)])
    of rows (key, ms, value, status) in order. `having(row)`: the condition on a window's row
    {name: aggregate}, None for none; `mode`: every, when, final, episode or silent (a sliding
    window once `silence_ms` passed after it without a record)."""
    grace = round(window.grace_seconds * 1000)
    session = isinstance(window, w.Session)
    sliding = isinstance(window, w.Sliding)
    size = round((window.gap_seconds if session else window.seconds) * 1000)
    hop = round(window.hop_seconds * 1000) if isinstance(window, w.Hopping) else size
    # A window closes once the partition's time passes the last instant it takes a record, plus the
    # grace: a sliding window's is its end, [t - size, t]; the others' is before their end.
    after = grace + (silence_ms if mode == "silent" else 1 if sliding else 0)
    reach = size + after
    ttl = ttl_ms if ttl_ms is not None else size + grace
    names = list(aggregates)
    closing = mode in ("final", "episode", "silent")
    parts: dict[int, int] = {}
    keys: dict[str, _Key] = {}
    found, fired = [], []

    def spans(at):
        return [(s, s + size) for s in range((at - size) // hop * hop + hop, at // hop * hop + 1, hop)]

    def aggregate(k: _Key, inside) -> tuple:
        held = [(t, v) for t, v in k.counted if inside(t)]
        values = [v for _, v in held]
        newest = max(t for t, _ in held)
        last = [v for t, v in held if t == newest][-1]
        return tuple(float(last if a.kind == LAST else AGGREGATE_OF[a.kind](values)) for a in aggregates.values())

    def sessions(k: _Key) -> list[tuple[int, int]]:
        out = []
        for t in sorted(t for t, _ in k.counted):
            if out and t - out[-1][1] < size:
                out[-1][1] = t
            else:
                out.append([t, t])
        return [tuple(s) for s in out]

    def satisfied(aggs) -> bool:
        return having is None or having(dict(zip(names, aggs, strict=True)))

    def windows_of(k: _Key) -> list[tuple[int, int, int]]:
        """(start, end, close) of the key's windows not closed yet, in the order they close."""
        if session:
            return [(a, b, b + size + grace) for a, b in sessions(k) if (a, b) not in k.closed_sessions]
        if sliding:
            ends = {t for t, _ in k.counted}
            return sorted((e - size, e, e + after) for e in ends if (e - size, e) not in k.closed_windows)
        spans_ = {s for t, _ in k.counted for s in spans(t)}
        return sorted((a, b, b + grace) for a, b in spans_ if (a, b) not in k.closed_windows)

    def end_episodes(key: str, k: _Key, now: int, strict: bool) -> None:
        for e in list(k.episodes):
            close = e[1] + reach
            if close < now or (not strict and close <= now):
                fired.append((key, e[0], e[1], e[2], *e[3:]))
                k.episodes.remove(e)

    def close(p: int, now: int) -> None:
        for key, k in keys.items():
            if partition_of(key) != p:
                continue
            for a, b, at in windows_of(k):
                if at > now:
                    continue
                if session:
                    k.closed_sessions.append((a, b))
                    inside = lambda t, a=a, b=b: a <= t <= b  # noqa: E731
                else:
                    k.closed_windows.add((a, b))
                    inside = (lambda t, a=a, b=b: a <= t <= b) if sliding else (lambda t, a=a, b=b: a <= t < b)
                aggs = aggregate(k, inside)
                if mode == "silent" and any(b < t < b + silence_ms for t, _ in k.counted):
                    continue  # not silent after it
                if mode in ("final", "silent"):
                    if satisfied(aggs):
                        fired.append((key, a, b, *aggs))
                    continue
                end_episodes(key, k, at, strict=True)
                if not satisfied(aggs):
                    continue
                if k.episodes and not session and a <= k.episodes[-1][1]:
                    e = k.episodes[-1]
                    e[1], e[2] = max(e[1], b), e[2] + 1
                    e[3:] = [max(x, y) for x, y in zip(e[3:], aggs, strict=True)]
                else:
                    k.episodes.append([a, b, 1, *aggs])
            if mode == "episode":
                end_episodes(key, k, now, strict=False)

    def held(k: _Key) -> bool:
        return closing and bool(windows_of(k) or k.episodes)

    def taken(k: _Key, at: int, now: int) -> bool:
        """Whether an open window would take a record at `at` (rules whose windows close); the
        windows it would land in that have closed are remembered as closed."""
        if session:
            k.counted.append((at, 0.0))
            mine = next(s for s in sessions(k) if s[0] <= at <= s[1])
            k.counted.pop()
            joins_closed = any(mine[0] <= b and a <= mine[1] for a, b in k.closed_sessions)
            return not joins_closed and mine[1] + size + grace > now
        if sliding:
            if at + after <= now:
                k.closed_windows.add((at - size, at))
            return at + after > now or any(at <= t <= at + size and t + after > now for t, _ in k.counted)
        k.closed_windows |= {(a, b) for a, b in spans(at) if b + grace <= now}
        return any(b + grace > now for _, b in spans(at))

    for n, (key, offset, value, status) in enumerate(rows):
        at, value, p = offset, float(value), partition_of(key)
        now = max(parts.get(p, at), at)
        if closing:
            close(p, now)
        parts[p] = now
        k = keys.setdefault(key, _Key())
        if k.seen is not None and now - k.seen > ttl and not held(k):
            k = keys[key] = _Key()
        k.seen = at if k.seen is None else max(k.seen, at)
        if not where((key, offset, value, status)):
            continue
        if k.counted and at < max(t for t, _ in k.counted) - grace:
            continue
        if closing and not taken(k, at, now):
            continue
        k.counted.append((at, value))
        if closing:
            continue
        if mode == "every":
            if session:
                a, b = next(s for s in sessions(k) if s[0] <= at <= s[1])
                aggs = aggregate(k, lambda t, a=a, b=b: a <= t <= b)
            elif sliding:
                a, b = at - size, at
                aggs = aggregate(k, lambda t, a=a, b=b: a <= t <= b)
            else:
                (a, b), *_ = spans(at)
                aggs = aggregate(k, lambda t, a=a, b=b: a <= t < b)
            if satisfied(aggs):
                found.append((n, a, b, *aggs))
            continue
        if session:
            changed = [next(s for s in sessions(k) if s[0] <= at <= s[1])]
        elif sliding:
            changed = [(e - size, e) for e in sorted({at} | {t for t, _ in k.counted if at < t <= at + size})]
        else:
            changed = spans(at)
        made = None
        for a, b in changed:
            inside = (lambda t, a=a, b=b: a <= t < b) if not (session or sliding) else (lambda t, a=a, b=b: a <= t <= b)
            aggs = aggregate(k, inside)
            if not satisfied(aggs):
                continue
            if session:
                if any(a <= e <= b for e in k.emitted):
                    continue
                k.emitted.append(b)
            elif sliding:
                if any(abs(e - b) <= size for e in k.emitted):
                    continue
                k.emitted.append(b)
            else:
                if a in k.emitted:
                    continue
                k.emitted.append(a)
            made = made or (n, a, b, *aggs)
        if made is not None:
            found.append(made)
    if closing:
        for p, now in parts.items():
            close(p, now)
    return found, fired
