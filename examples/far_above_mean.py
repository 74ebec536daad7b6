"""Far above the customer's mean: a payment more than DETECTOR_FACTOR times the mean of the
customer's payments over the last 30 days (itself included), once they have made 10 there."""

from dataclasses import dataclass

from detectorkit import windows


@dataclass(frozen=True)
class Config:
    factor: float = 5.0


DETECTOR = windows.detector(
    name="far-above-mean",
    window=windows.Sliding(30 * 86400, grace_seconds=60),
    aggregate={"payments": windows.Count(), "mean": windows.Mean("amount"), "amount": windows.Last("amount")},
    emit=windows.Every(having=lambda w, config: (w["payments"] >= 10) & (w["amount"] > config.factor * w["mean"])),
    where=lambda records: records["type"] == "payment",
    key_field="customer",
    event_time_field="ts",
    config=Config,
)
