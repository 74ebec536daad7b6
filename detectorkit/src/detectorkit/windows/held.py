"""A window rule's keys as its engine holds them while a call runs (Python lists, sorted by time),
read from and written to the state's typed columns (`Rule` takes these methods)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from detectorkit.state.columns import lists
from detectorkit.windows.accumulate import Accumulator, Run

NEVER = -(2**62)  # no window closed yet


class Key:
    """One key's state while a call runs: Python lists, sorted by time. `accs`: running aggregates
    by window (tumbling, hopping: its start) or session (its first record), made from the held
    records when first needed in a call; `sessions`: [first, last] of each, in time order; `now`:
    the partition's event time when its windows were last closed."""

    __slots__ = ("t", "cols", "emitted", "episodes", "closed", "now", "accs", "sessions", "run")

    def __init__(self, t: list[int], cols: list[list[float]], emitted: list[int], episodes: list[list[float]], closed: int = NEVER):
        self.t, self.cols, self.emitted, self.episodes, self.closed = t, cols, emitted, episodes, closed
        self.now = NEVER
        self.accs: dict[int, Accumulator] = {}
        self.sessions: list[list[int]] | None = None
        # A sliding window's running aggregates while its records come in time order (None: none,
        # or its indices no longer hold: a record put before others, records dropped).
        self.run: Run | None = None


@dataclass
class Calls:
    """What a call collects before the condition is judged: candidates (windows a record changed)
    and closings (windows closed), each with its aggregates."""

    rows: list[tuple] = field(default_factory=list)  # (key, start, end, *aggregates)
    owner: list[Any] = field(default_factory=list)  # a candidate's record index, or a closing's close time
    late: int = 0


class Held:
    """Keys in and out of the state, for `windows.rule.Rule` (its fields: `width`, `fields`,
    `value_columns`, `mode`, `closing`, `names`)."""

    def _new_key(self) -> Key:
        return Key([], [[] for _ in range(self.width)], [], [])

    def _held(self, state: pd.DataFrame) -> dict[str, Key]:
        """The state's keys as Python lists."""
        if state.empty:
            return {}
        keys = state.index.tolist()
        t = _split(state["t"])
        cols = [_split(state[c]) for c in self.value_columns]
        emitted = _split(state["emitted"])
        episodes = _split(state["episodes"]) if self.mode == "episode" else [[] for _ in keys]
        width = 3 + len(self.names)
        held = {}
        for n, key in enumerate(keys):
            marks = emitted[n]
            k = Key(t[n], [c[n] for c in cols], [] if self.closing else marks, [])
            if self.closing and marks:
                k.closed = marks[0]
            e = episodes[n]
            k.episodes = [e[i : i + width] for i in range(0, len(e), width)]
            held[key] = k
        return held

    def _frame(self, keys: dict[str, Key]) -> pd.DataFrame:
        names = list(keys)
        ks = list(keys.values())
        data = {"t": _joined([k.t for k in ks], np.int64)}
        for c, name in enumerate(self.value_columns):
            data[name] = _joined([k.cols[c] for k in ks], np.float64)
        data["emitted"] = _joined([([k.closed] if k.closed != NEVER else []) if self.closing else k.emitted for k in ks], np.int64)
        if self.mode == "episode":
            data["episodes"] = _joined([[x for e in k.episodes for x in e] for k in ks], np.float64)
        return pd.DataFrame(data, index=pd.Index(names, dtype=object))

    def _values(self, counted: pd.DataFrame) -> list[list[float]]:
        """Each value column's numbers for the records, as Python lists."""
        return [column.tolist() for column in self._value_arrays(counted)]

    def _value_arrays(self, counted: pd.DataFrame) -> list[np.ndarray]:
        """Each value column's numbers for the records (a distinct count's: a hash of any value)."""
        out = []
        for name, hashed in self.fields:
            column = counted[name]
            if hashed:
                texts = column.to_numpy()
                if texts.dtype != object or pd.api.types.infer_dtype(texts, skipna=False) != "string":
                    texts = column.astype(str).to_numpy()  # texts already (the usual field) are hashed as they are
                # 53 bits: a float64 holds it exactly, and two of a window's values collide with odds of 1 in 2^53.
                out.append((pd.util.hash_array(texts) >> np.uint64(11)).astype(np.float64))
            else:
                out.append(pd.to_numeric(column, errors="raise").to_numpy(dtype=np.float64))
        return out


def _split(column: pd.Series) -> list[list]:
    """A list column as Python lists, one per row."""
    values = column.list.flatten().to_numpy().tolist()
    lengths = column.list.len().to_numpy()
    out, at = [], 0
    for n in lengths.tolist():
        out.append(values[at : at + n])
        at += n
    return out


def _joined(rows: list[list], dtype: Any) -> Any:
    lengths = [len(r) for r in rows]
    return lists(np.array([x for r in rows for x in r], dtype=dtype), lengths)
