"""A key's state as a changelog record, and back.

The record's value is JSON (orjson: a tenth of the standard library's time, which a store spends
once per key a batch touches): the state's columns, the key's event time (`seen_ms`, for the TTL) and
its timer, if any, after the input offset the change reflects (`tag`: the end of the batch that
made it): a restore skips changes past the group's committed offset, so state and offsets agree
after a crash (as Quix Streams' `__processed_tp_offsets__`). A deleted key is a tombstone, and it
and the partition's event time carry the offset in a header instead.

The offset is the value's first field rather than a header so that a batch's changes go to the
producer in one call (librdkafka's produce_batch takes no headers): one produce() with headers cost
1.6-1.7 µs a record, a batch 0.6-0.8 (80,000 changelog records, Apache Kafka, this machine), and a
task writes one per key it touched. A restore reads the offset from the value's first bytes, or from
the header of a record written before (or of a tombstone).
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import repeat
from typing import Any

import numpy as np
import orjson

from detectorkit.state.declaration import State, StateSchemaError

INPUT_OFFSET_HEADER = "input_offset"
# How a value that carries its input offset begins (orjson writes a dict's keys in order, no spaces).
TAGGED = b'{"tag":'

# NumPy's scalars and arrays (a pandas column's values) are written as the numbers and lists they
# hold; datetimes and dataclasses go to `_refuse`: read back they would be strings and dicts, and a
# detector would see another type after a restore than before it.
_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS


def _refuse(value: Any) -> Any:
    raise TypeError(f"state values must be JSON types (numbers, strings, booleans, None, lists, dicts), not {type(value).__name__}")


def encode(values: dict[str, Any], seen_ms: int, timer_ms: int | None = None, tag: int | None = None) -> bytes:
    """A key's changelog value, made by the batch ending at input offset `tag`. JSON has no NaN or
    infinity: they are written as null (pandas holds a missing number as NaN, and None is what
    reads back)."""
    return encode_many([values], [seen_ms], [timer_ms], tag)[0]


def encode_many(
    states: Iterable[dict[str, Any]],
    seen_ms: Iterable[int],
    timer_ms: Iterable[int | None],
    tag: int | None = None,
    tags: Iterable[int] | None = None,
) -> list[bytes]:
    """`encode` of many keys (one loop: a batch writes thousands); `tags`: each key's own tag."""
    dumps, join, out = orjson.dumps, b"".join, []
    states = list(states)
    tags = repeat(tag, len(states)) if tags is None else tags
    try:
        for values, seen, timer, tag in zip(states, seen_ms, timer_ms, tags, strict=True):
            body = {"state": values, "seen_ms": seen} if tag is None else {"tag": tag, "state": values, "seen_ms": seen}
            if timer is not None:
                body["timer_ms"] = timer
            # A copy of the right size: orjson (>= 3.12) returns its whole 4 KiB output buffer, and
            # the store keeps the value (home-assistant/core#181240). Kept as is, a store of 100,000
            # keys held 400 MiB, and the page faults made encoding 1.7 µs a key instead of 0.2.
            out.append(join((dumps(body, default=_refuse, option=_OPTIONS), b"")))
    except orjson.JSONEncodeError as exc:
        raise TypeError(f"state values must be JSON types (numbers, strings, booleans, None, lists, dicts): {exc}") from None
    return out


def encode_columns(
    columns: dict[str, np.ndarray | tuple[np.ndarray, np.ndarray]],
    seen_ms: np.ndarray,
    timer_ms: np.ndarray,
    tags: np.ndarray,
    no_timer: int,
    rows: Any = None,
) -> list[bytes]:
    """`encode_many` of typed state, byte for byte, from its columns: a scalar column as an array
    (one value per key), a list column as (values end to end, each key's length). Each column is
    written by orjson once; every key's value is then gathered from those texts as byte ranges, all
    keys at once. A flush writes every key a flush interval changed, and a dict and an orjson call
    per key were most of its cost. `rows`: the compiled copies (`compiled_rows`), where numba is
    loaded."""
    count = len(seen_ms)
    if not count:
        return []
    timed = timer_ms != no_timer
    pieces = _Pieces()
    pieces.number(tags, b'{"tag":')
    for n, (name, data) in enumerate(columns.items()):
        lead = (b',"state":{' if n == 0 else b",") + orjson.dumps(name) + b":"
        if isinstance(data, tuple):
            pieces.list(*data, lead)
        else:
            pieces.number(data, lead)
    pieces.number(seen_ms, b'},"seen_ms":' if columns else b',"state":{},"seen_ms":')
    pieces.number(timer_ms, b',"timer_ms":', present=timed)
    pieces.constant(b"}", count)
    return pieces.joined(count, rows)


