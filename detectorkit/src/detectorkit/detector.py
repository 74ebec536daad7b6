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
import os
from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd
from pydantic import TypeAdapter, ValidationError

from detectorkit.settings import SettingsError


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
        environ = os.environ if environ is None else environ
        values = {}
        for f in dataclasses.fields(self.config):
            name = f"DETECTOR_{f.name.upper()}"
            if name in environ:
                values[f.name] = environ[name]
        try:
            return TypeAdapter(self.config).validate_python(values, strict=False)
        except ValidationError as exc:
            parts = [f"DETECTOR_{'.'.join(map(str, e['loc'])).upper()}={e.get('input')!r}: {e['msg']}" for e in exc.errors()]
            raise SettingsError("invalid detector setting " + "; ".join(parts)) from None
