"""`models.detector`: a detector that scores each record's features with a model and emits the
records whose score reaches the threshold, with the model's name, version and score. Its features
are the record's fields and, with a window, its key's window aggregates as of the record, computed
by a window rule that emits every record (`windows.Every`), so one pass gives them whatever the
batches, restarts and partitions."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from detectorkit import windows
from detectorkit.detector import Detector, defaults_of
from detectorkit.metrics.registry import SCORE_BUCKETS, bucket_counts, merged_counts
from detectorkit.models.scoring import Model
from detectorkit.records import UNSCORABLE, Refused
from detectorkit.state.declaration import KEY

SCORE, MODEL, MODEL_VERSION = "score", "model", "model_version"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """What a model detector reads from the environment: DETECTOR_MODEL_URI, DETECTOR_THRESHOLD."""

    model_uri: str = "model/model.onnx"
    threshold: float = 0.5


def detector(
    name: str,
    features: Sequence[str],
    config: type = ModelConfig,
    *,
    window: windows.Window | None = None,
    aggregates: Mapping[str, windows.Aggregate] | None = None,
    key_field: str | None = None,
    event_time_field: str | None = None,
    retention_seconds: float | None = None,
    repartition: bool = False,
) -> Detector:
    """A `Detector` scoring each record with the model at the config's `model_uri` (loaded when the
    job starts) and emitting records whose score is at least its `threshold`. The model's features,
    in its order: `features` (the record's fields), then `aggregates` by name, each over the record's
    key's `window` as of the record (window rules' aggregates: `windows.Count()`, `Sum(field)`, ...).
    `config`: ModelConfig, or a dataclass with its two fields and more. `key_field`,
    `event_time_field`, `retention_seconds` and `repartition` as a window rule's."""
    features = tuple(features)
    if not features and not aggregates:
        raise TypeError("models.detector(features=...): name the record fields the model takes, in its order")
    if (window is None) != (not aggregates):
        raise TypeError("models.detector: a window and its aggregates go together (window=windows.Sliding(...), aggregates={...})")
    clash = set(features) & set(aggregates or {})
    if clash:
        raise TypeError(f"models.detector: {sorted(clash)} named as a field and as an aggregate")
    rule = None
    if window is not None:
        # The window keeps only the aggregates: the record's own fields are joined from the batch by
        # the record's index, which each of Every's rows has.
        rule = windows.detector(
            name,
            window=window,
            aggregate=dict(aggregates),
            emit=windows.Every(),
            required_fields=features,
            event_time_field=event_time_field,
            key_field=key_field,
            retention_seconds=retention_seconds,
            repartition=repartition,
        )
    named = tuple(aggregates or {})
    columns = (*features, *named)

    def build(settings: Any, model: Model | None, every: bool = False) -> Detector:
        # This process's scores since the job last took them (a worker's, for detector_model_scores).
        tally = _Tally()

        def loaded(c: Any) -> Model:
            return model if model is not None and c.model_uri == settings.model_uri else Model.load(c.model_uri)

        def scored(matrix: np.ndarray, found: Callable[[np.ndarray], tuple[pd.Index, dict]]) -> pd.DataFrame:
            """The detections among the rows of `matrix` (the features, in the model's order):
            `found(hit)`, the index and fields of the rows that reach the threshold, with the
            model's name, version and score (one frame made of arrays: a column set on a frame
            costs more than a batch of detections)."""
            scoring = model if model is not None else Model.cached(settings.model_uri)
            if len(columns) != scoring.features:
                raise ValueError(f"the model takes {scoring.features} features; the detector names {len(columns)}: {list(columns)}")
            scores = scoring.score(matrix)
            tally.add(scores)
            hit = np.ones(len(scores), dtype=bool) if every else scores >= settings.threshold
            index, data = found(hit)
            data[MODEL], data[MODEL_VERSION], data[SCORE] = scoring.name, scoring.version, scores[hit]
            return pd.DataFrame(data, index=index, copy=False)

        def warm() -> None:
            if model is not None:
                model.warm()
            if rule is not None and rule.warm is not None:
                rule.warm()

        scoring = {
            "warm": warm,
            "config": config,
            "model_info": None if model is None else (model.name, model.version),
            "take_scores": tally.take,
            # Configured again with the same model (a backtest's run, a worker's): the model it has.
            "configure": lambda c: build(c, loaded(c), every),  # one that scores every record stays so
            "score_every": lambda c: build(c, loaded(c), every=True),
        }
        if rule is None:

            def detect(records: pd.DataFrame, _config) -> pd.DataFrame:
                return scored(features_of(records, columns), lambda hit: (records.index[hit], {f: records[f].to_numpy()[hit] for f in features}))

            return Detector(name=name, detect=detect, required_fields=features, **scoring)

        def with_scores(records: pd.DataFrame, fields: np.ndarray, at: np.ndarray, found: Mapping[str, np.ndarray]) -> pd.DataFrame:
            """The detections among the records the window rule answered (`at`, their positions;
            `found`, each one's key and aggregates by name), scored with their fields."""
            matrix = np.empty((len(at), len(columns)), dtype=np.float32)
            matrix[:, : len(features)] = fields[at]
            for i, name in enumerate(named, len(features)):
                matrix[:, i] = found[name]
            _check_finite(matrix[:, len(features) :], named, lambda row: [found[n][row] for n in named])

            def detections(hit: np.ndarray) -> tuple[pd.Index, dict]:
                # A detection is of its record, not of a window (the windows only give features):
                # without their bounds, `detectorkit diff` matches two models' detections by the record.
                chosen = at[hit]
                data = {f: records[f].to_numpy()[chosen] for f in features}
                data.update((name, found[name][hit]) for name in (KEY, *named))
                return records.index[chosen], data

            return scored(matrix, detections)

        def detect_windowed(records: pd.DataFrame, state: pd.DataFrame, rule_config) -> tuple:
            fields = features_of(records, features)  # a record it cannot score changes no window
            out = rule.detect(records, state, rule_config)
            found = out[0]
            at = records.index.get_indexer(found.index)
            return (with_scores(records, fields, at, {name: found[name].to_numpy() for name in (KEY, *named)}), *out[1:])

        def in_store(records: pd.DataFrame, held: Any) -> tuple | None:
            fields = features_of(records, features)
            out = rule.in_store(records, held, arrays=True)
            if out is None:
                return None
            (at, found), *rest = out
            found[KEY] = records[KEY].to_numpy()[at]
            return (with_scores(records, fields, at, found), *rest)

        return dataclasses.replace(rule, detect=detect_windowed, in_store=in_store if rule.in_store is not None else None, **scoring)

    # At import the model is not read (a test may configure another); the job loads it at start.
    return build(defaults_of(config, True, "models.detector"), None)


