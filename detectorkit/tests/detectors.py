"""Detectors the runtime's tests run; importable by Spark's Python workers (conftest puts this
folder on PYTHONPATH before Spark starts)."""

import os
import sys
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


def called_from_the_sources_read() -> bool:
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "read" and frame.f_globals.get("__name__") == "detectorkit.kafka.source":
            return True
        frame = frame.f_back
    return False


def where_it_runs(records: pd.DataFrame, config: Config) -> pd.DataFrame:
    hits = records[records["amount"] > config.threshold]
    return pd.DataFrame({"in_source_read": called_from_the_sources_read(), "pid": os.getpid()}, index=hits.index)


# Tells where Spark runs the detector: inside the Kafka source's read(), or after it.
WHERE = Detector(name="test-where", detect=where_it_runs, config=Config, required_fields=("amount",))


class UnpickledMarker:
    """A config that writes the pid of every process that unpickles it to `path`."""

    def __init__(self, path: str):
        self.path = path

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")
