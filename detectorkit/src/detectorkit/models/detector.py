"""`models.detector`: a stateless detector that scores each record's features with a model and
emits the records whose score reaches the threshold, with the model's name, version and score."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pandas as pd

from detectorkit.detector import Detector, defaults_of
from detectorkit.models.scoring import Model
from detectorkit.records import UNSCORABLE, Refused

SCORE, MODEL, MODEL_VERSION = "score", "model", "model_version"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """What a model detector reads from the environment: DETECTOR_MODEL_URI, DETECTOR_THRESHOLD."""

    model_uri: str = "model/model.onnx"
    threshold: float = 0.5


def detector(name: str, features: Sequence[str], config: type = ModelConfig) -> Detector:
    """A `Detector` scoring `features` (record fields, in the model's order) with the model at the
    config's `model_uri`, loaded when the job starts, and emitting records whose score is at least
    its `threshold`. `config`: ModelConfig or a dataclass with those two fields and more."""
    features = tuple(features)
    if not features:
        raise TypeError("models.detector(features=...): name the record fields the model takes, in its order")

    def build(settings, model: Model | None) -> Detector:
        def detect(records: pd.DataFrame, _config) -> pd.DataFrame:
            scoring = model if model is not None else Model.cached(settings.model_uri)
            matrix = features_of(records, features, scoring.features)
            scores = scoring.score(matrix)
            hit = scores >= settings.threshold
            out = pd.DataFrame({MODEL: scoring.name, MODEL_VERSION: scoring.version, SCORE: scores[hit]}, index=records.index[hit])
            for field in features:
                out[field] = records.loc[hit, field]
            return out

        return Detector(
            name=name,
            detect=detect,
            config=config,
            required_fields=features,
            configure=lambda chosen: build(chosen, Model.load(chosen.model_uri)),
        )

    # At import the model is not read (a test may configure another); the job loads it at start.
    return build(defaults_of(config, True, "models.detector"), None)


def features_of(records: pd.DataFrame, features: tuple[str, ...], width: int) -> np.ndarray:
    """The records' features as float32 rows; Refused (a dead letter) when one is not a finite
    number. A batch with such a record fails whole and is split until it stands alone."""
    if len(features) != width:
        raise ValueError(f"the model takes {width} features; the detector names {len(features)}: {list(features)}")
    matrix = np.empty((len(records), width), dtype=np.float32)
    for i, field in enumerate(features):
        values = pd.to_numeric(records[field], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        matrix[:, i] = values
    bad = ~np.isfinite(matrix).all(axis=1)
    if bad.any():
        row = records.iloc[int(np.flatnonzero(bad)[0])]
        which = [f for f in features if not np.isfinite(pd.to_numeric(pd.Series([row[f]]), errors="coerce").astype(float).iloc[0])]
        raise Refused(UNSCORABLE, f"features {which} are not finite numbers: {[row[f] for f in which]}")
    return matrix
