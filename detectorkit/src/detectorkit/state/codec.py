"""A key's state as a changelog record, and back.

The record's value is JSON (orjson: a tenth of the standard library's time, which a store spends
once per key a batch touches): the state's columns, the key's event time (`seen_ms`, for the TTL) and
its timer, if any. A header names the input offset the change reflects (the end of the batch that
made it): a restore skips changes past the group's committed offset, so state and offsets agree
after a crash (as Quix Streams' `__processed_tp_offsets__`). A deleted key is a tombstone.
"""

from __future__ import annotations

from typing import Any

import orjson

from detectorkit.state.declaration import State, StateSchemaError

INPUT_OFFSET_HEADER = "input_offset"

# NumPy's scalars and arrays (a pandas column's values) are written as the numbers and lists they
# hold; datetimes and dataclasses go to `_refuse`: read back they would be strings and dicts, and a
# detector would see another type after a restore than before it.
_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS


def _refuse(value: Any) -> Any:
    raise TypeError(f"state values must be JSON types (numbers, strings, booleans, None, lists, dicts), not {type(value).__name__}")


def encode(values: dict[str, Any], seen_ms: int, timer_ms: int | None = None) -> bytes:
    """A key's changelog value. JSON has no NaN or infinity: they are written as null (pandas holds
    a missing number as NaN, and None is what reads back)."""
    body = {"state": values, "seen_ms": seen_ms}
    if timer_ms is not None:
        body["timer_ms"] = timer_ms
    try:
        return orjson.dumps(body, default=_refuse, option=_OPTIONS)
    except orjson.JSONEncodeError as exc:
        raise TypeError(f"state values must be JSON types (numbers, strings, booleans, None, lists, dicts): {exc}") from None


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
        raise StateSchemaError(f"{where} holds a value that is not detectorkit state ({exc}); {_ADVICE}") from None
    if not isinstance(values, dict) or values.keys() != state.column_set:
        found = sorted(values) if isinstance(values, dict) else type(values).__name__
        raise StateSchemaError(f"{where} holds state with columns {found}, the detector declares {sorted(state.columns)}; {_ADVICE}")
    return values, seen, body.get("timer_ms")


_ADVICE = (
    "the state's shape changed since it was written. Deploy the version that wrote it, or give the "
    "State a new name (State(name=...)) to start from empty state in a new changelog topic"
)


def tag_of(headers: list[tuple[str, bytes]] | None) -> int | None:
    for name, value in headers or ():
        if name == INPUT_OFFSET_HEADER:
            return int(value)
    return None
