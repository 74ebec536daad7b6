"""The {{ cookiecutter.service_name }} detector: the one file to edit.

A window rule: per customer (the Kafka key) and over event time (the Kafka timestamp, both set by the
normaliser), detectorkit keeps each customer's records still inside a window, across batches,
restarts and rebalances, and drops them once no window can take them. Records that are not JSON
objects go to the dead-letter topic. Everything else (Kafka, Spark, offsets, metrics, state) comes
from detectorkit; `detectorkit.windows` lists the windows, aggregates and ways to emit.
"""

from __future__ import annotations

from dataclasses import dataclass

from detectorkit import windows


@dataclass(frozen=True)
class Config:
    """Settings of the detector, each read from DETECTOR_<NAME>, e.g. DETECTOR_MIN_RECORDS=10."""

    min_records: int = 5
    window_seconds: float = 60.0
    # How late (behind the customer's newest record) a record may come and still count.
    grace_seconds: float = 5.0

    def __post_init__(self):
        if self.min_records < 2:
            raise ValueError("DETECTOR_MIN_RECORDS must be at least 2")
        if not self.window_seconds > 0 or not self.grace_seconds >= 0:  # also refuses NaN
            raise ValueError("DETECTOR_WINDOW_SECONDS must be above 0 and DETECTOR_GRACE_SECONDS at least 0")


# A customer with at least `min_records` records within `window_seconds`: one detection, on the
# record that completes the burst, and none for that customer for the next `window_seconds`.
DETECTOR = windows.detector(
    name="{{ cookiecutter.service_name }}",
    window=lambda config: windows.Sliding(seconds=config.window_seconds, grace_seconds=config.grace_seconds),
    aggregate=windows.Count(),
    emit=lambda config: windows.AtLeast(config.min_records),
    config=Config,
)
