"""A model detector scores with a model from an MLflow registry (`models:/name/version`,
`models:/name@alias`) or run: the alias resolved once where the job starts, the registry's name and
version in every detection, and a URI that names no model refused in one line."""

import sys

import mlflow
import onnx
import pytest

from detectorkit import models
from detectorkit.settings import SettingsError
from detectorkit.testing import DetectorHarness

from .test_model_detector import FEATURES, exported, records, trained


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A local MLflow store (a sqlite file and an artifact folder) holding `fraud` versions 1 and 2,
    logged as a data scientist does, with the alias `champion` on version 1."""
    root = tmp_path_factory.mktemp("mlflow")
    with pytest.MonkeyPatch.context() as patch:
        # Where MLflow finds its store, for the test's logging and the job's loading alike.
        patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root}/mlflow.db")
        experiment = mlflow.create_experiment("fraud", artifact_location=(root / "artifacts").as_uri())
        logged = {}
        for version, seed in (("1", 7), ("2", 8)):
            path = exported(trained(seed=seed), root / f"v{version}.onnx", name="from-metadata", version="99")
            with mlflow.start_run(experiment_id=experiment):
                info = mlflow.onnx.log_model(onnx.load(path), name="model", registered_model_name="fraud")
            assert str(info.registered_model_version) == version
            logged[version] = (root / f"v{version}.onnx").read_bytes()
        mlflow.MlflowClient().set_registered_model_alias("fraud", "champion", "1")
        yield logged


def test_a_registered_version_is_scored_with_the_registrys_name_and_version(registry):
    model = models.Model.load("models:/fraud/2")
    assert (model.name, model.version, model.content) == ("fraud", "2", registry["2"])
    found = DetectorHarness(models.detector(name="fraud-score", features=FEATURES), models.ModelConfig(model_uri="models:/fraud/2")).batch(
        records(2_000, seed=3)
    )
    assert len(found) > 10 and set(found["model"]) == {"fraud"} and set(found["model_version"]) == {"2"}


def test_an_alias_is_resolved_once_where_the_job_starts_and_moving_it_is_seen_at_the_next_start(registry):
    champion = models.Model.load("models:/fraud@champion")
    assert (champion.version, champion.content) == ("1", registry["1"])
    mlflow.MlflowClient().set_registered_model_alias("fraud", "champion", "2")
    try:
        # The loaded model is what it was (its bytes travel to the workers); a start loads the new one.
        assert champion.content == registry["1"]
        promoted = models.Model.load("models:/fraud@champion")
        assert (promoted.version, promoted.content) == ("2", registry["2"])
    finally:
        mlflow.MlflowClient().set_registered_model_alias("fraud", "champion", "1")


def test_a_runs_model_is_named_by_its_own_metadata(registry):
    version = mlflow.MlflowClient().get_model_version("fraud", "1")
    model = models.Model.load(f"runs:/{version.run_id}/model")
    assert (model.name, model.version, model.content) == ("from-metadata", "99", registry["1"])


@pytest.mark.parametrize(
    "uri, message",
    [
        ("models:/fraud/7", "version=7"),
        ("models:/nobody@champion", "nobody"),
        ("models:/fraud@nobody", "nobody"),
    ],
)
def test_a_uri_that_names_no_model_stops_the_job_at_start_in_one_line(registry, uri, message):
    with pytest.raises(SettingsError) as caught:
        models.Model.load(uri)
    said = str(caught.value)
    assert said.startswith(f"DETECTOR_MODEL_URI={uri!r}: ") and message in said.split(": ", 1)[1] and "\n" not in said


def test_artifacts_without_an_onnx_file_are_refused_in_one_line(registry, tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with mlflow.start_run(experiment_id=mlflow.get_experiment_by_name("fraud").experiment_id) as run:
        mlflow.log_artifact(str(tmp_path / "notes.txt"), artifact_path="model")
    said = r"^DETECTOR_MODEL_URI='runs:/\w+/model': no ONNX file in the model's artifacts; log it with mlflow.onnx.log_model$"
    with pytest.raises(SettingsError, match=said):
        models.Model.load(f"runs:/{run.info.run_id}/model")


def test_an_mlflow_uri_without_mlflow_installed_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(SettingsError, match=r"^DETECTOR_MODEL_URI='models:/fraud@champion': .* pip install 'detectorkit\[mlflow\]'$"):
        models.Model.load("models:/fraud@champion")


def test_a_password_in_the_stores_address_is_never_said(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://someone:hunter2@127.0.0.1:9")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with pytest.raises(SettingsError) as caught:
        models.Model.load("models:/fraud@champion")
    said = str(caught.value)
    assert said.startswith("DETECTOR_MODEL_URI='models:/fraud@champion': ") and "hunter2" not in said and "\n" not in said
