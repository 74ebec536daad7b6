"""Turning raw Kafka values into the records a detector sees, the reasons a record is refused, and
the detections a detector returns for them: what the state, runtime and roles layers share."""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.json as pa_json

# Dead-letter reasons: the `error_type` header and the metrics label.
MALFORMED_JSON = "malformed_json"
NOT_AN_OBJECT = "not_an_object"
MISSING_FIELD = "missing_field"
DETECTOR_ERROR = "detector_error"
BAD_EVENT_TIME = "bad_event_time"
KEY_MISMATCH = "key_mismatch"
# RECORD_FORMAT avro, protobuf or json-schema: not in the Confluent wire format, an unknown schema id,
# or a payload its schema does not read (kafka.schema_registry).
UNDECODABLE = "undecodable"
# A model detector's record whose features are missing or not finite numbers (detectorkit.models).
UNSCORABLE = "unscorable"
REASONS = (MALFORMED_JSON, NOT_AN_OBJECT, MISSING_FIELD, DETECTOR_ERROR, BAD_EVENT_TIME, KEY_MISMATCH, UNDECODABLE, UNSCORABLE)

# One Kafka value as a record (a dict), or Refused: `parse_object` for JSON, a Schema Registry decoder.
Decode = Callable[[bytes | None], dict]


def dead_letter_headers(service: str, reason: str, message: str, topic: str, partition: int, offset: int) -> list[tuple[str, bytes]]:
    """The headers of every dead letter, whoever writes it: why, and where its record was read
    (offset -1: a timer's, which names no input record)."""
    return [
        ("error_type", reason.encode()),
        ("error_message", message.encode(errors="replace")),
        ("source_topic", topic.encode()),
        ("source_partition", str(partition).encode()),
        ("source_offset", str(offset).encode()),
        ("service", service.encode()),
    ]


@dataclass(frozen=True)
class Rejected:
    position: int  # the record's row in its Arrow batch
    reason: str
    message: str
    # A detector's exception: its traceback, for a person to read once (a backtest prints the first).
    detail: str | None = None


def detector_error(position: int, exc: BaseException) -> Rejected:
    """A record the detector raised on: the exception in a line for the dead letter, its traceback
    beside it; a detector that refuses a record (Refused) names the reason itself."""
    if isinstance(exc, Refused):
        return Rejected(position, exc.reason, str(exc)[:2000])
    message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return Rejected(position, DETECTOR_ERROR, message[:2000], "".join(traceback.format_exception(exc))[-8000:])


