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

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from detectorkit.detector import Detector, NoConfig, bound, defaults_of, takes_config
from detectorkit.state.declaration import State
from detectorkit.windows.aggregates import Aggregate, AtLeast, Count, DistinctCount, Emit, Every, Final, Last, Max, Mean, Min, Silent, Sum, When
from detectorkit.windows.kinds import Hopping, Session, Sliding, Tumbling, Window
from detectorkit.windows.rule import Rule

DEFAULT_RETENTION_SECONDS = 3600.0
Predicate = Callable[[pd.DataFrame], Any] | Callable[[pd.DataFrame, Any], Any]


def detector(
    name: str,
    window: Window | Callable[[Any], Window],
    aggregate: Aggregate | Mapping[str, Aggregate] | Callable[[Any], Any],
    emit: Emit | Callable[[Any], Emit],
    where: Predicate | None = None,
    required_fields: tuple[str, ...] = (),
    config: type = NoConfig,
    event_time_field: str | None = None,
    key_field: str | None = None,
    retention_seconds: float | None = None,
    repartition: bool = False,
) -> Detector:
    """A stateful `Detector` computing `aggregate` (one, or several by name) over `window` for each
    key and emitting by `emit`. `window`, `aggregate` and `emit` may each be a function of the
    detector's config; `where` and an emit's `having` may take the config as a second argument.
    `retention_seconds`: how long a quiet key's windows are kept after its newest record (default
    an hour, or the window and its grace if longer). `repartition`: with `key_field`, the job
    re-keys its input by it (runtime.repartition)."""

    def build(settings: Any) -> Detector:
        chosen = [part(settings) if callable(part) and not _is_part(part) else part for part in (window, aggregate, emit)]
        return _detector(
            name,
            *chosen,
            bound(where, settings),
            required_fields,
            config,
            event_time_field,
            key_field,
            retention_seconds,
            repartition,
            configure,
            settings,
        )

    per_config = any(callable(part) and not _is_part(part) for part in (window, aggregate, emit)) or takes_config(where)
    if not per_config and isinstance(emit, Every | When | Final | Silent) and takes_config(emit.having):
        per_config = True
    configure = build if per_config else None
    return build(defaults_of(config, per_config, "windows.detector"))


def _is_part(value: Any) -> bool:
    """A window, aggregate or emit itself (a dataclass instance), not a function of the config."""
    return isinstance(value, Window | Aggregate | Emit) or isinstance(value, Mapping)


def _detector(
    name: str,
    window: Window,
    aggregate: Aggregate | Mapping[str, Aggregate],
    emit: Emit,
    where: Callable[[pd.DataFrame], Any] | None,
    required_fields: tuple[str, ...],
    config: type,
    event_time_field: str | None,
    key_field: str | None,
    retention_seconds: float | None,
    repartition: bool,
    configure: Callable[[Any], Detector] | None,
    settings: Any,
) -> Detector:
    aggregates = _named(aggregate)
    mode, having, threshold = _emitting(emit, aggregates, settings)
    if mode == "silent" and not isinstance(window, Sliding):
        raise TypeError("Silent(seconds) follows a sliding window (the window up to a key's last record before the silence): window=Sliding(...)")
    if isinstance(window, Hopping) and mode == "every":
        raise TypeError("Hopping windows emit When/AtLeast or Final: with Every a record would be a detection once per window it is in")
    if mode in ("final", "episode") and isinstance(window, Hopping) and window.seconds / window.hop_seconds > 50:
        raise ValueError("Final() with Hopping windows takes at most 50 windows per record (seconds / hop_seconds <= 50)")
    for a in aggregates.values():
        if a.field is not None and a.field not in required_fields:
            required_fields = (*required_fields, a.field)
    # A key's state can change only while a record may still land in one of its windows: within the
    # window (a session's gap) and the grace of its newest record. Kept that short, a key seen less
    # often than that would have its state made and dropped at each record, and a batch of a backlog
    # cut wherever one of its keys expired: an hour (Kafka Streams keeps a windowed store a day)
    # costs a few kept records per quiet key instead. A key with a window or episode still to
    # close keeps it until it closes (its timer holds it).
    reach = window.reach_seconds + window.grace_seconds
    if retention_seconds is not None and not retention_seconds >= reach:
        raise ValueError(f"retention_seconds must be at least the window and its grace, {reach:g} s, not {retention_seconds!r}")
    ttl = max(reach, DEFAULT_RETENTION_SECONDS) if retention_seconds is None else retention_seconds
    rule = Rule(window, aggregates, emit, where, having, threshold, mode)
    closing = mode in ("final", "episode", "silent")
    state = State(columns=rule.state_columns, ttl_seconds=ttl, name=_state_name(window, aggregates, mode, emit))
    return Detector(
        name=name,
        detect=rule.detect,
        config=config,
        required_fields=required_fields,
        state=state,
        on_timer=rule.on_timer if closing else None,
        event_time_field=event_time_field,
        key_field=key_field,
        repartition=repartition,
        sees_partition_time=closing,
        take_late=rule.take_late,
        configure=configure,
        in_store=rule.detect_in_store if rule.compiled else None,
        warm=functools.partial(rule.warm, state) if rule.compiled else None,
    )


