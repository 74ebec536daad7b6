"""Card velocity: five or more EUR payments above DETECTOR_MIN_AMOUNT on one card within ten
minutes. One detection per burst, however long it lasts, once it is over: its first window's start,
its last window's end, how many windows held five or more, and the most any held."""

from dataclasses import dataclass

from detectorkit import windows


@dataclass(frozen=True)
class Config:
    min_amount: float = 1000.0


DETECTOR = windows.detector(
    name="card-velocity",
    window=windows.Sliding(600, grace_seconds=60),
    aggregate=windows.Count(),
    emit=windows.AtLeast(5, per="episode"),
    where=lambda records, config: (records["currency"] == "EUR") & (records["amount"] > config.min_amount),
    key_field="card",
    event_time_field="ts",
    config=Config,
)
