"""Typed state columns: a store's values as NumPy arrays by slot, not as a JSON value per key.

A detector that declares its columns' types (`State(columns={"recent_ms": "list<int64>", ...})`)
gets and returns them as arrays: numbers as NumPy columns, lists as Arrow-backed list columns
(pandas' `.list.flatten()` and `.list.len()`; `lists()` builds one). A batch then reads and writes
its keys' state with array operations, and the JSON the changelog needs is made only when the
changes go to it, once a flush interval, for each key changed in it, not for every key of every
batch. Measured as the reason: decoding and encoding each key's JSON every batch, and the Python
lists a detector walked, were most of what a stateful task cost beyond a stateless one (the
stateful benchmark, per-step CPU per worker); a store of decoded Python values instead kept
hundreds of thousands of small objects alive between tasks, and PySpark's worker collects garbage
after every task.

A list column's rows lie end to end in one array, its pool, each slot's at its own start with room
to grow: a row that outgrows its room moves to the pool's end with twice the room, so a key whose
list grows by a few values a batch moves a few times in all. A busy key's window (thousands of
values) and a quiet key's (a few) cost what they hold, not the longest row's width each, and
every row is copied in and out as one run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

TYPES = {"int64": np.int64, "float64": np.float64, "list<int64>": np.int64, "list<float64>": np.float64}
# The room a row gets at the least when it moves, and a pool's least size.
FIRST_ROOM, FIRST_POOL = 4, 1024


def lists(values: Any, lengths: Any) -> pd.api.extensions.ExtensionArray:
    """A list column from its values end to end and each row's length (what `.list.flatten()` and
    `.list.len()` give back): row i holds the next lengths[i] values. An array, which a DataFrame
    takes in row order (`pd.DataFrame({"recent_ms": lists(v, n)}, index=customers)`)."""
    values = np.asarray(values)
    lengths = np.asarray(lengths, dtype=np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] != len(values):
        raise ValueError(f"lists(): the lengths add up to {int(offsets[-1])}, there are {len(values)} values")
    return pd.arrays.ArrowExtensionArray(pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values)))


class TypeMismatch(ValueError):
    """A value does not fit its column's declared type."""