class _Tally:
    """Scores counted into SCORE_BUCKETS as they are given, taken by the job after each call."""

    def __init__(self) -> None:
        self.counts: list[int] = []
        self.sum = 0.0

    def add(self, scores: np.ndarray) -> None:
        if len(scores):
            self.counts = merged_counts(self.counts, bucket_counts(scores, SCORE_BUCKETS))
            self.sum += float(scores.sum())

    def take(self) -> tuple[list[int], float]:
        taken = self.counts, self.sum
        self.counts, self.sum = [], 0.0
        return taken


def features_of(records: pd.DataFrame, features: tuple[str, ...]) -> np.ndarray:
    """The records' features as float32 rows; Refused (a dead letter) when one is not a finite
    number. A batch with such a record fails whole and is split until it stands alone."""
    matrix = np.empty((len(records), len(features)), dtype=np.float32)
    for i, field in enumerate(features):
        column = records[field]
        if column.dtype.kind in "iuf":  # numbers already, as JSON's parse gives them: no conversion
            matrix[:, i] = column.to_numpy(dtype=np.float64, na_value=np.nan)
        else:
            matrix[:, i] = pd.to_numeric(column, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    _check_finite(matrix, features, lambda row: records.iloc[row][list(features)].tolist())
    return matrix


def _check_finite(matrix: np.ndarray, names: Sequence[str], values_of: Callable[[int], list]) -> None:
    """Refused when a row of `matrix` (its columns `names`) holds a value that is not a finite
    number, saying which of the first such row's (`values_of(row)`: its values, in order)."""
    finite = np.isfinite(matrix)
    if finite.all():
        return
    first = int(np.flatnonzero(~finite.all(axis=1))[0])
    values = values_of(first)
    which = [i for i, ok in enumerate(finite[first]) if not ok]
    raise Refused(UNSCORABLE, f"features {[names[i] for i in which]} are not finite numbers: {[values[i] for i in which]}")
