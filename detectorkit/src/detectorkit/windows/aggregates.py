"""What a window computes over its records, and when a window detector emits it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import pandas as pd


@dataclasses.dataclass(frozen=True)
class _Aggregate:
    """Of a field of the window's records (`field`), named `name` in the detection."""

    field: str | None = None
    name: str = ""
    default_name: ClassVar[str]
    reduce: ClassVar[Callable[[np.ndarray], Any]]

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.default_name)

    def of(self, values: np.ndarray) -> float:
        return float(type(self).reduce(values))


class Count(_Aggregate):
    default_name, reduce = "count", len


class Sum(_Aggregate):
    default_name, reduce = "sum", np.sum


class Min(_Aggregate):
    default_name, reduce = "min", np.min


class Max(_Aggregate):
    default_name, reduce = "max", np.max


class Mean(_Aggregate):
    default_name, reduce = "mean", np.mean


class DistinctCount(_Aggregate):
    default_name = "distinct"

    @staticmethod
    def reduce(values: np.ndarray) -> int:
        return len(np.unique(values))


Aggregate = Count | Sum | Min | Max | Mean | DistinctCount


def values_of(aggregate: Aggregate, records: pd.DataFrame) -> np.ndarray:
    """The numbers an aggregate takes of each record; a distinct count takes a hash of any value."""
    if aggregate.field is None:
        return np.zeros(len(records))
    column = records[aggregate.field]
    if isinstance(aggregate, DistinctCount):
        # 53 bits: a float64 holds it exactly, and two of a window's values collide with odds of 1 in 2^53.
        return (pd.util.hash_array(column.astype(str).to_numpy()) >> np.uint64(11)).astype(np.float64)
    return pd.to_numeric(column, errors="raise").to_numpy(dtype=np.float64)


@dataclasses.dataclass(frozen=True)
class Every:
    """A detection for each counted record, with its window's aggregate."""


@dataclasses.dataclass(frozen=True)
class AtLeast:
    """One detection when a window's aggregate first reaches `threshold`."""

    threshold: float


@dataclasses.dataclass(frozen=True)
class Final:
    """One detection per window once it closes: when the partition's event time passes its end and
    grace (a timer). Its aggregate is over the records that reached it by then."""


Emit = Every | AtLeast | Final
