"""Repeated round amounts: three or more payments of a round amount (a multiple of 100, at least
500) by one customer within a day, the record that makes the third."""

from dataclasses import dataclass

from detectorkit import windows


@dataclass(frozen=True)
class Config:
    min_payments: int = 3


DETECTOR = windows.detector(
    name="round-amounts",
    window=windows.Sliding(86400, grace_seconds=60),
    aggregate=windows.Count(),
    emit=lambda config: windows.AtLeast(config.min_payments),
    where=lambda records: (records["type"] == "payment") & (records["amount"] >= 500) & (records["amount"] % 100 == 0),
    key_field="customer",
    event_time_field="ts",
    config=Config,
)
