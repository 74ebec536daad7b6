"""Turning raw Kafka values into the records a detector sees, and the reasons a record is refused."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

# Dead-letter reasons: the `error_type` header and the metrics label.
MALFORMED_JSON = "malformed_json"
NOT_AN_OBJECT = "not_an_object"
MISSING_FIELD = "missing_field"
DETECTOR_ERROR = "detector_error"
REASONS = (MALFORMED_JSON, NOT_AN_OBJECT, MISSING_FIELD, DETECTOR_ERROR)


@dataclass(frozen=True)
class Rejected:
    position: int  # the record's row in its Arrow batch
    reason: str
    message: str


def parse(values: Sequence[bytes | None], required_fields: Sequence[str]) -> tuple[pd.DataFrame, list[Rejected]]:
    """Parse JSON objects; the DataFrame's index is each record's position in `values`."""
    rows = []
    positions = []
    rejected = []
    for position, value in enumerate(values):
        try:
            record = json.loads(value) if value is not None else None
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            rejected.append(Rejected(position, MALFORMED_JSON, f"value is not JSON: {exc}"))
            continue
        if not isinstance(record, dict):
            rejected.append(Rejected(position, NOT_AN_OBJECT, f"value is JSON {type(record).__name__}, not an object"))
            continue
        missing = [f for f in required_fields if record.get(f) is None]
        if missing:
            rejected.append(Rejected(position, MISSING_FIELD, f"record has no value for {', '.join(missing)}"))
            continue
        rows.append(record)
        positions.append(position)
    frame = pd.DataFrame.from_records(rows, index=positions) if rows else pd.DataFrame(index=pd.Index([], dtype="int64"))
    return frame, rejected
