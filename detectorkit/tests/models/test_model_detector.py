"""A model detector scores each record's features as the model it was trained as does, emits what
reaches the threshold with the model's name, version and score, refuses a record it cannot score
and a model it cannot load."""

import dataclasses

import numpy as np
import onnx
import pandas as pd
import pytest
from skl2onnx import to_onnx
from skl2onnx.common.data_types import FloatTensorType
from sklearn.ensemble import GradientBoostingClassifier

from detectorkit import models
from detectorkit.records import UNSCORABLE
from detectorkit.runtime.stage import detect_isolating
from detectorkit.settings import SettingsError
from detectorkit.testing import DetectorHarness

FEATURES = ("amount", "items", "hour")


def trained(rows: int = 2_000, seed: int = 7) -> GradientBoostingClassifier:
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.exponential(200, rows), rng.integers(1, 20, rows), rng.integers(0, 24, rows)]).astype(np.float32)
    y = ((X[:, 0] > 500) & ((X[:, 2] < 6) | (X[:, 1] > 10))).astype(int)
    return GradientBoostingClassifier(n_estimators=30, max_depth=3, random_state=seed).fit(X, y)


def exported(model, path, name="fraud-gb", version="3"):
    # Probabilities as a matrix, not ZipMap's dicts; both opsets pinned, so the file is the same tomorrow.
    options, opsets = {id(model): {"zipmap": False}}, {"": 17, "ai.onnx.ml": 3}
    onx = to_onnx(model, initial_types=[("input", FloatTensorType([None, len(FEATURES)]))], options=options, target_opset=opsets)
    entry = onx.metadata_props.add()
    entry.key, entry.value = "name", name
    entry = onx.metadata_props.add()
    entry.key, entry.value = "version", version
    onnx.save(onx, str(path))
    return str(path)


def records(rows: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "customer": [f"c{i % 50}" for i in range(rows)],
            "amount": rng.exponential(250, rows).round(2),
            "items": rng.integers(1, 20, rows),
            "hour": rng.integers(0, 24, rows),
        },
        index=pd.RangeIndex(100, 100 + rows),
    )


def test_a_model_detector_emits_what_the_model_scores_at_the_threshold_with_its_name_version_and_score(tmp_path):
    model = trained()
    uri = exported(model, tmp_path / "model.onnx")
    detector = models.detector(name="fraud-score", features=FEATURES)
    config = models.ModelConfig(model_uri=uri, threshold=0.5)
    batch = records(3_000, seed=11)
    found = DetectorHarness(detector, config).batch(batch)

    expected = model.predict_proba(batch[list(FEATURES)].to_numpy(np.float32))[:, 1]
    # The records scikit-learn scores at the threshold or above, bar those within float32's reach of it.
    clear = np.abs(expected - 0.5) > 1e-4
    assert set(found.index) & set(batch.index[clear]) == set(batch.index[clear & (expected >= 0.5)])
    assert len(found) > 20
    assert set(found["model"]) == {"fraud-gb"} and set(found["model_version"]) == {"3"}
    np.testing.assert_allclose(found["score"], expected[batch.index.get_indexer(found.index)], atol=1e-5)
    assert (found[list(FEATURES)] == batch.loc[found.index, list(FEATURES)]).all().all()


def test_a_record_whose_features_are_not_numbers_is_a_dead_letter_and_the_rest_are_scored(tmp_path):
    uri = exported(trained(), tmp_path / "model.onnx")
    detector = models.detector(name="fraud-score", features=FEATURES).configured(models.ModelConfig(model_uri=uri, threshold=0.0))
    batch = records(40, seed=3).astype({"amount": object})
    batch.loc[105, "amount"] = float("nan")
    batch.loc[120, "amount"] = "a lot"
    found, rejected = detect_isolating(detector, None, batch)
    assert sorted(r.position for r in rejected) == [105, 120]
    assert {r.reason for r in rejected} == {UNSCORABLE} and "['amount']" in rejected[0].message
    assert sorted(p for p, _ in found) == sorted(set(batch.index) - {105, 120})


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "absent.onnx", "No such file"),
        (lambda d: d / "model.pkl", r"not an ONNX file \(\.onnx\)"),
        (lambda d: (d / "broken.onnx").write_bytes(b"not a model") and d / "broken.onnx", "not a model ONNX Runtime can load"),
    ],
)
def test_a_model_that_cannot_be_loaded_stops_the_job_at_start_in_one_line(tmp_path, make, message):
    uri = str(make(tmp_path))
    detector = models.detector(name="fraud-score", features=FEATURES)
    with pytest.raises(SettingsError, match=message) as raised:
        detector.configured(models.ModelConfig(model_uri=uri))
    assert "\n" not in str(raised.value) and str(raised.value).startswith(f"DETECTOR_MODEL_URI={uri!r}")


def test_the_features_named_must_be_as_many_as_the_model_takes(tmp_path):
    uri = exported(trained(), tmp_path / "model.onnx")
    detector = models.detector(name="fraud-score", features=("amount", "items")).configured(models.ModelConfig(model_uri=uri))
    with pytest.raises(ValueError, match="the model takes 3 features; the detector names 2"):
        detector.detect(records(5, seed=1), None)


def test_the_model_travels_to_workers_as_bytes_and_is_scored_there_with_a_session_of_their_own(tmp_path):
    """A Python worker gets the detector pickled: the model's bytes go, its session does not."""
    import cloudpickle

    from detectorkit.models import scoring

    uri = exported(trained(), tmp_path / "model.onnx")
    detector = models.detector(name="fraud-score", features=FEATURES).configured(models.ModelConfig(model_uri=uri, threshold=0.0))
    shipped = cloudpickle.loads(cloudpickle.dumps(detector))
    scoring._SESSIONS.clear()  # as in a new worker process
    (tmp_path / "model.onnx").unlink()  # the worker has no file: the bytes came with the detector
    assert len(shipped.detect(records(10, seed=2), None)) == 10
    assert len(scoring._SESSIONS) == 1


def test_a_config_of_ones_own_with_more_fields_works_as_the_model_config(tmp_path):
    @dataclasses.dataclass(frozen=True)
    class Config:
        model_uri: str = "model/model.onnx"
        threshold: float = 0.9
        team: str = "fraud"

    uri = exported(trained(), tmp_path / "model.onnx")
    found = DetectorHarness(models.detector(name="fraud-score", features=FEATURES, config=Config), Config(model_uri=uri)).batch(records(500, seed=5))
    assert (found["score"] >= 0.9).all()


def test_scoring_without_onnxruntime_says_what_to_install(tmp_path, monkeypatch):
    import sys

    uri = exported(trained(), tmp_path / "model.onnx")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as where the `model` extra is not installed
    with pytest.raises(SettingsError, match=r"scoring needs onnxruntime: pip install 'detectorkit\[model\]'"):
        models.detector(name="fraud-score", features=FEATURES).configured(models.ModelConfig(model_uri=uri))
