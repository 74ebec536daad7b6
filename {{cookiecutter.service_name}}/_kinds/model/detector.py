"""The {{ cookiecutter.service_name }} detector: the one file to edit.

A model detector: each record is scored by a trained model over its amount and its customer's last
hour (how many orders, how much spent), and a record scoring at least the threshold is a detection,
with the model's name, version and score. The customer is the Kafka key and the time the Kafka
timestamp (both set by the normaliser); detectorkit keeps each customer's last hour across batches,
restarts and rebalances, exactly as its window rules do. The model is `model.onnx` beside this file,
which `make train` makes from train.py; records it cannot score go to the dead-letter topic.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from detectorkit import models, windows

# What the model takes, in its order: the record's fields, then its customer's window aggregates.
# train.py computes them with these same declarations, so the model sees what it was trained on.
FIELDS = ("amount",)
WINDOW = windows.Sliding(seconds=3600, grace_seconds=60)
AGGREGATES = {"orders_1h": windows.Count(), "spent_1h": windows.Sum("amount")}


@dataclass(frozen=True)
class Config:
    """Settings of the detector, each read from DETECTOR_<NAME>, e.g. DETECTOR_THRESHOLD=0.8."""

    # The model to score with: the one shipped with the service unless told otherwise.
    model_uri: str = str(Path(__file__).with_name("model.onnx"))
    threshold: float = 0.5

    def __post_init__(self):
        if not 0 <= self.threshold <= 1:  # also refuses NaN
            raise ValueError("DETECTOR_THRESHOLD must be a probability, from 0 to 1")


DETECTOR = models.detector(
    name="{{ cookiecutter.service_name }}",
    features=FIELDS,
    window=WINDOW,
    aggregates=AGGREGATES,
    config=Config,
)
