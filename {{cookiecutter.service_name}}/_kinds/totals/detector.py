"""The {{ cookiecutter.service_name }} detector: the one file to edit.

A window rule that emits when its windows close: per customer (the Kafka key) and over event time
(the Kafka timestamp, both set by the normaliser), each customer's payments per window, once the
window is over and its grace for late records has passed, where they add up to more than
DETECTOR_MIN_TOTAL. detectorkit keeps each customer's records of the open windows across batches,
restarts and rebalances. Records that are not JSON objects, or have no amount, go to the dead-letter
topic. Everything else (Kafka, Spark, offsets, metrics, state, timers) comes from detectorkit;
`detectorkit.windows` lists the windows, aggregates and ways to emit.
"""

from __future__ import annotations

from dataclasses import dataclass

from detectorkit import windows


@dataclass(frozen=True)
class Config:
    """Settings of the detector, each read from DETECTOR_<NAME>, e.g. DETECTOR_MIN_TOTAL=25000."""

    min_total: float = 10_000.0
    window_seconds: float = 3600.0
    # How late (behind the customer's newest record) a record may come and still count; a window is
    # emitted once the partition's event time has passed its end and this grace.
    grace_seconds: float = 60.0

    def __post_init__(self):
        if not self.window_seconds > 0 or not self.grace_seconds >= 0:  # also refuses NaN
            raise ValueError("DETECTOR_WINDOW_SECONDS must be above 0 and DETECTOR_GRACE_SECONDS at least 0")
        if self.min_total != self.min_total:
            raise ValueError("DETECTOR_MIN_TOTAL must be a number")


# A customer's payments per window of `window_seconds` (back to back, aligned to the hour for an
# hour): one detection per window above `min_total`, once it is over (window_start_ms,
# window_end_ms, payments, total).
DETECTOR = windows.detector(
    name="{{ cookiecutter.service_name }}",
    window=lambda config: windows.Tumbling(config.window_seconds, grace_seconds=config.grace_seconds),
    aggregate={"payments": windows.Count(), "total": windows.Sum("amount")},
    emit=windows.Final(having=lambda w, config: w["total"] > config.min_total),
    config=Config,
)
