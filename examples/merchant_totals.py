"""Merchant totals: a merchant's payments per five minutes, once the five minutes are over (and
30 s for late records), where they add up to more than DETECTOR_MIN_TOTAL."""

from dataclasses import dataclass

from detectorkit import windows


@dataclass(frozen=True)
class Config:
    min_total: float = 50_000.0


DETECTOR = windows.detector(
    name="merchant-totals",
    window=windows.Tumbling(300, grace_seconds=30),
    aggregate=windows.Sum("amount"),
    emit=windows.Final(having=lambda w, config: w["sum"] > config.min_total),
    where=lambda records: records["type"] == "payment",
    key_field="merchant",
    event_time_field="ts",
    config=Config,
)
