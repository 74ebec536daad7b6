"""The {{ cookiecutter.service_name }} detector: the one file to edit.

A window rule: per customer (the Kafka key) and over event time (the Kafka timestamp, both set by the
normaliser), detectorkit keeps each customer's open session across batches, restarts and
rebalances, and emits it once it closes. Records that are not JSON objects go to the dead-letter
topic. Everything else (Kafka, Spark, offsets, metrics, state, timers) comes from detectorkit;
`detectorkit.windows` lists the windows, aggregates and ways to emit.
"""

from __future__ import annotations

from dataclasses import dataclass

from detectorkit import windows

# A silence longer than this is out of reach anyway: pandas' timestamps end in 2262.
MAX_SILENCE_SECONDS = 366 * 24 * 3600


@dataclass(frozen=True)
class Config:
    """Settings of the detector, each read from DETECTOR_<NAME>, e.g. DETECTOR_SILENCE_SECONDS=3600."""

    silence_seconds: float = 3 * 3600.0

    def __post_init__(self):
        if not 0.001 <= self.silence_seconds <= MAX_SILENCE_SECONDS:  # also refuses NaN
            raise ValueError(f"DETECTOR_SILENCE_SECONDS must be at least 0.001 (1 ms), at most {MAX_SILENCE_SECONDS}")


# A customer's records less than `silence_seconds` apart are one session; once the partition's event
# time is `silence_seconds` past a session's last record, the customer went silent: one detection
# (window_start_ms, window_end_ms: the session's first and last record; count: its records).
DETECTOR = windows.detector(
    name="{{ cookiecutter.service_name }}",
    window=lambda config: windows.Session(gap_seconds=config.silence_seconds),
    aggregate=windows.Count(),
    emit=windows.Final(),
    config=Config,
)
