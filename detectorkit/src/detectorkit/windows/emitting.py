"""What a window rule emits: the condition (`having`, or a threshold) judged once over a call's
candidates and closed windows, and each key's detections chosen in order, what a window or an
episode already emitted remembered in its state (`Rule` takes these methods)."""

from __future__ import annotations

from bisect import bisect_left, insort_right
from typing import Any

import numpy as np
import pandas as pd

from detectorkit.state.declaration import DEADLINE, KEY
from detectorkit.windows.accumulate import COUNT, DISTINCT
from detectorkit.windows.held import Calls, Key

START, END, WINDOWS = "window_start_ms", "window_end_ms", "windows"


class Emitting:
    """The emitting half of `windows.rule.Rule` (its fields: `mode`, `names`, `plan`, `threshold`,
    `having`, `session`, `sliding`, `size`, `after`)."""

    def _choose(self, calls: Calls, keys: dict[str, Key], dtype: Any) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(detections by record, detections by key) of the candidates and closings that satisfy
        the condition, each key's in order, with what it emitted remembered."""
        rows = calls.rows
        empty = self._detections([], pd.Index([], dtype=dtype))
        if not rows:
            return empty, self._detections([], pd.Index([], dtype=object))
        ok = self._satisfied(rows)
        mode = self.mode
        if mode == "every":
            chosen = [r for r, good in zip(rows, ok, strict=True) if good]
            index = [o for o, good in zip(calls.owner, ok, strict=True) if good]
            return self._detections(chosen, pd.Index(index, dtype=dtype)), empty
        if mode in ("final", "silent"):
            chosen = [r for r, good in zip(rows, ok, strict=True) if good]
            at = [o for o, good in zip(calls.owner, ok, strict=True) if good]
            out = self._detections(chosen, pd.Index([r[0] for r in chosen], dtype=object))
            out[DEADLINE] = pd.to_datetime(at, unit="ms", utc=True)
            return empty, out
        if mode == "episode":
            return empty, self._episodes(rows, calls.owner, ok, keys)
        chosen, index = [], []
        last_owner = None
        for row, owner, good in zip(rows, calls.owner, ok, strict=True):
            # Every window that satisfies it is emitted once; a record is one detection, its first.
            if good and self._first_time(keys[row[0]], row) and owner != last_owner:
                chosen.append(row)
                index.append(owner)
                last_owner = owner
        return self._detections(chosen, pd.Index(index, dtype=dtype)), empty

    def _satisfied(self, rows: list[tuple]) -> list[bool]:
        if self.threshold is not None:
            at = 3 + self.names.index(self.threshold[0])
            bar = self.threshold[1]
            return [r[at] >= bar for r in rows]
        if self.having is None:
            return [True] * len(rows)
        frame = pd.DataFrame(rows, columns=[KEY, START, END, *self.names])
        return np.asarray(self.having(frame), dtype=bool).tolist()

    def _first_time(self, k: Key, row: tuple) -> bool:
        """Whether a window that satisfies the condition emits now (and remembers that it did):
        each window once; a sliding window not if it overlaps one the key emitted; a session not
        if it (or one it merged with) emitted."""
        emitted = k.emitted
        if self.session:
            first, last = row[1], row[2]
            if any(first <= e <= last for e in emitted):
                return False
            insort_right(emitted, last)
            return True
        if self.sliding:
            end = row[2]
            i = bisect_left(emitted, end - self.size)
            if i < len(emitted) and emitted[i] <= end + self.size:
                return False
            insort_right(emitted, end)
            return True
        if row[1] in emitted:
            return False
        insort_right(emitted, row[1])
        return True

    def _episodes(self, rows: list[tuple], closes: list[int], ok: list[bool], keys: dict[str, Key]) -> pd.DataFrame:
        """Closed windows that satisfy the condition joined into their keys' episodes, in the order
        they closed; the episodes that ended before one of them closed, emitted."""
        done = []
        for row, close, good in zip(rows, closes, ok, strict=True):
            k = keys[row[0]]
            done += self._ended(row[0], k, close, strict=True)
            if not good:
                continue
            episodes = k.episodes
            if episodes and row[1] <= episodes[-1][1] and not self.session:
                episode = episodes[-1]
                episode[1] = max(episode[1], row[2])
                episode[2] += 1
                for n in range(len(self.names)):
                    episode[3 + n] = max(episode[3 + n], row[3 + n])
            else:
                episodes.append([row[1], row[2], 1, *row[3:]])
        return self._episode_frame(done)

    def _ended(self, key: str, k: Key, now: int, strict: bool = False) -> list[tuple]:
        """The key's episodes over by `now` (before it, with `strict`), taken out."""
        reach = self.size + self.after
        over_ = [e for e in k.episodes if (e[1] + reach < now if strict else e[1] + reach <= now)]
        if over_:
            k.episodes = [e for e in k.episodes if e not in over_]
        return [(key, *e, e[1] + reach) for e in over_]

    def _end_episodes(self, keys: dict[str, Key], now: dict[str, int]) -> pd.DataFrame:
        done = [row for key, k in keys.items() for row in self._ended(key, k, now[key])]
        return self._episode_frame(done)

    def _episode_frame(self, done: list[tuple]) -> pd.DataFrame:
        columns = [KEY, START, END, WINDOWS, *self.names, DEADLINE]
        frame = pd.DataFrame(done, columns=columns)
        frame[START] = frame[START].astype("int64")
        frame[END] = frame[END].astype("int64")
        frame[WINDOWS] = frame[WINDOWS].astype("int64")
        self._counts_as_ints(frame)
        frame[DEADLINE] = pd.to_datetime(frame[DEADLINE].astype("int64"), unit="ms", utc=True)
        return frame.set_index(pd.Index(frame[KEY].tolist(), dtype=object))

    def _detections(self, chosen: list[tuple], index: pd.Index) -> pd.DataFrame:
        frame = pd.DataFrame(chosen, columns=[KEY, START, END, *self.names], index=index)
        if not len(frame):
            return frame
        self._counts_as_ints(frame)
        return frame

    def _counts_as_ints(self, frame: pd.DataFrame) -> None:
        for name, (kind, _) in zip(self.names, self.plan, strict=True):
            if kind in (COUNT, DISTINCT) and len(frame):
                frame[name] = frame[name].astype("int64")
