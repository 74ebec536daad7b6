"""A gradient-boosted classifier scored by compiled code gives ONNX Runtime's scores bit for bit,
and anything else is left to ONNX Runtime."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from detectorkit import models
from detectorkit.models import scoring, trees


def fitted(**options):
    return GradientBoostingClassifier(random_state=1, **options).fit(*data())


def onnx_of(model, tmp_path) -> tuple[bytes, models.Model]:
    path = tmp_path / "model.onnx"
    models.export(model, path)
    return path.read_bytes(), models.Model.load(str(path))


def onnx_runtime(model: models.Model, matrix: np.ndarray) -> np.ndarray:
    return scoring._onnx_scores(scoring._session(model.digest, model.content), matrix)


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    """Trees some of whose leaves are above the deepest level (a node too small to split)."""
    content, model = onnx_of(fitted(n_estimators=40, max_depth=5, min_samples_split=60), tmp_path_factory.mktemp("uneven"))
    return trees.of_onnx(content), model


def test_trees_with_leaves_above_the_deepest_level_are_made_complete(uneven):
    compiled, _ = uneven
    padded = compiled.thresholds == np.inf  # the nodes standing for a leaf above them
    assert compiled.features.shape == (40, 2**5 - 1) and padded.any() and not padded.all()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(-1e4, 1e4, width=32), st.integers(-5, 40), st.floats(-4, 4, width=32)), min_size=1, max_size=300))
def test_compiled_scores_are_onnx_runtimes_bit_for_bit(uneven, rows):
    compiled, model = uneven
    matrix = np.array(rows, dtype=np.float32)
    assert np.array_equal(compiled.score(matrix).view(np.int32), onnx_runtime(model, matrix).astype(np.float32).view(np.int32))


def test_values_at_each_threshold_and_a_bit_either_side_are_scored_as_onnx_runtime_scores_them(uneven):
    compiled, model = uneven
    cuts = compiled.thresholds[compiled.thresholds < np.inf]
    at = np.concatenate([cuts, np.nextafter(cuts, np.float32(-np.inf)), np.nextafter(cuts, np.float32(np.inf))])
    matrix = np.repeat(at[:, None], 3, axis=1)  # every feature at every threshold: each node's both branches
    assert np.array_equal(compiled.score(matrix), onnx_runtime(model, matrix).astype(np.float32))


def test_a_model_scores_with_the_compiled_trees_once_they_are_checked(tmp_path):
    _, model = onnx_of(fitted(n_estimators=20, max_depth=3), tmp_path)
    scoring._TREES.pop(model.digest, None)
    model.warm()
    assert scoring._TREES[model.digest] is not None
    matrix = np.random.default_rng(2).normal(100, 200, (1000, 3)).astype(np.float32)
    assert np.array_equal(model.score(matrix), onnx_runtime(model, matrix).astype(np.float64))


def test_trees_that_score_a_row_otherwise_than_onnx_runtime_are_not_used(uneven):
    compiled, model = uneven
    thresholds = compiled.thresholds.copy()
    thresholds[0, 0] = np.nextafter(thresholds[0, 0], np.float32(-np.inf))  # a row at the first split goes the other way
    off = dataclasses.replace(compiled, thresholds=thresholds)
    assert trees.checked(compiled, lambda m: onnx_runtime(model, m), 3) is compiled
    assert trees.checked(off, lambda m: onnx_runtime(model, m), 3) is None


def data(rows=600, seed=1):
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.exponential(300, rows), rng.integers(0, 30, rows), rng.normal(0, 1, rows)]).astype(np.float32)
    return X, ((X[:, 0] > 400) & (X[:, 1] > 8) | (X[:, 2] > 1.5)).astype(int)


@pytest.mark.parametrize(
    "model",
    [
        RandomForestClassifier(n_estimators=5, max_depth=3, random_state=1),  # probabilities averaged, no logistic
        make_pipeline(StandardScaler(), GradientBoostingClassifier(n_estimators=5, random_state=1)),  # a scaler before the trees
    ],
    ids=["forest", "pipeline"],
)
def test_other_models_are_left_to_onnx_runtime(tmp_path, model):
    content, loaded = onnx_of(model.fit(*data()), tmp_path)
    assert trees.of_onnx(content) is None
    matrix = np.random.default_rng(3).normal(100, 200, (50, 3)).astype(np.float32)
    assert np.array_equal(loaded.score(matrix), onnx_runtime(loaded, matrix).astype(np.float64))


def test_without_onnx_the_model_is_left_to_onnx_runtime(tmp_path, monkeypatch):
    import sys

    content, _ = onnx_of(fitted(n_estimators=5), tmp_path)
    assert trees.of_onnx(content) is not None
    monkeypatch.setitem(sys.modules, "onnx", None)  # onnxruntime installed alone
    assert trees.of_onnx(content) is None


def test_rows_with_a_missing_value_are_scored_by_onnx_runtime(tmp_path):
    """Where the model sends a missing value (NaN) down the true branch: ONNX Runtime follows it."""
    import onnx
    from onnx import helper

    exported = models.export(fitted(n_estimators=20, max_depth=3))
    ensemble = exported.graph.node[0]
    count = len(next(a for a in ensemble.attribute if a.name == "nodes_modes").strings)
    kept = [a for a in ensemble.attribute if a.name != "nodes_missing_value_tracks_true"]
    del ensemble.attribute[:]
    ensemble.attribute.extend([*kept, helper.make_attribute("nodes_missing_value_tracks_true", [1] * count)])
    onnx.save(exported, str(tmp_path / "tracks.onnx"))
    model = models.Model.load(str(tmp_path / "tracks.onnx"))
    model.warm()
    matrix = np.random.default_rng(4).normal(100, 200, (200, 3)).astype(np.float32)
    matrix[::7, 0] = np.nan
    assert scoring._TREES[model.digest] is not None
    assert np.array_equal(model.score(matrix), onnx_runtime(model, matrix).astype(np.float64))
