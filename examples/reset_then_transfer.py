"""Reset, then transfer: a password reset, then a transfer above DETECTOR_MIN_AMOUNT by the same
customer within ten minutes, on the transfer (or on the reset, if it arrived late)."""

from dataclasses import dataclass

from detectorkit import patterns


@dataclass(frozen=True)
class Config:
    min_amount: float = 2000.0


DETECTOR = patterns.followed_by(
    name="reset-then-transfer",
    first=lambda records: records["type"] == "password_reset",
    then=lambda records, config: (records["type"] == "transfer") & (records["amount"] > config.min_amount),
    within_seconds=600,
    grace_seconds=60,
    key_field="customer",
    event_time_field="ts",
    config=Config,
)
