"""Windows over event time, per key: a time-based rule without hand-written state.

    from detectorkit import windows

    DETECTOR = windows.detector(
        name="failed-logins",
        window=windows.Sliding(seconds=60),
        aggregate=windows.Count(),
        emit=windows.AtLeast(5),  # once, on the record that takes a window to 5
        where=lambda records: records["status"] == "failed",
        required_fields=("status",),
    )

A window detector is a stateful `Detector` the runtime runs like any other: its state is the key's
records still inside a window that can change (and the windows it already emitted), kept in the
changelog, restored on a move, and pruned of what no window can take any more (the window and its
grace: no TTL to set); a key quiet for `retention_seconds` (an hour, or the window and grace if
longer) is forgotten, and a record of it after that starts afresh. Its answers are those of one pass over the records, whatever the
batches, restarts and rebalances, as every stateful detector's.

Windows, per key (the Kafka key) and over the record's event time (its Kafka timestamp):
  - `Tumbling(seconds)`: back to back, [k*size, (k+1)*size);
  - `Hopping(seconds, hop_seconds)`: of `seconds`, one starting every `hop_seconds`;
  - `Sliding(seconds)`: at each record, the `seconds` up to it, [t - size, t] (both ends, as
    Kafka Streams' sliding windows);
  - `Session(gap_seconds)`: a key's records less than a gap apart, one after another; a gap of
    `gap_seconds` or more ends it (window_start_ms and window_end_ms: its first and last record).
A record older than its key's newest record by more than `grace_seconds` is late and dropped (as
Kafka Streams drops it), whatever the window. Aggregates: `Count()`, `Sum(field)`, `Min(field)`,
`Max(field)`, `Mean(field)`, `DistinctCount(field)`. Emit: `Every()`, a detection for each record
with its window's aggregate; `AtLeast(threshold)`, one when a window's aggregate first reaches
the threshold (a sliding window: none again for that key for a window's length); `Final()`, one
per window when it closes, once the partition's event time passes its end (a session's: its last
record and the gap) and the grace, from a timer, indexed by key.

`where` picks the records that count (the others are ignored, and a key keeps its windows through a
batch that holds none of its counted records).

Sizes from settings: `window`, `aggregate` and `emit` may each be a function of the detector's
config, e.g. `window=lambda config: windows.Sliding(config.window_seconds)`: the runtime builds the
detector from the config it reads from DETECTOR_* at start (the state's expiry included).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pandas as pd

from detectorkit.detector import Detector, NoConfig
from detectorkit.state.declaration import State
from detectorkit.windows.aggregates import Aggregate, AtLeast, Count, DistinctCount, Emit, Every, Final, Max, Mean, Min, Sum
from detectorkit.windows.kinds import Hopping, Session, Sliding, Tumbling, Window
from detectorkit.windows.rule import STATE_COLUMNS, Rule

DEFAULT_RETENTION_SECONDS = 3600.0


def detector(
    name: str,
    window: Window | Callable[[Any], Window],
    aggregate: Aggregate | Callable[[Any], Aggregate],
    emit: Emit | Callable[[Any], Emit],
    where: Callable[[pd.DataFrame], Any] | None = None,
    required_fields: tuple[str, ...] = (),
    config: type = NoConfig,
    event_time_field: str | None = None,
    key_field: str | None = None,
    retention_seconds: float | None = None,
) -> Detector:
    """A stateful `Detector` computing `aggregate` over `window` for each key and emitting by `emit`.
    `retention_seconds`: how long a quiet key's windows are kept after its newest record (default
    an hour, or the window and its grace if longer)."""

    def build(settings: Any) -> Detector:
        chosen = [part(settings) if callable(part) else part for part in (window, aggregate, emit)]
        return _detector(name, *chosen, where, required_fields, config, event_time_field, key_field, retention_seconds, configure)

    configure = build if any(callable(part) for part in (window, aggregate, emit)) else None
    try:
        defaults = config()
    except TypeError as exc:
        if configure is None:
            defaults = None
        else:
            message = f"windows.detector(config={config.__name__}): a window built from its config needs a default for every field ({exc})"
            raise TypeError(message) from None
    return build(defaults)


def _detector(
    name: str,
    window: Window,
    aggregate: Aggregate,
    emit: Emit,
    where: Callable[[pd.DataFrame], Any] | None,
    required_fields: tuple[str, ...],
    config: type,
    event_time_field: str | None,
    key_field: str | None,
    retention_seconds: float | None,
    configure: Callable[[Any], Detector] | None,
) -> Detector:
    if isinstance(window, Hopping) and isinstance(emit, Every):
        raise TypeError("Hopping windows emit AtLeast(threshold) or Final(): with Every a record would be a detection once per window it is in")
    if isinstance(emit, Final) and isinstance(window, Sliding):
        raise TypeError("Final() closes Tumbling, Hopping or Session windows; a sliding window, one per record, never closes alone")
    if isinstance(emit, Final) and isinstance(window, Hopping) and window.seconds / window.hop_seconds > 50:
        raise ValueError("Final() with Hopping windows takes at most 50 windows per record (seconds / hop_seconds <= 50)")
    if aggregate.field is not None and aggregate.field not in required_fields:
        required_fields = (*required_fields, aggregate.field)
    # A key's state can change only while a record may still land in one of its windows: within the
    # window (a session's gap) and the grace of its newest record. Kept that short, a key seen less
    # often than that would have its state made and dropped at each record, and a batch of a backlog
    # cut wherever one of its keys expired: an hour (Kafka Streams keeps a windowed store a day)
    # costs a few kept records per quiet key instead.
    reach = window.reach_seconds + window.grace_seconds
    if retention_seconds is not None and not retention_seconds >= reach:
        raise ValueError(f"retention_seconds must be at least the window and its grace, {reach:g} s, not {retention_seconds!r}")
    ttl = max(reach, DEFAULT_RETENTION_SECONDS) if retention_seconds is None else retention_seconds
    rule = Rule(window, aggregate, emit, where)
    return Detector(
        name=name,
        detect=rule.detect,
        config=config,
        required_fields=required_fields,
        state=State(columns=dict(STATE_COLUMNS), ttl_seconds=ttl, name=_state_name(window, aggregate, emit)),
        on_timer=rule.on_timer if isinstance(emit, Final) else None,
        event_time_field=event_time_field,
        key_field=key_field,
        configure=configure,
    )


def _state_name(window: Window, aggregate: Aggregate, emit: Emit) -> str:
    """Named for what the state means: another kind of window, aggregate (or field) or emit reads
    it otherwise, so changing one starts from empty state in a changelog of its own; a new size
    keeps it."""
    field = re.sub(r"[^A-Za-z0-9_-]", "_", aggregate.field) if aggregate.field else ""
    parts = (type(window).__name__, type(aggregate).__name__ + (f"-{field}" if field else ""), type(emit).__name__)
    return "windows." + ".".join(parts).lower()


__all__ = [
    "AtLeast",
    "Count",
    "DistinctCount",
    "Every",
    "Final",
    "Hopping",
    "Max",
    "Mean",
    "Min",
    "Session",
    "Sliding",
    "Sum",
    "Tumbling",
    "detector",
]