class Refused(ValueError):
    """Why a record cannot be used; `reason` is its dead-letter reason."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def parse_object(value: bytes | None) -> dict:
    """One Kafka value as a JSON object, or Refused (malformed JSON, or JSON but no object)."""
    try:
        record = json.loads(value) if value is not None else None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise Refused(MALFORMED_JSON, f"value is not JSON: {exc}") from None
    if not isinstance(record, dict):
        raise Refused(NOT_AN_OBJECT, f"value is JSON {type(record).__name__}, not an object")
    return record


def parse(values: Sequence[bytes | None], required_fields: Sequence[str], decode: Decode = parse_object) -> tuple[pd.DataFrame, list[Rejected]]:
    """Decode each value (JSON objects by default); the DataFrame's index is each record's position in `values`."""
    rows = []
    positions = []
    rejected = []
    for position, value in enumerate(values):
        try:
            record = decode(value)
        except Refused as exc:
            rejected.append(Rejected(position, exc.reason, str(exc)))
            continue
        missing = [f for f in required_fields if record.get(f) is None]
        if missing:
            rejected.append(Rejected(position, MISSING_FIELD, f"record has no value for {', '.join(missing)}"))
            continue
        rows.append(record)
        positions.append(position)
    frame = pd.DataFrame.from_records(rows, index=positions) if rows else pd.DataFrame(index=pd.Index([], dtype="int64"))
    return frame, rejected


# Column types the fast path may hand to the detector: exactly what json.loads + pandas would give.
# Arrow also infers timestamps from strings and keeps lists and objects as its own types; batches
# holding those take the slow path, so a detector always sees the same types for the same record.
_PLAIN_TYPES = (pa.types.is_boolean, pa.types.is_int64, pa.types.is_float64, pa.types.is_string, pa.types.is_null)


def parse_arrow(values: pa.Array, required_fields: Sequence[str], decode: Decode | None = None) -> tuple[pd.DataFrame, list[Rejected]]:
    """`parse` for an Arrow column of values: a whole batch of JSON objects is parsed at once by
    Arrow's JSON reader (C++, no Python per record); anything else, and records of another format
    (`decode`), goes record by record."""
    fast = _parse_all_at_once(values, required_fields) if decode is None else None
    return fast if fast is not None else parse(values.to_pylist(), required_fields, decode or parse_object)


def _objects_back_to_back(values: pa.Array) -> pa.Buffer | None:
    """The bytes of `values` as they lie in the column, one JSON object after the other, which
    Arrow's reader takes as it takes lines; None unless every value is there and looks like an
    object (Arrow's reader crashes the process on a bare `null`, pyarrow 26, and any other
    non-object would fail the whole batch anyway)."""
    n = len(values)
    if n == 0 or values.null_count or values.type not in (pa.binary(), pa.string()):
        return None
    _, offsets_buffer, data = values.buffers()
    if data is None:
        return None
    offsets = np.frombuffer(offsets_buffer, dtype=np.int32, count=n + 1, offset=values.offset * 4)
    starts, ends = offsets[:-1], offsets[1:]
    if not (ends > starts).all():
        return None
    raw = np.frombuffer(data, dtype=np.uint8)
    if not ((raw[starts] == ord("{")).all() and (raw[ends - 1] == ord("}")).all()):
        return None
    return data.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))


def _parse_all_at_once(values: pa.Array, required_fields: Sequence[str]) -> tuple[pd.DataFrame, list[Rejected]] | None:
    n = len(values)
    data = _objects_back_to_back(values)
    if data is None:
        return None
    try:
        # One block, so that one type is inferred per column for the whole batch; on the calling
        # thread, since one block gives Arrow's thread pool nothing to share out.
        options = pa_json.ReadOptions(block_size=max(1 << 20, data.size + 1), use_threads=False)
        table = pa_json.read_json(pa.BufferReader(data), read_options=options)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None  # a malformed or non-object value somewhere: the slow path says which
    if table.num_rows != n or not all(any(check(f.type) for check in _PLAIN_TYPES) for f in table.schema):
        return None
    frame = table.to_pandas()
    rejected: list[Rejected] = []
    missing = pd.Series(False, index=frame.index)
    for name in required_fields:
        missing |= frame[name].isna() if name in frame.columns else True
    if missing.any():
        for position in frame.index[missing]:
            absent = [f for f in required_fields if f not in frame.columns or pd.isna(frame.at[position, f])]
            rejected.append(Rejected(int(position), MISSING_FIELD, f"record has no value for {', '.join(absent)}"))
        frame = frame[~missing]
    return frame, rejected


def detections_of(out: Any, index: pd.Index, single: bool = False) -> list[tuple[int, dict]]:
    """A detect() function's detections as (record position, fields), checked against the records'
    index; with `single`, the batch held one record and every detection is that record's."""
    if not isinstance(out, pd.DataFrame):
        raise TypeError(f"detect() must return a pandas DataFrame of detections, not {type(out).__name__}")
    if out.empty:
        return []
    if not single and not out.index.isin(index).all():
        raise ValueError("detect() returned rows whose index is not the index of an input record")
    positions = [int(index[0])] * len(out) if single else out.index.to_numpy(dtype=np.int64).tolist()
    names = out.columns.tolist()
    if not out.columns.is_unique or not all(isinstance(t, np.dtype) for t in out.dtypes):
        return list(zip(positions, out.to_dict(orient="records"), strict=True))
    # As `to_dict(orient="records")` gives them, a column at a time rather than a value at a time.
    # By items(): iloc consolidates a frame of many blocks (one per array it was built of) first.
    columns = [_python_values(column) for _, column in out.items()]
    return list(zip(positions, (dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)), strict=True))


