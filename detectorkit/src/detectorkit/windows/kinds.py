"""The windows a key's records fall into, over event time in epoch milliseconds."""

from __future__ import annotations

import dataclasses

import numpy as np


class _Sized:
    """A window of `seconds`: a record may land in it until it is that old (and the grace)."""

    seconds: float

    @property
    def reach_seconds(self) -> float:
        return self.seconds


@dataclasses.dataclass(frozen=True)
class Tumbling(_Sized):
    """Back to back: [k*size, (k+1)*size)."""

    seconds: float
    grace_seconds: float = 0.0

    def spans(self, t: int) -> list[tuple[int, int]]:
        size = ms(self.seconds)
        start = t // size * size
        return [(start, start + size)]


@dataclasses.dataclass(frozen=True)
class Hopping(_Sized):
    """Of `seconds`, one starting every `hop_seconds`."""

    seconds: float
    hop_seconds: float
    grace_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.hop_seconds <= self.seconds:
            raise ValueError("Hopping(seconds, hop_seconds) needs 0 < hop_seconds <= seconds")

    def spans(self, t: int) -> list[tuple[int, int]]:
        size, hop = ms(self.seconds), ms(self.hop_seconds)
        last = t // hop * hop
        return [(start, start + size) for start in range(last, t - size, -hop)][::-1]


@dataclasses.dataclass(frozen=True)
class Sliding(_Sized):
    """At each record, the `seconds` up to it, both ends in: [t - size, t]."""

    seconds: float
    grace_seconds: float = 0.0

    def spans(self, t: int) -> list[tuple[int, int]]:
        return [(t - ms(self.seconds), t)]


@dataclasses.dataclass(frozen=True)
class Session:
    """A key's records less than `gap_seconds` apart, one after another: a gap of `gap_seconds` or
    more ends a session. Its start and end are its first and last record's times."""

    gap_seconds: float
    grace_seconds: float = 0.0

    def __post_init__(self) -> None:
        ms(self.gap_seconds)

    @property
    def gap_ms(self) -> int:
        return ms(self.gap_seconds)

    @property
    def reach_seconds(self) -> float:
        # A record may still join a session until its last record is a gap old.
        return self.gap_seconds

    def sessions(self, times: np.ndarray) -> list[tuple[int, int]]:
        """The (first, last) of each session of these times, oldest first."""
        if not len(times):
            return []
        ordered = np.sort(times)
        breaks = np.flatnonzero(np.diff(ordered) >= self.gap_ms)
        firsts = np.concatenate([[0], breaks + 1])
        lasts = np.concatenate([breaks, [len(ordered) - 1]])
        return list(zip(ordered[firsts].tolist(), ordered[lasts].tolist(), strict=True))


Window = Tumbling | Hopping | Sliding | Session


def ms(seconds: float) -> int:
    value = int(round(seconds * 1000))
    if value <= 0:
        raise ValueError(f"a window's length must be above 0 s, not {seconds}")
    return value


def ms_or_zero(seconds: float) -> int:
    return int(round(seconds * 1000)) if seconds > 0 else 0


def members(window: Window, times: np.ndarray, span: tuple[int, int]) -> np.ndarray:
    start, end = span
    # A sliding window and a session hold both ends; the others their start only.
    if isinstance(window, Sliding | Session):
        return (times >= start) & (times <= end)
    return (times >= start) & (times < end)
