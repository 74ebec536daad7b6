"""Patterns over a key's records in event time: one record, then another within a time.

    from detectorkit import patterns

    DETECTOR = patterns.followed_by(
        name="reset-then-transfer",
        first=lambda records: records["type"] == "password_reset",
        then=lambda records, config: (records["type"] == "transfer") & (records["amount"] > config.min_amount),
        within_seconds=600,
        config=Config,
        required_fields=("type", "amount"),
    )

Per key (the Kafka key) and over event time (the Kafka timestamp, or `event_time_field`): a record
that `then` takes, at time b, matches a record that `first` took at a time a with a <= b <= a +
`within_seconds`: one detection, on the record that completes the match (key, first_ms, then_ms).
Each record is matched once: a `first` record by the earliest `then` record after it in arrival
order, a `then` record with the earliest `first` record that it can follow (a reset, then three
transfers, is one detection). A record may be both. A record older than its key's newest by more
than `grace_seconds` is late and dropped; one within the grace is matched as if it had come in
order (a transfer that arrives before the reset it follows in event time is still detected, on
the reset). State is kept per key in the changelog, what no future record can match is dropped,
and a key quiet for `retention_seconds` (an hour, or the pattern's reach if longer) is forgotten;
its answers are those of one pass over the records whatever the batches, restarts and rebalances.
"""

from __future__ import annotations

from bisect import bisect_left, insort_right
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from detectorkit.detector import Detector, NoConfig, bound, defaults_of, takes_config
from detectorkit.state.columns import lists
from detectorkit.state.declaration import EVENT_TIME, KEY, State
from detectorkit.windows import DEFAULT_RETENTION_SECONDS
from detectorkit.windows.kinds import ms, ms_or_zero

__all__ = ["followed_by"]

NONE = -(2**62)  # no record yet
FIRST, THEN = "first_ms", "then_ms"


def followed_by(
    name: str,
    first: Callable[..., Any],
    then: Callable[..., Any],
    within_seconds: float | Callable[[Any], float],
    grace_seconds: float = 0.0,
    required_fields: tuple[str, ...] = (),
    config: type = NoConfig,
    event_time_field: str | None = None,
    key_field: str | None = None,
    retention_seconds: float | None = None,
    repartition: bool = False,
) -> Detector:
    """A stateful `Detector`: a record `then` takes within `within_seconds` after one `first` took,
    per key. `first` and `then` take the records (and the config, as a second argument);
    `within_seconds` may be a function of the config."""

    def build(settings: Any) -> Detector:
        within = within_seconds(settings) if callable(within_seconds) else within_seconds
        reach = within + grace_seconds
        if retention_seconds is not None and not retention_seconds >= reach:
            raise ValueError(f"retention_seconds must be at least within_seconds and the grace, {reach:g} s, not {retention_seconds!r}")
        ttl = max(reach, DEFAULT_RETENTION_SECONDS) if retention_seconds is None else retention_seconds
        sequence = _Sequence(bound(first, settings), bound(then, settings), ms(within), ms_or_zero(grace_seconds))
        return Detector(
            name=name,
            detect=sequence.detect,
            config=config,
            required_fields=required_fields,
            state=State(columns=dict(_COLUMNS), ttl_seconds=ttl, name="patterns.followed-by"),
            event_time_field=event_time_field,
            key_field=key_field,
            repartition=repartition,
            configure=configure,
        )

    per_config = callable(within_seconds) or takes_config(first) or takes_config(then)
    configure = build if per_config else None
    return build(defaults_of(config, per_config, "patterns.followed_by"))


_COLUMNS = {"first": "list<int64>", "then": "list<int64>", "newest": "int64"}


class _Sequence:
    def __init__(self, first: Callable, then: Callable, within: int, grace: int):
        self.first, self.then, self.within, self.grace = first, then, within, grace

    def detect(self, records: pd.DataFrame, state: pd.DataFrame, config: Any) -> tuple[pd.DataFrame, pd.DataFrame]:
        is_first = np.asarray(self.first(records), dtype=bool)
        is_then = np.asarray(self.then(records), dtype=bool)
        counted = is_first | is_then
        times = (records[EVENT_TIME].astype("int64").to_numpy() // 1_000_000)[counted].tolist()
        keys = records[KEY].to_numpy()[counted]
        index = records.index.to_numpy()[counted].tolist()
        kinds = list(zip(is_first[counted].tolist(), is_then[counted].tolist(), strict=True))
        held = _held(state)
        found: list[tuple[Any, str, int, int]] = []
        for n, key in enumerate(keys.tolist()):
            firsts, thens, newest = held.setdefault(key, ([], [], NONE))
            at = times[n]
            if at < newest - self.grace:
                continue  # late for its key
            is_a, is_b = kinds[n]
            if is_b:
                # The earliest first record it can follow: within `within` before it.
                i = bisect_left(firsts, at - self.within)
                if i < len(firsts) and firsts[i] <= at:
                    found.append((index[n], key, firsts.pop(i), at))
                    is_b = False
            if is_a:
                # A late first record: the earliest then record it precedes, held unmatched.
                j = bisect_left(thens, at)
                if j < len(thens) and thens[j] <= at + self.within:
                    found.append((index[n], key, at, thens.pop(j)))
                else:
                    insort_right(firsts, at)
            if is_b:
                insort_right(thens, at)
            newest = max(newest, at)
            earliest = newest - self.grace  # a record not late is at least this
            firsts[:] = firsts[bisect_left(firsts, earliest - self.within) :]
            thens[:] = thens[bisect_left(thens, earliest) :]
            held[key] = (firsts, thens, newest)
        detections = pd.DataFrame(
            {KEY: [f[1] for f in found], FIRST: [f[2] for f in found], THEN: [f[3] for f in found]},
            index=pd.Index([f[0] for f in found], dtype=records.index.dtype),
        )
        # Every key of the batch, counted or not: its expiry is judged by all its records.
        for key in records[KEY].unique().tolist():
            held.setdefault(key, ([], [], NONE))
        return detections, _frame(held)


def _held(state: pd.DataFrame) -> dict[str, tuple[list[int], list[int], int]]:
    if state.empty:
        return {}
    out = {}
    firsts, thens = state["first"].tolist(), state["then"].tolist()
    for key, a, b, newest in zip(state.index.tolist(), firsts, thens, state["newest"].tolist(), strict=True):
        out[key] = (list(a), list(b), int(newest))
    return out


def _frame(held: dict[str, tuple[list[int], list[int], int]]) -> pd.DataFrame:
    rows = list(held.values())
    return pd.DataFrame(
        {
            "first": lists(np.array([x for r in rows for x in r[0]], dtype=np.int64), [len(r[0]) for r in rows]),
            "then": lists(np.array([x for r in rows for x in r[1]], dtype=np.int64), [len(r[1]) for r in rows]),
            "newest": np.array([r[2] for r in rows], dtype=np.int64),
        },
        index=pd.Index(list(held), dtype=object),
    )
