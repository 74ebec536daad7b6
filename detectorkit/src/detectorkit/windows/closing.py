"""Which of a key's windows close when the partition's event time moves on, and what a key keeps
of its records (`Rule` takes these methods)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from detectorkit.windows.accumulate import over
from detectorkit.windows.held import Calls, Key


class Closing:
    """The closing half of `windows.rule.Rule` (its fields: `size`, `grace`, `after`, `mode`,
    `plan`, `closing`, `session`, `sliding`; its `_sessions`, `_sliding` and `_starts`)."""

    def _open_for(self, k: Key, at: int) -> bool:
        """Whether an open window would take a record at `at` (a rule that emits when windows close)."""
        if self.sliding:
            if at > k.closed:
                return True
            t = k.t
            return bisect_right(t, at + self.size) > bisect_right(t, max(at, k.closed))  # a later record's open window holds it
        return self._starts(at)[-1] + self.size > k.closed

    def _close(self, key: str, k: Key, now: int, calls: Calls) -> None:
        """Closes the key's windows that the partition's event time `now` has closed (their end and
        the grace passed; a session's last record, the gap and the grace), in the order they close."""
        limit = now - self.after
        k.now = max(k.now, now)
        if self.session:
            sessions = self._sessions(k)
            while sessions and sessions[0][1] + self.size <= limit:
                first, last = sessions.pop(0)
                acc = k.accs.pop(first)
                calls.rows.append((key, first, last, *acc.read(self.plan)))
                calls.owner.append(last + self.size + self.grace)
                k.closed = max(k.closed, last)
                self._drop_front(k, bisect_right(k.t, last))
            return
        if limit <= k.closed:
            return
        first = self._first_open_end(k)
        if first is None or first > limit:
            k.closed = limit
            return
        t, size = k.t, self.size
        if self.sliding:
            silence = self.after - self.grace if self.mode == "silent" else 0
            for end in sorted(set(t[bisect_right(t, k.closed) : bisect_right(t, limit)])):
                if silence:
                    following = bisect_right(t, end)
                    if following < len(t) and t[following] < end + silence:
                        continue  # a record came within the silence: the key was not silent after it
                lo, hi = bisect_left(t, end - size), bisect_right(t, end)
                calls.rows.append((key, end - size, end, *self._sliding(k, lo, hi)))
                calls.owner.append(end + self.after)
            k.closed = limit
            return
        starts = sorted({s for x in t[: bisect_left(t, limit)] for s in self._starts(x) if k.closed < s + size <= limit})
        for start in starts:
            calls.rows.append((key, start, start + size, *over(self.plan, k.cols, bisect_left(t, start), bisect_left(t, start + size))))
            calls.owner.append(start + size + self.grace)
        k.closed = limit
        # A record whose every window has closed counts no more.
        drop = 0
        while drop < len(t) and self._starts(t[drop])[-1] + size <= limit:
            drop += 1
        self._drop_front(k, drop)

    def _drop_front(self, k: Key, n: int) -> None:
        if n:
            k.run = None
            del k.t[:n]
            for column in k.cols:
                del column[:n]

    def _first_open_end(self, k: Key) -> int | None:
        """The end of the key's earliest window not closed (a sliding window's: its record's time)."""
        t = k.t
        if self.sliding:
            i = bisect_right(t, k.closed)
            return t[i] if i < len(t) else None
        for x in t:
            ends = [s + self.size for s in self._starts(x) if s + self.size > k.closed]
            if ends:
                return ends[0]
        return None

    def _next_close(self, k: Key) -> int | None:
        """When the key's earliest open window (or episode) closes: its timer."""
        grace, size = self.after, self.size
        closes = [e[1] + size + grace for e in k.episodes] if self.mode == "episode" else []
        if self.session:
            sessions = self._sessions(k)
            if sessions:
                closes.append(sessions[0][1] + size + grace)
        else:
            first = self._first_open_end(k)
            if first is not None:
                closes.append(first + grace)
        return min(closes) if closes else None

    def _prune(self, k: Key) -> None:
        """Keeps what can still count: the records a window may still take (one that a record not
        late may land in, or one not closed yet), and what emitted that such a window could meet."""
        t = k.t
        if not t:
            return
        size = self.size
        earliest = t[-1] - self.grace  # a record not late is at least this
        if self.session:
            sessions = self._sessions(k)
            if not self.closing:  # a closing rule's sessions are held until they close
                alive = [s for s in sessions if s[1] + size > earliest]
                for s in sessions[: len(sessions) - len(alive)]:
                    k.accs.pop(s[0], None)
                k.sessions = sessions = alive
                k.emitted = [e for e in k.emitted if sessions and e >= sessions[0][0]]
            lo = bisect_left(t, sessions[0][0]) if sessions else len(t)
        elif self.sliding:
            horizon = min(earliest, k.closed + 1) - size if self.closing else earliest - size
            lo = bisect_left(t, horizon)
            k.emitted = [e for e in k.emitted if e >= earliest - size]
        else:
            bound = max(earliest, k.closed) if self.closing else earliest  # a window ending by then takes nothing more
            lo = 0
            while lo < len(t) and self._starts(t[lo])[-1] + size <= bound:
                lo += 1
            k.emitted = [s for s in k.emitted if s + size > earliest]
            for s in [s for s in k.accs if s + size <= bound]:
                del k.accs[s]
        self._drop_front(k, lo)