def _named(aggregate: Aggregate | Mapping[str, Aggregate]) -> dict[str, Aggregate]:
    """The aggregates by the names the detections carry: a mapping's keys, or the one's name."""
    if isinstance(aggregate, Mapping):
        if not aggregate:
            raise ValueError("aggregate={...} needs at least one aggregate")
        named = dict(aggregate)
    else:
        named = {aggregate.name: aggregate}
    for name, a in named.items():
        if not isinstance(a, Aggregate):
            raise TypeError(f"aggregate {name!r} must be a windows aggregate (Count(), Sum(field), ...), not {type(a).__name__}")
        if name in ("key", "window_start_ms", "window_end_ms", "windows", "deadline"):
            raise ValueError(f"an aggregate may not be named {name!r}: a detection's own field")
    return named


def _emitting(emit: Emit, aggregates: dict[str, Aggregate], settings: Any) -> tuple[str, Callable | None, tuple[str, float] | None]:
    """(mode, condition, threshold) of an emit: every, when (each window once), final (each window
    when it closes) or episode; the condition as a function of the windows' frame alone."""
    if isinstance(emit, Every):
        return "every", bound(emit.having, settings), None
    if isinstance(emit, AtLeast):
        of = emit.of
        if of is None:
            if len(aggregates) > 1:
                raise ValueError(f"AtLeast({emit.threshold}) over several aggregates needs of=, one of {sorted(aggregates)}")
            of = next(iter(aggregates))
        if of not in aggregates:
            raise ValueError(f"AtLeast(of={of!r}) names no aggregate; the rule has {sorted(aggregates)}")
        threshold = (of, float(emit.threshold))
        return ("when" if emit.per == "window" else "episode"), None, threshold
    if isinstance(emit, When):
        return ("when" if emit.per == "window" else "episode"), bound(emit.having, settings), None
    if isinstance(emit, Final):
        return ("final" if emit.per == "window" else "episode"), bound(emit.having, settings), None
    if isinstance(emit, Silent):
        return "silent", bound(emit.having, settings), None
    raise TypeError(f"emit must be Every(), When(...), AtLeast(...), Final() or Silent(...), not {type(emit).__name__}")


def _state_name(window: Window, aggregates: dict[str, Aggregate], mode: str, emit: Emit) -> str:
    """Named for what the state means: another kind of window, aggregate (or field) or emit reads
    it otherwise, so changing one starts from empty state in a changelog of its own; a new size or
    condition keeps it. (Tumbling and hopping windows that close remember how far they closed, not
    which: their name says so.)"""

    def one(a: Aggregate) -> str:
        field = re.sub(r"[^A-Za-z0-9_-]", "_", a.field) if a.field else ""
        return type(a).__name__.lower() + (f"-{field}" if field else "")

    what = "_".join(one(a) for a in aggregates.values())
    how = type(emit).__name__.lower() + ("-episode" if mode == "episode" else "")
    name = f"windows.{type(window).__name__.lower()}.{what}.{how}"
    return name + ".closed" if mode in ("final", "episode") and isinstance(window, Tumbling | Hopping) else name


__all__ = [
    "AtLeast",
    "Count",
    "DistinctCount",
    "Every",
    "Final",
    "Hopping",
    "Last",
    "Max",
    "Mean",
    "Min",
    "Session",
    "Silent",
    "Sliding",
    "Sum",
    "Tumbling",
    "When",
    "detector",
]
