"""Distinct countries: one card used in three or more countries within an hour, the record that
makes the third."""

from dataclasses import dataclass

from detectorkit import windows


@dataclass(frozen=True)
class Config:
    min_countries: int = 3


DETECTOR = windows.detector(
    name="distinct-countries",
    window=windows.Sliding(3600, grace_seconds=60),
    aggregate=windows.DistinctCount("country", name="countries"),
    emit=lambda config: windows.AtLeast(config.min_countries),
    key_field="card",
    event_time_field="ts",
    config=Config,
)