class _Pieces:
    """Each key's value as byte ranges of a few texts (orjson's of a whole column, and constants),
    in order: ranges[i] is (start, length) per key, into `texts` joined end to end."""

    def __init__(self) -> None:
        self.texts: list[bytes] = []
        self.size = 0
        self.ranges: list[tuple[np.ndarray, np.ndarray]] = []

    def _text(self, text: bytes) -> int:
        at = self.size
        self.texts.append(text)
        self.size += len(text)
        return at

    def constant(self, text: bytes, count: int, present: np.ndarray | None = None) -> None:
        at = self._text(text)
        length = np.full(count, len(text), dtype=np.int64)
        if present is not None:
            length[~present] = 0
        self.ranges.append((np.full(count, at, dtype=np.int64), length))

    def _values(self, values: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
        """Where orjson's text of the values starts, and each value's start and end in it: numbers
        and nulls hold no comma, so the commas are the boundaries."""
        text = orjson.dumps(np.ascontiguousarray(values), option=_OPTIONS)[1:-1]
        at = self._text(text)
        commas = np.flatnonzero(np.frombuffer(text, dtype=np.uint8) == ord(","))
        return at, np.concatenate([[0], commas + 1]), np.concatenate([commas, [len(text)]])

    def number(self, values: np.ndarray, lead: bytes, present: np.ndarray | None = None) -> None:
        self.constant(lead, len(values), present)
        at, begins, ends = self._values(values)
        length = ends - begins
        if present is not None:
            length[~present] = 0
        self.ranges.append((at + begins, length))

    def list(self, flat: np.ndarray, lengths: np.ndarray, lead: bytes) -> None:
        count = len(lengths)
        self.constant(lead + b"[", count)
        if len(flat):
            at, begins, ends = self._values(flat)
            last = np.cumsum(lengths)
            first = last - lengths
            some = lengths > 0
            start = np.where(some, at + begins[np.minimum(first, len(flat) - 1)], 0)
            end = np.where(some, at + ends[np.maximum(last - 1, 0)], 0)
            self.ranges.append((start, end - start))
        self.constant(b"]", count)

    def joined(self, count: int, rows: Any = None) -> list[bytes]:
        source = np.frombuffer(b"".join(self.texts), dtype=np.uint8)
        starts = np.stack([s for s, _ in self.ranges], axis=1).ravel()  # key by key, piece by piece
        lengths = np.stack([n for _, n in self.ranges], axis=1).ravel()
        ends = np.cumsum(lengths.reshape(count, -1).sum(axis=1))
        if rows is not None:
            out = np.empty(int(ends[-1]), dtype=np.uint8)
            rows.gather(source, starts, lengths, out)
            gathered = out.tobytes()
        else:
            some = lengths > 0
            starts, lengths = starts[some], lengths[some]
            # Each output byte's place in the source: one past the byte before's, except where a
            # piece begins (a running sum of those steps, narrow where the source allows).
            step = np.ones(int(ends[-1]), dtype=np.int32 if len(source) < 2**31 else np.int64)
            begins = np.cumsum(lengths) - lengths
            step[begins[1:]] = starts[1:] - (starts[:-1] + lengths[:-1]) + 1
            step[0] = starts[0]
            gathered = source[np.cumsum(step, dtype=step.dtype)].tobytes()
        return [gathered[a:b] for a, b in zip(np.concatenate([[0], ends[:-1]]).tolist(), ends.tolist(), strict=True)]


def state_of(value: bytes) -> dict[str, Any]:
    """The state's columns of a value this process wrote or `decode` accepted."""
    return orjson.loads(value)["state"]


def decode(value: bytes, state: State, where: str) -> tuple[dict[str, Any], int, int | None]:
    """(values, seen_ms, timer_ms) of a changelog value; StateSchemaError when it is not the declared shape."""
    try:
        body = orjson.loads(value)
        values = body["state"]
        seen = int(body["seen_ms"])
    except (ValueError, KeyError, TypeError) as exc:
        raise StateSchemaError(f"{where} holds a value that is not detectorkit state ({exc}); {ADVICE}") from None
    if not isinstance(values, dict) or values.keys() != state.column_set:
        found = sorted(values) if isinstance(values, dict) else type(values).__name__
        raise StateSchemaError(f"{where} holds state with columns {found}, the detector declares {sorted(state.columns)}; {ADVICE}")
    return values, seen, body.get("timer_ms")


def decode_many(values: Iterable[bytes], state: State, where: str) -> tuple[list[dict[str, Any]], list[int], list[int | None]]:
    """(states, seen_ms, timer_ms) of each changelog value, each checked as `decode` does (a restore
    reads every key of a partition: one loop, not a call per value)."""
    loads, columns = orjson.loads, state.column_set
    states: list[dict[str, Any]] = []
    seens: list[int] = []
    timers: list[int | None] = []
    for value in values:
        try:
            body = loads(value)
            ok = body["state"].keys() == columns
            states.append(body["state"])
            seens.append(int(body["seen_ms"]))
            timers.append(body.get("timer_ms"))
        except (ValueError, KeyError, TypeError, AttributeError):
            ok = False
        if not ok:
            decode(value, state, where)  # raises, saying what is wrong
            raise AssertionError("unreachable: decode accepted what decode_many refused")
    return states, seens, timers


ADVICE = (
    "the state's shape changed since it was written. Deploy the version that wrote it, or give the "
    "State a new name (State(name=...)) to start from empty state in a new changelog topic"
)


def tag_of(headers: list[tuple[str, bytes]] | None, value: bytes | None = None) -> int | None:
    """The input offset a changelog record reflects: its header's, else its value's first field."""
    for name, header in headers or ():
        if name == INPUT_OFFSET_HEADER:
            return int(header)
    if value is not None and value.startswith(TAGGED):
        return int(value[len(TAGGED) : value.index(b",", len(TAGGED))])
    return None


def carries_tag(value: bytes | None) -> bool:
    return value is not None and value.startswith(TAGGED)
