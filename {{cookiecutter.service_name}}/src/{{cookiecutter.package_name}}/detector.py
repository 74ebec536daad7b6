"""The {{ cookiecutter.service_name }} detector: the one file to edit.

`detect` gets a batch of parsed records (one JSON object per row, its fields as columns) and returns
one row per detection, keeping the index of the record it came from. Records that are not JSON
objects, or that lack a field in REQUIRED_FIELDS, never reach it: they go to the dead-letter topic,
and so does any record on which `detect` raises. Everything else (Kafka, Spark, offsets, metrics)
comes from detectorkit.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from detectorkit import Detector
{%- if cookiecutter.detector_kind == "burst" %}


@dataclass(frozen=True)
class Config:
    """Settings of the detector, each read from DETECTOR_<NAME>, e.g. DETECTOR_MIN_RECORDS=10."""

    min_records: int = 5
    window_seconds: float = 60.0


REQUIRED_FIELDS = ("customer", "timestamp")


def detect(records: pd.DataFrame, config: Config) -> pd.DataFrame:
    """Flag a customer with at least `min_records` records within `window_seconds` in the batch:
    one detection, on the record that completes the burst."""
    times = pd.to_datetime(records["timestamp"], utc=True, format="ISO8601")
    ordered = pd.DataFrame({"customer": records["customer"], "time": times}).sort_values(["customer", "time"])
    span = pd.Timedelta(seconds=config.window_seconds)
    hits = []
    for customer, group in ordered.groupby("customer", sort=False):
        stamps = group["time"].tolist()
        for last in range(config.min_records - 1, len(stamps)):
            if stamps[last] - stamps[last - config.min_records + 1] <= span:
                hits.append((group.index[last], customer))
                break
    return pd.DataFrame(
        {
            "rule": "burst",
            "customer": [c for _, c in hits],
            "records": config.min_records,
            "window_seconds": config.window_seconds,
        },
        index=pd.Index([i for i, _ in hits], dtype=records.index.dtype),
    )
{%- else %}


@dataclass(frozen=True)
class Config:
    """Settings of the detector, each read from DETECTOR_<NAME>, e.g. DETECTOR_THRESHOLD=250."""

    threshold: float = 1000.0


REQUIRED_FIELDS = ("amount",)


def detect(records: pd.DataFrame, config: Config) -> pd.DataFrame:
    """Flag the records whose amount exceeds the threshold."""
    hits = records[records["amount"] > config.threshold]
    return pd.DataFrame(
        {"rule": "amount_above_threshold", "amount": hits["amount"], "threshold": config.threshold},
        index=hits.index,
    )
{%- endif %}


DETECTOR = Detector(
    name="{{ cookiecutter.service_name }}",
    detect=detect,
    config=Config,
    required_fields=REQUIRED_FIELDS,
)