def _python_values(column: pd.Series) -> list:
    """A NumPy-typed column's values as `DataFrame.to_dict` gives them: NumPy's numbers as Python's,
    datetimes and durations as pandas' scalars."""
    if column.dtype.kind in "biufc":
        return column.to_numpy().tolist()
    if column.dtype != object:
        return list(column)
    values = column.to_numpy()
    if pd.api.types.infer_dtype(values, skipna=False) == "string":
        return values.tolist()  # texts (a key, a model's name): nothing of NumPy's to turn into Python's, found in one pass in C
    return [_native(v) for v in values]


def _native(value: Any) -> Any:
    if not isinstance(value, np.generic):
        return value
    if isinstance(value, np.datetime64 | np.timedelta64):
        return pd.Timestamp(value) if isinstance(value, np.datetime64) else pd.Timedelta(value)
    return value.item()


# NumPy's numbers as numbers; a datetime (pandas' Timestamp) and any other type as its text, as
# `str` writes it; keys of any type as strings, in a second try: orjson's option for them slows
# every dict, and a detection's keys are nearly always its columns' names.
_DETECTION_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_PASSTHROUGH_DATETIME
_ANY_KEYS = _DETECTION_OPTIONS | orjson.OPT_NON_STR_KEYS


def detection_json(value: dict) -> bytes:
    """A detection as the output topic's JSON; NaN and infinity, which JSON has not, as null."""
    try:
        return orjson.dumps(value, default=str, option=_DETECTION_OPTIONS)
    except orjson.JSONEncodeError:
        return orjson.dumps(value, default=str, option=_ANY_KEYS)


# The epoch milliseconds whose nanoseconds an int64 holds (pandas' datetimes are nanoseconds).
_NS_MS = (2**63 - 1) // 1_000_000


def utc_times(ms: np.ndarray) -> pd.DatetimeIndex:
    """Epoch milliseconds as UTC datetimes in nanoseconds, as `pd.to_datetime(ms, unit="ms",
    utc=True)` gives them, by scaling rather than its conversion of each value (a stateful batch
    makes one per record); times beyond nanoseconds' range go to it, to be refused as it refuses them."""
    ms = np.asarray(ms, dtype=np.int64)
    if len(ms) and (int(ms.max()) > _NS_MS or int(ms.min()) < -_NS_MS):
        return pd.to_datetime(ms, unit="ms", utc=True).astype("datetime64[ns, UTC]")
    return pd.DatetimeIndex((ms * 1_000_000).view("datetime64[ns]")).tz_localize("UTC")


def event_times_ms(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """A field's values as event times in epoch milliseconds, and which cannot be one: a number is
    epoch milliseconds, a string ISO 8601, a datetime (an Avro timestamp) itself (a time without a
    zone is UTC); anything else is refused."""
    ms = np.zeros(len(values), dtype=np.int64)
    bad = np.ones(len(values), dtype=bool)
    raw = values.to_numpy(dtype=object)
    moments = np.array([isinstance(v, datetime) for v in raw], dtype=bool)  # pandas' Timestamp is one
    if moments.any():
        since = pd.to_datetime(pd.Series(raw[moments], dtype=object), utc=True) - pd.Timestamp(0, tz="UTC")
        ms[moments] = (since // pd.Timedelta(milliseconds=1)).to_numpy(dtype=np.int64)
        bad[moments] = False
    numbers = np.array([isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v) for v in raw], dtype=bool)
    if numbers.any():
        ms[numbers] = np.asarray(raw[numbers], dtype=np.float64).astype(np.int64)
        bad[numbers] = False
    texts = np.array([isinstance(v, str) for v in raw], dtype=bool)
    if texts.any():
        parsed = pd.to_datetime(pd.Series(raw[texts], dtype=object), utc=True, errors="coerce", format="ISO8601")
        ok = parsed.notna().to_numpy()
        where = np.flatnonzero(texts)
        ms[where[ok]] = parsed[ok].astype("int64").to_numpy() // 1_000_000
        bad[where[ok]] = False
    return ms, bad
