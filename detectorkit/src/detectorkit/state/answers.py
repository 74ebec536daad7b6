"""What a stateful detector's call answered (`detect`'s or `on_timer`'s), unpacked and checked: its
detections, the timers it set (each key's last, and where one falls due among the call's own
records), the state of the keys it left out, and what fired within the call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from detectorkit import records as rec
from detectorkit.state.declaration import DEADLINE, KEY


@dataclass
class TimerDetection:
    key: str
    fields: dict
    deadline_ms: int


@dataclass
class TimerFailure:
    key: str
    message: str
    value: bytes  # the key's state and timer, as JSON, for the dead letter


@dataclass
class Result:
    found: list[tuple[int, dict]] = field(default_factory=list)  # (record position, fields)
    rejected: list[rec.Rejected] = field(default_factory=list)
    fired: list[TimerDetection] = field(default_factory=list)
    failed_timers: list[TimerFailure] = field(default_factory=list)
    late: int = 0  # records the detector dropped as late (a rule's `take_late`)


def timer_entries(timers: Any, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """detect()'s timers (a Series on the records' index: the key's timer after that record; NaT
    clears it; a record left out changes nothing), checked -> (positions of the records that set or
    clear one, their times in ms, which set one); None without timers."""
    if timers is None:
        return None
    if not isinstance(timers, pd.Series):
        raise TypeError(f"timers must be a pandas Series of times indexed like the records (each record's key's timer), not {type(timers).__name__}")
    if not timers.index.isin(frame.index).all():
        raise ValueError("timers has an index that is not the index of an input record: one timer per record, indexed like the records")
    times = pd.to_datetime(timers, utc=True)
    if times.index.has_duplicates:
        times = times[~times.index.duplicated(keep="last")]
    entries = np.flatnonzero(frame.index.isin(times.index))
    values = pd.DatetimeIndex(times.reindex(frame.index[entries])).asi8
    armed = values != np.iinfo(np.int64).min  # NaT
    return entries, np.where(armed, values // 1_000_000, 0), armed


def final_timers(frame: pd.DataFrame, entries: np.ndarray, ms: np.ndarray, armed: np.ndarray) -> dict[str, int | None]:
    """Each key's timer after its last record that set or cleared one."""
    keys = pd.Series(frame[KEY].to_numpy()[entries])
    last = np.flatnonzero(~keys.duplicated(keep="last").to_numpy())
    at = [int(m) if a else None for m, a in zip(ms[last].tolist(), armed[last].tolist(), strict=True)]
    return dict(zip(keys.to_numpy()[last].tolist(), at, strict=True))


def key_timers_of_records(timers: Any, frame: pd.DataFrame, codes: np.ndarray, keys: list[str], marks: np.ndarray | None):
    """detect()'s timers -> each key's last timer, and {key: how many of its records here run
    before its own timer, set by one of them, falls due at a later one of them} (empty: none does;
    a timer due after a key's last record here fires before its next, in the next round)."""
    got = timer_entries(timers, frame)
    if got is None:
        return None, {}
    entries, ms, armed = got
    final = final_timers(frame, entries, ms, armed)
    if marks is None or not armed.any():
        return final, {}
    # Each timer is in force from its record to the key's next record with a timer, or its last here.
    entry_codes = codes[entries]
    last_of_key = np.zeros(len(keys), dtype=np.int64)
    np.maximum.at(last_of_key, codes, np.arange(len(frame)))
    following = pd.Series(entries).groupby(entry_codes).shift(-1).to_numpy()
    limit = np.where(np.isnan(following), last_of_key[entry_codes], following).astype(np.int64)
    due = armed & (limit > entries) & (marks[limit] >= ms)
    if not due.any():
        return final, {}
    cuts: dict[str, int] = {}
    for e, code, t in zip(entries[due].tolist(), entry_codes[due].tolist(), ms[due].tolist(), strict=True):
        mine = np.flatnonzero(codes == code)
        later = mine[mine > e]
        count = int(np.searchsorted(mine, later[int(np.flatnonzero(marks[later] >= t)[0])]))  # the key's records before it
        cuts[keys[code]] = min(cuts.get(keys[code], count), count)
    return final, cuts