class TypedColumns:
    """The declared columns of every slot of a store."""

    def __init__(self, types: tuple[tuple[str, str], ...]):
        self.types = dict(types)
        self._scalars: dict[str, np.ndarray] = {}
        self._lists: dict[str, _Lists] = {}
        for name, kind in self.types.items():
            dtype = TYPES[kind]
            if kind.startswith("list<"):
                self._lists[name] = _Lists(dtype)
            else:
                self._scalars[name] = np.zeros(0, dtype=dtype)

    def grow(self, capacity: int) -> None:
        for name, array in self._scalars.items():
            self._scalars[name] = _grown(array, capacity)
        for column in self._lists.values():
            column.grow(capacity)

    # ---- a batch's view ---------------------------------------------------------------------------

    def frame(self, slots: np.ndarray, keys: list[str], index_name: str) -> pd.DataFrame:
        """The slots' values as a DataFrame indexed by `keys`: scalars as NumPy columns, lists as
        Arrow list columns (copies: a detector cannot change the store in place)."""
        index = pd.Index(keys, dtype=object, name=index_name)
        data: dict[str, Any] = {}
        for name in self.types:
            if name in self._scalars:
                data[name] = pd.Series(self._scalars[name][slots], index=index, copy=False)
            else:
                data[name] = pd.Series(lists(*self._gather(name, slots)), index=index, copy=False)
        return pd.DataFrame(data, index=index, copy=False)

    def _gather(self, name: str, slots: np.ndarray, rows: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """(values end to end, each row's length) of a list column's `slots`; `rows`: the compiled
        copies (`compiled_rows`), where numba is loaded."""
        return self._lists[name].gather(slots, rows)

    def take(self, new_state: pd.DataFrame, rows: np.ndarray) -> dict[str, Any]:
        """The `rows` (positions) of what a detector returned, checked against the declared types:
        {column: array} for scalars, {column: (values, lengths)} for lists. Raises TypeMismatch."""
        taken: dict[str, Any] = {}
        for name, kind in self.types.items():
            column = new_state[name]
            if name in self._scalars:
                taken[name] = _scalar(column, kind, name)[rows]
            else:
                values, lengths = _list(column, kind, name)
                if len(rows) == len(lengths) and np.array_equal(rows, np.arange(len(rows))):
                    taken[name] = (values, lengths)  # every row, in order: the usual answer
                    continue
                starts = np.zeros(len(lengths) + 1, dtype=np.int64)
                np.cumsum(lengths, out=starts[1:])
                chosen = lengths[rows]
                # Each chosen row's values, in row order: a run per row, from its start.
                flat = np.repeat(starts[:-1][rows] - np.concatenate(([0], np.cumsum(chosen)[:-1])), chosen) + np.arange(int(chosen.sum()))
                taken[name] = (values[flat], chosen)
        return taken

    def put(self, slots: np.ndarray, taken: dict[str, Any], rows: Any = None) -> np.ndarray:
        """`take`'s values into `slots`; returns each slot's size in bytes. `rows`: as `_gather`'s."""
        sizes = np.full(len(slots), 8 * len(self._scalars), dtype=np.int64)
        for name, values in taken.items():
            if name in self._scalars:
                self._scalars[name][slots] = values
                continue
            values, lengths = values
            self._put_list(name, slots, values, lengths, rows)
            sizes += 8 * lengths
        return sizes

    def _put_list(self, name: str, slots: np.ndarray, values: np.ndarray, lengths: np.ndarray, rows: Any = None) -> None:
        self._lists[name].put(slots, values, lengths, rows)

    def free(self, slot: int) -> None:
        """A slot let go: its rows' room is given up."""
        for column in self._lists.values():
            column.free(slot)

    def save(self, slots: np.ndarray) -> dict[str, Any]:
        """The slots' values as they are (copies), for `load` to put back."""
        saved: dict[str, Any] = {name: array[slots] for name, array in self._scalars.items()}
        for name in self._lists:
            saved[name] = self._gather(name, slots)
        return saved

    def load(self, slots: np.ndarray, saved: dict[str, Any]) -> np.ndarray:
        """What `save` took, back into `slots` (the same keys', perhaps other slots); returns each
        slot's size in bytes."""
        sizes = np.full(len(slots), 8 * len(self._scalars), dtype=np.int64)
        for name, values in saved.items():
            if name in self._scalars:
                self._scalars[name][slots] = values
                continue
            flat, lengths = values
            self._put_list(name, slots, flat, lengths)
            sizes += 8 * lengths
        return sizes

    # ---- JSON, for the changelog -------------------------------------------------------------------

    def gathered(self, slots: np.ndarray, rows: Any = None) -> dict[str, np.ndarray | tuple[np.ndarray, np.ndarray]]:
        """The slots' values by column, in the declared order: a scalar column's array, a list
        column's (values end to end, each slot's length); what the changelog's encoder takes.
        `rows`: as `_gather`'s."""
        return {name: self._scalars[name][slots] if name in self._scalars else self._gather(name, slots, rows) for name in self.types}

    def rows(self, slots: np.ndarray) -> list[dict[str, Any]]:
        """The slots' values as JSON values (NaN as None), for tests and a key's timer."""
        columns: dict[str, list[Any]] = {}
        for name, data in self.gathered(slots).items():
            if not isinstance(data, tuple):
                missing = np.isnan(data) if data.dtype.kind == "f" else None
                if missing is not None and missing.any():
                    data = data.astype(object)
                    data[missing] = None
                columns[name] = data.tolist()
            else:
                flat, lengths = data
                flat = flat.tolist()
                ends = np.cumsum(lengths)
                columns[name] = [flat[a:b] for a, b in zip((ends - lengths).tolist(), ends.tolist(), strict=True)]
        if len(columns) == 1:
            ((c, values),) = columns.items()
            return [{c: v} for v in values]
        if len(columns) == 2:
            (c, values), (d, others) = columns.items()
            return [{c: v, d: w} for v, w in zip(values, others, strict=True)]
        names = list(columns)
        return [dict(zip(names, row, strict=True)) for row in zip(*columns.values(), strict=True)]

    def from_rows(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        """`take`'s form of JSON-decoded states (a restore). Raises TypeMismatch."""
        taken: dict[str, Any] = {}
        for name, kind in self.types.items():
            values = [s[name] for s in states]
            if name in self._scalars:
                taken[name] = _scalar(pd.Series(values, dtype=object), kind, name)
            else:
                taken[name] = _list(pd.Series(values, dtype=object), kind, name)
        return taken


class _Lists:
    """A list column's rows: each slot's `length[slot]` values from `start[slot]` of `pool`, with
    room for `room[slot]`. Room given up (a row that moved, a slot freed) is left behind until the
    pool is full, and then the rows are packed into a new pool: what it holds stays in proportion
    to what its rows hold."""

    def __init__(self, dtype: Any) -> None:
        self.pool = np.zeros(0, dtype=dtype)
        self.start = np.zeros(0, dtype=np.int64)
        self.room = np.zeros(0, dtype=np.int64)
        self.length = np.zeros(0, dtype=np.int64)
        self.top = 0  # the pool's end in use

    @property
    def left(self) -> int:
        """Room below the top that no row has."""
        return self.top - int(self.room.sum())

    def grow(self, capacity: int) -> None:
        self.start, self.room, self.length = _grown(self.start, capacity), _grown(self.room, capacity), _grown(self.length, capacity)

    def gather(self, slots: np.ndarray, rows: Any = None) -> tuple[np.ndarray, np.ndarray]:
        lengths = self.length[slots]
        starts = self.start[slots]
        if rows is not None:
            values = np.empty(int(lengths.sum()), dtype=self.pool.dtype)
            rows.gather(self.pool, starts, lengths, values)
            return values, lengths
        return self.pool[_places(starts, lengths)], lengths

    def put(self, slots: np.ndarray, values: np.ndarray, lengths: np.ndarray, rows: Any = None) -> None:
        """Rows into `slots` (distinct): in place where they fit their room, else moved to the end."""
        moving = lengths > self.room[slots]
        # Their new lengths first: a packing below gives each row room for what it is about to hold.
        self.length[slots] = lengths
        if moving.any():
            moved = slots[moving]
            self.room[moved] = 0  # their old rows are not kept: these rows replace them
            need = np.maximum(2 * lengths[moving], FIRST_ROOM)
            total = int(need.sum())
            if self.top + total > len(self.pool):
                self._reserve(total, rows)
            self.start[moved] = self.top + np.cumsum(need) - need
            self.room[moved] = need
            self.top += total
        self._write(self.start[slots], values.astype(self.pool.dtype, copy=False), lengths, rows)

    def free(self, slot: int) -> None:
        self.room[slot] = self.length[slot] = 0

    def _reserve(self, extra: int, rows: Any = None) -> None:
        """A pool with `extra` free after its top: the rows packed into a new one, each with room
        for twice what it holds now (the room that rows gave up, or no longer fill, is not kept),
        and as much again free, so that filling it takes as long as packing took."""
        held = np.flatnonzero(self.room)
        values, lengths = self.gather(held, rows)
        room = np.maximum(2 * lengths, FIRST_ROOM)
        kept = int(room.sum())
        self.pool = np.empty(max(FIRST_POOL, 2 * (kept + extra)), dtype=self.pool.dtype)
        self.start[held] = np.cumsum(room) - room
        self.room[held] = room
        self.top = kept
        self._write(self.start[held], values, lengths, rows)

    def _write(self, starts: np.ndarray, values: np.ndarray, lengths: np.ndarray, rows: Any) -> None:
        if rows is not None:
            rows.scatter(self.pool, starts, values, lengths)
        else:
            self.pool[_places(starts, lengths)] = values


def _places(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Every value's place in an array whose runs start at `starts`, `lengths` long."""
    return np.repeat(starts, lengths) + _within(lengths)


def _within(lengths: np.ndarray) -> np.ndarray:
    """Each value's place in its row, for rows of these lengths end to end: 0, 1, ... per row."""
    return np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)


def _grown(array: np.ndarray, capacity: int) -> np.ndarray:
    bigger = np.zeros((capacity, *array.shape[1:]), dtype=array.dtype)
    bigger[: len(array)] = array
    return bigger


# What pandas infers of an object column that holds numbers only (None too, for float64).
_NUMBERS = frozenset({"integer", "floating", "mixed-integer-float", "empty", "boolean"})


def _scalar(column: pd.Series, kind: str, name: str) -> np.ndarray:
    if column.dtype == object and pd.api.types.infer_dtype(column, skipna=kind == "float64") not in _NUMBERS:
        raise TypeMismatch(f"state column {name!r} is {kind}, and {_sample(column)} is not")
    try:
        if kind == "float64":
            return column.to_numpy(dtype=np.float64, na_value=np.nan)
        array = column.to_numpy()
        if array.dtype.kind in "iub":
            return array.astype(np.int64, copy=False)
        whole = array.astype(np.float64)
    except (TypeError, ValueError):
        raise TypeMismatch(f"state column {name!r} is {kind}, and {_sample(column)} is not") from None
    if np.isnan(whole).any() or (whole != np.round(whole)).any():
        raise TypeMismatch(f"state column {name!r} is int64: every value a whole number, none missing (declare float64 for missing numbers)")
    return whole.astype(np.int64)


def _list(column: pd.Series, kind: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(values end to end, each row's length) of a list column."""
    inner = pa.float64() if kind == "list<float64>" else pa.int64()
    if not len(column):
        return np.zeros(0, dtype=TYPES[kind]), np.zeros(0, dtype=np.int64)
    try:
        array = pa.array(column.array if isinstance(column.dtype, pd.ArrowDtype) else column.to_numpy(dtype=object), from_pandas=True)
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        if not pa.types.is_list(array.type) and not pa.types.is_large_list(array.type):
            if len(array) and array.null_count == len(array):
                raise TypeMismatch(f"state column {name!r} is {kind}: a row needs a list (an empty one for none), not None")
            raise TypeError(array.type)
        if array.null_count:
            raise TypeMismatch(f"state column {name!r} is {kind}: a row needs a list (an empty one for none), not None")
        array = array.cast(pa.large_list(inner))
        values = array.flatten()
        if values.null_count:
            raise TypeMismatch(f"state column {name!r} is {kind}: its lists may not hold None or NaN")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError) as exc:
        raise TypeMismatch(f"state column {name!r} is {kind}, and {_sample(column)} is not ({exc})") from None
    offsets = array.offsets.to_numpy()
    return values.to_numpy(zero_copy_only=False), np.diff(offsets).astype(np.int64)


def _sample(column: pd.Series) -> str:
    return repr(column.iloc[0])[:60] if len(column) else "an empty column"
