"""Customer silence: three or more records within an hour, then half an hour without one. One
detection per silence, once it has lasted, with the hour up to the customer's last record."""

from dataclasses import dataclass

from detectorkit import windows


@dataclass(frozen=True)
class Config:
    min_records: int = 3
    silence_seconds: float = 1800.0


DETECTOR = windows.detector(
    name="customer-silence",
    window=windows.Sliding(3600, grace_seconds=60),
    aggregate=windows.Count(),
    emit=lambda config: windows.Silent(config.silence_seconds, having=lambda w: w["count"] >= config.min_records),
    key_field="customer",
    event_time_field="ts",
    config=Config,
)
