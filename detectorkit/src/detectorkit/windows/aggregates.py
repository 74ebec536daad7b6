"""What a window computes over its records, and when a window detector emits it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar


@dataclasses.dataclass(frozen=True)
class _Aggregate:
    """Of a field of the window's records (`field`), named `name` in the detection."""

    field: str | None = None
    name: str = ""
    kind: ClassVar[str]

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.kind)


class Count(_Aggregate):
    """How many records the window holds (which records count: the rule's `where`)."""

    kind = "count"

    def __post_init__(self) -> None:
        if self.field is not None:
            raise TypeError("Count() counts records and takes no field: pick the records with where=...")
        super().__post_init__()


class Sum(_Aggregate):
    """The total of `field` over the window's records, exact (math.fsum's partials): the same whatever
    order the records came in and however many left a sliding window."""

    kind = "sum"


class Min(_Aggregate):
    """The smallest value of `field` among the window's records."""

    kind = "min"


class Max(_Aggregate):
    """The largest value of `field` among the window's records."""

    kind = "max"


class Mean(_Aggregate):
    """The mean of `field` over the window's records (its sum over its count)."""

    kind = "mean"


class Last(_Aggregate):
    """The value of `field` in the window's newest record (of records at one time, the one that
    came last): with Every, the record's own, beside its window's other aggregates."""

    kind = "last"


class DistinctCount(_Aggregate):
    """How many distinct values of `field` (any type: compared by a 53-bit hash of their text)."""

    kind = "distinct"


Aggregate = Count | Sum | Min | Max | Mean | DistinctCount | Last


# How a rule's windows become detections: per window, or per episode (a run of windows that
# satisfy the condition, each starting no later than the one before ends).
PER = ("window", "episode")


def _check_per(per: str) -> None:
    if per not in PER:
        raise ValueError(f"per must be 'window' or 'episode', not {per!r}")


@dataclasses.dataclass(frozen=True)
class Every:
    """A detection for each counted record, with its window's aggregates, where `having` holds."""

    having: Callable[..., Any] | None = None


@dataclasses.dataclass(frozen=True)
class When:
    """One detection when a window first satisfies `having` (a function of a frame of windows, one
    row each: key, window_start_ms, window_end_ms and the aggregates; or of it and the config).
    per="episode": one per episode of windows that satisfy it once closed, when the episode is over."""

    having: Callable[..., Any]
    per: str = "window"

    def __post_init__(self) -> None:
        _check_per(self.per)


@dataclasses.dataclass(frozen=True)
class AtLeast:
    """One detection when a window's aggregate (`of`, by name: the only one if not given) first
    reaches `threshold`; per="episode" as `When`'s."""

    threshold: float
    of: str | None = None
    per: str = "window"

    def __post_init__(self) -> None:
        _check_per(self.per)


@dataclasses.dataclass(frozen=True)
class Final:
    """One detection per window once it closes, where `having` holds: when the partition's event
    time reaches its end and grace (a session's: its last record, the gap and the grace). Its
    aggregates are over the records that reached it by then. per="episode" as `When`'s."""

    having: Callable[..., Any] | None = None
    per: str = "window"

    def __post_init__(self) -> None:
        _check_per(self.per)


@dataclasses.dataclass(frozen=True)
class Silent:
    """For sliding windows: a key's window, where `having` holds, once the key has been silent
    for `seconds` after it (no record within `seconds` of the window's end, which is its record):
    "at least 3 records in an hour, then half an hour without one" is
    `Sliding(3600)`, `Count()`, `Silent(1800, having=lambda w: w["count"] >= 3)`."""

    seconds: float
    having: Callable[..., Any] | None = None


Emit = Every | When | AtLeast | Final | Silent
