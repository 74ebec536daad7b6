"""The {{ cookiecutter.service_name }} detector: the one file to edit.

`detect` gets a batch of parsed records (one JSON object per row, its fields as columns) and returns
one row per detection, keeping the index of the record it came from. Records that are not JSON
objects, or that lack a field in REQUIRED_FIELDS, never reach it: they go to the dead-letter topic,
and so does any record on which `detect` raises. Everything else (Kafka, Spark, offsets, metrics)
comes from detectorkit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
from detectorkit import Detector


@dataclass(frozen=True)
class Config:
    """Settings of the detector, each read from DETECTOR_<NAME>, e.g. DETECTOR_THRESHOLD=250."""

    threshold: float = 1000.0
    # Per currency, in place of `threshold` (JSON): DETECTOR_THRESHOLDS='{"EUR": 500, "JPY": 80000}'.
    thresholds: dict[str, float] = field(default_factory=dict)


REQUIRED_FIELDS = ("amount",)


def detect(records: pd.DataFrame, config: Config) -> pd.DataFrame:
    """Flag the records whose amount exceeds the threshold (their currency's, if it has one)."""
    limit = config.threshold
    if config.thresholds and "currency" in records:
        limit = records["currency"].map(config.thresholds).fillna(config.threshold)
    hits = records[records["amount"] > limit]
    threshold = limit[hits.index] if isinstance(limit, pd.Series) else limit
    return pd.DataFrame(
        {"rule": "amount_above_threshold", "amount": hits["amount"], "threshold": threshold},
        index=hits.index,
    )


DETECTOR = Detector(
    name="{{ cookiecutter.service_name }}",
    detect=detect,
    config=Config,
    required_fields=REQUIRED_FIELDS,
)
