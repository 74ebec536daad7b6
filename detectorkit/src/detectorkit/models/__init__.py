"""Detectors that score records with a trained model: the model's features from each record's
fields, its score, and a detection where the score reaches the threshold, carrying the model's name,
version and score.

    from detectorkit import models

    DETECTOR = models.detector(name="fraud-score", features=("amount", "items", "hour"))

The key's recent behaviour as features too, its window aggregates as of each record (one pass over
the records, whatever the batches, as window rules are):

    DETECTOR = models.detector(
        name="fraud-score",
        features=("amount", "items"),
        window=windows.Sliding(3600),
        aggregates={"orders_1h": windows.Count(), "spent_1h": windows.Sum("amount")},
        key_field="customer",
        event_time_field="ts",
    )

A record later than its key's newest by more than the window's grace changes no window and is not
scored (counted as late, as a window rule's).

The model is an ONNX file (`DETECTOR_MODEL_URI`, default `model/model.onnx`; `models.export`
writes a scikit-learn classifier as one) or one logged to MLflow (`models:/fraud/3`, `models:/fraud@champion`), loaded
when the job starts (a model that cannot be loaded stops it in one line)
and scored once per Python worker's session, on the batch as an array. A record whose features are
missing or not finite numbers is a dead letter (`unscorable`).
"""

from detectorkit.models.detector import ModelConfig, detector
from detectorkit.models.export import export
from detectorkit.models.scoring import Model

__all__ = ["Model", "ModelConfig", "detector", "export"]
