"""A trained scikit-learn classifier as the ONNX model a model detector scores (the `train` extra).

    exported = models.export(model, "model.onnx", name="fraud-gb", version="1")
    mlflow.onnx.log_model(exported, name="model", registered_model_name="fraud")  # or this

What the detector needs of the file, so that a team's training script need not know it: the
probabilities as a matrix (skl2onnx's default, ZipMap, gives a dict per record, which the detector
refuses), the model's name and version in its metadata (each detection carries them; a registry's
name and version override them), and the opsets pinned, so that the same model exports to the same
file on another day's skl2onnx.
"""

from __future__ import annotations

import pathlib
from typing import Any

OPSETS = {"": 17, "ai.onnx.ml": 3}


def export(model: Any, path: str | pathlib.Path | None = None, *, name: str | None = None, version: str | None = None) -> Any:
    """The ONNX model (an `onnx.ModelProto`) of a fitted classifier or pipeline, taking one float
    feature per column, in the order it was fitted on; written to `path` if given."""
    import onnx
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType

    features = getattr(model, "n_features_in_", None)
    if features is None:
        raise ValueError(f"{type(model).__name__} is not fitted: fit it before exporting it")
    exported = to_onnx(
        model,
        initial_types=[("input", FloatTensorType([None, int(features)]))],
        options={id(model): {"zipmap": False}},
        target_opset=OPSETS,
    )
    for key, value in {"name": name, "version": version}.items():
        if value is not None:
            entry = exported.metadata_props.add()
            entry.key, entry.value = key, str(value)
    if path is not None:
        onnx.save(exported, str(path))
    return exported
