"""Structuring: three or more transfers by one customer within a day, each below DETECTOR_LIMIT,
that add up to more than it (a large sum split to stay under a reporting limit)."""

from dataclasses import dataclass

from detectorkit import windows


@dataclass(frozen=True)
class Config:
    limit: float = 10_000.0


DETECTOR = windows.detector(
    name="structuring",
    window=windows.Sliding(86400, grace_seconds=60),
    aggregate={"transfers": windows.Count(), "total": windows.Sum("amount")},
    emit=windows.When(lambda w, config: (w["transfers"] >= 3) & (w["total"] > config.limit)),
    where=lambda records, config: (records["type"] == "transfer") & (records["amount"] < config.limit),
    key_field="customer",
    event_time_field="ts",
    config=Config,
)
