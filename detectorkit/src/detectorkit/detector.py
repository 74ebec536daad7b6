"""What a data scientist writes: a function from a batch of records to a batch of detections.

    def detect(records: pd.DataFrame, config: Config) -> pd.DataFrame: ...
    DETECTOR = Detector(name="high-value-orders", detect=detect, config=Config, required_fields=("amount",))

`records` holds one parsed JSON record per row, with the fields as columns; a record lacking one of
`required_fields` (or holding null there) never reaches the function: it goes to the dead-letter
topic. The function returns one row per detection, indexed by the index of the record it came
from (filtering ``records`` keeps that index). `config` is an instance of the `config` dataclass,
its fields read from ``DETECTOR_<FIELD>`` environment variables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from detectorkit.settings import config_from_env


@dataclasses.dataclass(frozen=True)
class NoConfig:
    """For a detector that needs no settings."""


@dataclasses.dataclass(frozen=True)
class Detector:
    name: str
    detect: Callable[[pd.DataFrame, Any], pd.DataFrame]
    config: type = NoConfig
    required_fields: tuple[str, ...] = ()

    def load_config(self, environ: Mapping[str, str] | None = None) -> Any:
        """The config dataclass filled from DETECTOR_<FIELD> variables; SettingsError on a bad value."""
        return config_from_env(self.config, "DETECTOR_", environ)
