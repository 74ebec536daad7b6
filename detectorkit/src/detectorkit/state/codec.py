"""A key's state as a changelog record, and back.

The record's value is JSON: the state's columns, the key's event time (`seen_ms`, for the TTL) and
its timer, if any. A header names the input offset the change reflects (the end of the batch that
made it): a restore skips changes past the group's committed offset, so state and offsets agree
after a crash (as Quix Streams' `__processed_tp_offsets__`). A deleted key is a tombstone.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from detectorkit.state.declaration import State, StateSchemaError

INPUT_OFFSET_HEADER = "input_offset"


@dataclass
class Entry:
    """One key's state in a store: its changelog value, decoded afresh on every read, so a detector
    sees exactly what a restore would give it (JSON's types), and cannot change the store in place."""

    value: bytes
    seen_ms: int  # newest event time of the key's records
    tag: int  # the input offset (batch end) of the change that wrote it
    timer_ms: int | None = None


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"state values must be JSON types (numbers, strings, booleans, None, lists, dicts), not {type(value).__name__}")


def encode(values: dict[str, Any], seen_ms: int, timer_ms: int | None = None) -> bytes:
    # pandas holds a missing value of a numeric column as NaN: it is None (JSON null) again here,
    # and any other NaN or infinity is refused (it is no JSON).
    plain = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in values.items()}
    body = {"state": plain, "seen_ms": seen_ms}
    if timer_ms is not None:
        body["timer_ms"] = timer_ms
    try:
        return json.dumps(body, default=_plain, separators=(",", ":"), allow_nan=False).encode()
    except ValueError as exc:
        raise ValueError(f"state values must be JSON: {exc} (NaN and infinity inside a list or dict are not)") from None


def decode(value: bytes, state: State, where: str) -> tuple[dict[str, Any], int, int | None]:
    """(values, seen_ms, timer_ms) of a changelog value; StateSchemaError when it is not the declared shape."""
    try:
        body = json.loads(value)
        values = body["state"]
        seen = int(body["seen_ms"])
    except (ValueError, KeyError, TypeError) as exc:
        raise StateSchemaError(f"{where} holds a value that is not detectorkit state ({exc}); {_ADVICE}") from None
    if not isinstance(values, dict) or set(values) != set(state.columns):
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
