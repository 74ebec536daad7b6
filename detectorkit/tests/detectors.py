"""Detectors the runtime's tests run; importable by Spark's Python workers (conftest puts this
folder on PYTHONPATH before Spark starts)."""

import time
from dataclasses import dataclass

import pandas as pd

from detectorkit import Detector


@dataclass(frozen=True)
class Config:
    threshold: float = 1000.0
    # Stretches each batch, so a test can act while a batch is half written.
    delay_seconds: float = 0.0


def above_threshold(records: pd.DataFrame, config: Config) -> pd.DataFrame:
    if config.delay_seconds:
        time.sleep(config.delay_seconds)
    hits = records[records["amount"] > config.threshold]
    return pd.DataFrame({"amount": hits["amount"]}, index=hits.index)


THRESHOLD = Detector(name="test-threshold", detect=above_threshold, config=Config, required_fields=("amount",))