def record_timers(timers: Any, frame: pd.DataFrame, marks: np.ndarray | None) -> tuple[dict[str, int | None] | None, int | None]:
    """detect()'s timers -> each key's last timer, and the cut: the first record before which a
    timer set at an earlier one (and still in force) falls due; None if none does."""
    got = timer_entries(timers, frame)
    if got is None:
        return None, None
    entries, ms, armed = got
    final = final_timers(frame, entries, ms, armed)
    if marks is None or not len(entries) or not armed.any():
        return final, None
    # Each timer is in force from its record to the key's next record with a timer (or the end).
    following = pd.Series(entries).groupby(frame[KEY].to_numpy()[entries]).shift(-1).to_numpy()
    limit = np.where(np.isnan(following), len(frame) - 1, following).astype("int64")
    due = np.maximum(entries[armed] + 1, np.searchsorted(marks, ms[armed], side="left"))
    hit = due <= limit[armed]
    return final, (int(due[hit].min()) if hit.any() else None)


def left_out(new_state: pd.DataFrame, keys: pd.Index, first: np.ndarray | None, read) -> pd.DataFrame | None:
    """The state of the `keys` that `new_state` (checked: distinct keys of `keys`) leaves out, read
    again (`read(keys, first)`: the store has not changed since the call began, and the frame the
    detector was given may have been changed in place); None when it leaves none out, what a
    detector usually returns (as many rows as keys tell it without a look at them)."""
    if len(new_state) == len(keys):
        return None
    out = ~keys.isin(new_state.index)
    return read(keys[out].tolist(), None if first is None else first[out])


def unpack(out: Any, index: pd.Index | None, single: bool, name: str, fires: bool = False):
    """(detections, new state, timers, what fired within the call) of what a call returned."""
    sizes = (2, 3, 4) if fires else (2, 3)
    if not isinstance(out, tuple) or len(out) not in sizes:
        also = " or (detections, new_state, timers, fired)" if fires else ""
        raise TypeError(f"a stateful {name}() returns (detections, new_state) or (detections, new_state, timers){also}, not {type(out).__name__}")
    detections, new_state = out[0], out[1]
    timers = out[2] if len(out) >= 3 else None
    fired = out[3] if len(out) == 4 else None
    if index is None:
        if not isinstance(detections, pd.DataFrame):
            raise TypeError(f"{name}() must return a pandas DataFrame of detections, not {type(detections).__name__}")
        return detections, new_state, timers, fired
    return rec.detections_of(detections, index, single), new_state, timers, fired


def timer_detections(detections: pd.DataFrame | None, keys: pd.Index, deadlines: dict[str, int] | None) -> list[TimerDetection]:
    """Detections indexed by key, each at its `deadline` column (the time it fell due: its
    timestamp and its identity downstream) or, without one, its key's timer in `deadlines`."""
    if detections is None or detections.empty:
        return []
    if not isinstance(detections, pd.DataFrame):
        raise TypeError(f"fired detections must be a pandas DataFrame indexed by key, not {type(detections).__name__}")
    if not detections.index.isin(keys).all():
        raise ValueError("fired detections have an index that is not a key of the call")
    if DEADLINE in detections.columns:
        at = (pd.to_datetime(detections[DEADLINE], utc=True).astype("int64") // 1_000_000).tolist()
        detections = detections.drop(columns=[DEADLINE])
    elif deadlines is None:
        raise ValueError(f"detections that fire within detect() need a {DEADLINE!r} column: the time each fell due")
    else:
        at = [deadlines[k] for k in detections.index]
    rows = detections.to_dict(orient="records")
    return [TimerDetection(str(k), fields, int(t)) for k, fields, t in zip(detections.index, rows, at, strict=True)]


def key_timers(timers: Any, keys: pd.Index) -> dict[str, int]:
    """on_timer()'s timers (a Series of times indexed by key; NaT: none) -> {key: ms}."""
    if timers is None:
        return {}
    if not isinstance(timers, pd.Series):
        raise TypeError(f"timers must be a pandas Series of times indexed by key, not {type(timers).__name__}")
    stray = timers.index.difference(keys)
    if len(stray):
        raise ValueError(f"timers has keys that are not in the batch: {list(stray[:3])}")
    times = pd.to_datetime(timers, utc=True).dropna()
    return {str(k): int(t.value // 1_000_000) for k, t in times.items()}
