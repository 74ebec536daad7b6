"""What a stateful detector declares, and the checks on what its function returns.

    STATE = State(columns=("recent_ms", "flagged_ms"), ttl_seconds=3600)

    def detect(records: pd.DataFrame, state: pd.DataFrame, config: Config) -> tuple[pd.DataFrame, pd.DataFrame]:
        ...
        return detections, new_state

`records` carries two columns the runtime adds: `key`, the record's Kafka key (the customer, as the
normaliser writes it), and `event_time`, its Kafka timestamp (the record's own time, as the
normaliser writes it). `state` holds one row per key of the batch that has state, indexed by key,
with the declared columns. The function returns its detections (indexed by the record each came
from, as a stateless detector's) and the new state of the batch's keys, indexed by key. A key of the
batch it leaves out keeps the state it had; a row whose every value is missing (NaN, None, NA)
deletes its key: `pd.concat([new_state, STATE.deleted(gone)])`. Why not the other way round: a
detector that filters its records first (a customer's failed logins) and returns state only for the
keys it kept would make the others (a batch of that customer's successful logins) forget, and
whether it did would depend on where batches split. Values are JSON types (numbers, strings,
booleans, None, lists and dicts of them): they travel through the changelog and must read back the
same. JSON has no NaN or infinity: they read back as None (pandas' missing number, NaN, is None
again); so a row returned to be kept needs a value that is not missing.

Typed columns: `State(columns={"recent_ms": "list<int64>", "flagged_ms": "float64"})` declares
each column's type (int64, float64 with NaN for missing, list<int64>, list<float64>). The detector
then gets numbers as NumPy columns and lists as Arrow list columns (`state["recent_ms"].list.flatten()`,
`.list.len()`; `detectorkit.state.lists(values, lengths)` builds one to return), and the store keeps
them as arrays: no JSON per key and batch, which is most of what untyped state costs (see
`state/columns.py`). A value that does not fit its type is refused like a value that is not JSON.
The changelog holds the same JSON either way, so a State can gain types after a redeploy.

Timers: `detect` may return a third value, a Series of times indexed like the records (one per
record at most): the record's key's timer after that record (NaT clears it; a record left out
changes nothing; a key's last record with one wins). A timer fires once the partition's event time
(its newest record time) reaches it: `on_timer(fired, config) -> (detections, new_state[, timers])`
gets the state of the keys whose timers fired, indexed by key, with a `deadline` column, and returns
detections and timers indexed by key; its new state follows the same rule (a fired key left out
keeps its state, `STATE.deleted(keys)` forgets them). A key may have several detections (several
rows); a detection's time, its Kafka timestamp and what identifies it downstream, is its `deadline`
column if it returns one, else the timer's. A fired timer is spent: on_timer re-arms it by returning
one, later than the deadline it fired at (one at or before it would fire for ever, and is refused: a
dead letter). A timer needs its key to have state after the call: one set on a key it deletes is
refused. A key with a pending timer is kept past its TTL until the timer fires. That is how a detector flags what did not happen ("a customer who paid
every hour went silent for 3 hours"). A partition that gets no records at all for
TIMER_IDLE_GRACE_SECONDS has its event time moved to the wall clock minus that grace, so its timers
fire without records (a processing-time fallback: only there may a replay answer differently).

State is keyed by the Kafka key, never by a field: the key decides the partition, and a partition's
state lives with the task that reads it, so keying by a field the partitioner did not use would
split a key's state across partitions (and instances). Key the records upstream instead (the
normaliser keys by customer).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import warnings
from collections.abc import Mapping

import numpy as np
import pandas as pd
import pyarrow as pa

from detectorkit.settings import check_topic_name
from detectorkit.state.columns import TYPES, TypedColumns

# Columns the runtime adds to the records a stateful detector sees, and to the keys whose timers fired.
KEY, EVENT_TIME, DEADLINE = "key", "event_time", "deadline"
# The partition's event time at each record (and at a firing), for a detector that sees it.
PARTITION_TIME = "partition_time"
_NO_SLOTS = np.zeros(0, dtype=np.intp)
_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


class StateSchemaError(ValueError):
    """The changelog holds state of another shape than the detector declares (changed after a redeploy)."""


@dataclasses.dataclass(frozen=True)
class State:
    """Per-key state of a detector.

    columns: the state's columns (a key's state is one row): names (values of any JSON type), or
        {name: type} with types from int64, float64, list<int64>, list<float64> (typed: arrays).
    ttl_seconds: a key unseen for longer than this, in event time, is dropped; None keeps keys until
        the detector drops them. Event time is the partition's newest record time.
    name: names the changelog topic (`<consumer group>.<name>`); a new name starts from empty state,
        the way to throw state away on purpose after its shape changed.
    """

    columns: tuple[str, ...]
    ttl_seconds: float | None = None
    name: str = "state"
    # ((name, type), ...) of typed columns, None when untyped: set from `columns`.
    types: tuple[tuple[str, str], ...] | None = dataclasses.field(default=None, init=False)

    def __post_init__(self) -> None:
        if isinstance(self.columns, Mapping):
            wrong = {c: t for c, t in self.columns.items() if t not in TYPES}
            if wrong:
                raise ValueError(f"State(columns=...) types must be one of {', '.join(TYPES)}, not {wrong!r}")
            object.__setattr__(self, "types", tuple(self.columns.items()))
        object.__setattr__(self, "columns", tuple(self.columns))
        if not self.columns or len(set(self.columns)) != len(self.columns) or not all(isinstance(c, str) and c for c in self.columns):
            raise ValueError(f"State(columns=...) needs distinct, non-empty column names, not {self.columns!r}")
        if self.ttl_seconds is not None and self.ttl_seconds <= 0:
            raise ValueError(f"State(ttl_seconds=...) must be positive or None, not {self.ttl_seconds!r}")
        if not _NAME.match(self.name):
            raise ValueError(f"State(name=...) may use only letters, digits, '.', '_' and '-', not {self.name!r}")

    @functools.cached_property
    def column_set(self) -> frozenset[str]:
        return frozenset(self.columns)

    @property
    def ttl_ms(self) -> int | None:
        return None if self.ttl_seconds is None else int(self.ttl_seconds * 1000)

    def changelog_topic(self, consumer_group: str) -> str:
        return check_topic_name(f"{consumer_group}.{self.name}")

    def empty(self) -> pd.DataFrame:
        """No rows: as a new state, it changes nothing (every key of the batch keeps its state)."""
        if self.types:
            return TypedColumns(self.types).frame(_NO_SLOTS, [], KEY)
        return pd.DataFrame(columns=list(self.columns), index=pd.Index([], dtype=object, name=KEY))

    def deleted(self, keys: object) -> pd.DataFrame:
        """Rows that delete `keys`' state, every value missing, to return as (or with) the new state:
        `pd.concat([new_state, STATE.deleted(gone)])`. Each column's dtype is what concatenates with
        the declared type without changing its values: a list column an Arrow list of nulls, int64
        pandas' nullable Int64 (exact, where NaN would make floats), float64 NaN; an untyped column
        None (object), which keeps any column's values (pandas 2 may warn, FutureWarning, when it
        meets a float or Arrow column: the values are the same either way)."""
        index = pd.Index(list(keys), dtype=object, name=KEY)
        n = len(index)
        if not self.types:
            return pd.DataFrame({c: pd.Series([None] * n, index=index, dtype=object) for c in self.columns}, index=index)
        data = {}
        for name, kind in self.types:
            if kind == "int64":
                dtype = pd.Int64Dtype()
            elif kind == "float64":
                dtype = np.float64
            else:
                dtype = pd.ArrowDtype(pa.large_list(pa.float64() if kind == "list<float64>" else pa.int64()))
            data[name] = pd.Series([None] * n, index=index, dtype=dtype)
        return pd.DataFrame(data, index=index)

    def completed(self, new_state: pd.DataFrame, before: pd.DataFrame | None) -> pd.DataFrame:
        """The new state as the store takes it (`new_state` checked, of keys of the batch): a row whose
        every value is missing deletes its key, so it is dropped (the store deletes a key of the batch
        with no row); a key of `before` (the state the call was given, or some of it) that
        `new_state` leaves out keeps that state. Why: a detector that filters its records first and
        returns state only for the keys it kept would otherwise make the others forget, depending on
        where batches split."""
        answered = new_state.index
        if len(new_state):
            gone = _all_missing(new_state)
            if gone is not None:
                new_state = new_state[~gone]
        if before is None or not len(before):
            return new_state
        left_out = ~before.index.isin(answered)
        if not left_out.all():
            before = before[left_out]
        if not len(before) or not len(new_state):
            return new_state if not len(before) else before
        with warnings.catch_warnings():
            # A column all missing on one side: pandas 2 warns that it will count its dtype in; the
            # store takes either (an object column of the declared type's values, or that type).
            warnings.simplefilter("ignore", FutureWarning)
            return pd.concat([new_state, before[list(new_state.columns)]])

    def check_returned(self, new_state: object, keys: pd.Index) -> pd.DataFrame:
        """The new state as returned, checked: a DataFrame of the declared columns indexed by keys of the batch."""
        if not isinstance(new_state, pd.DataFrame):
            raise TypeError(
                f"a stateful detect() returns (detections, new_state); new_state must be a pandas DataFrame, not {type(new_state).__name__}"
            )
        if set(new_state.columns) != set(self.columns):
            raise ValueError(f"new_state has columns {sorted(map(str, new_state.columns))}, the State declares {sorted(self.columns)}")
        if new_state.index.equals(keys):  # what a detector usually returns: every key of the batch, in its order
            return new_state
        if new_state.index.has_duplicates:
            raise ValueError("new_state has a key twice: one row per key")
        stray = new_state.index.difference(keys)
        if len(stray):
            raise ValueError(f"new_state has keys that are not in the batch: {list(stray[:3])}")
        return new_state


def _all_missing(frame: pd.DataFrame) -> np.ndarray | None:
    """Which rows of `frame` have every value missing (NaN, None, NA); None if none has. The columns
    are looked at cheapest first, and the look stops at the first that leaves no row all missing: a
    column of NumPy integers or booleans (typed int64 state) cannot hold a missing value, a float or
    Arrow column is one vectorised pass, an object column (untyped state) a pass in Python objects."""
    columns = sorted((column for _, column in frame.items()), key=_cost)
    missing = None
    for column in columns:
        if _cost(column) == 0:
            return None
        these = column.isna().to_numpy()
        missing = these if missing is None else missing & these
        if not missing.any():
            return None
    return missing


def _cost(column: pd.Series) -> int:
    dtype = column.dtype
    if isinstance(dtype, np.dtype):
        return 0 if dtype.kind in "iub" else 3 if dtype.kind == "O" else 1
    return 2
