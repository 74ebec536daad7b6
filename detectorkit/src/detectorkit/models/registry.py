"""Models in an MLflow registry or run: `models:/name/version`, `models:/name@alias`, `runs:/...`.

The URI is resolved once, where the job starts: an alias names a version there, and that version's
ONNX file is what every worker scores with (its bytes travel with the job), so moving the alias
mid-run changes nothing until the job restarts. MLflow finds its store as it always does
(`MLFLOW_TRACKING_URI`, `MLFLOW_REGISTRY_URI` and their credentials), and downloads the artifacts
to a temporary directory unless they are local already."""

from __future__ import annotations

import dataclasses
import pathlib
import re

from detectorkit.settings import SettingsError, redact_url

# MLflow's own schemes for a logged or registered model; anything else is a path.
_SCHEMES = ("models:/", "runs:/", "mlflow-artifacts:/")
_REGISTERED = re.compile(r"^models:/(?P<name>[^/@]+)(?:/(?P<version>\d+)|@(?P<alias>[^/]+))/?$")


@dataclasses.dataclass(frozen=True)
class Fetched:
    """Where the model's ONNX file is on this machine, and the registry's name and version for it
    (None for a run's model, whose own metadata names it)."""

    path: pathlib.Path
    name: str | None = None
    version: str | None = None


def is_mlflow_uri(uri: str) -> bool:
    return uri.startswith(_SCHEMES)


def fetch(uri: str) -> Fetched:
    """The ONNX file behind an MLflow URI, an alias resolved to its version; SettingsError in one
    line when there is none."""
    said = f"DETECTOR_MODEL_URI={redact_url(uri)!r}"
    try:
        import mlflow
        from mlflow.exceptions import MlflowException
    except ImportError:
        raise SettingsError(f"{said}: an MLflow URI needs MLflow's client: pip install 'detectorkit[mlflow]'") from None
    registered = _REGISTERED.match(uri)
    try:
        if registered is None:
            name = version = None
            pinned = uri
        else:
            client = mlflow.MlflowClient()
            name = registered["name"]
            found = (
                client.get_model_version_by_alias(name, registered["alias"])
                if registered["alias"]
                else client.get_model_version(name, registered["version"])
            )
            version = str(found.version)
            pinned = f"models:/{name}/{version}"
        local = pathlib.Path(mlflow.artifacts.download_artifacts(artifact_uri=pinned))
    except MlflowException as exc:
        raise SettingsError(f"{said}: {_first_line(exc.message)}") from None
    except OSError as exc:
        raise SettingsError(f"{said}: {exc.strerror or exc}") from None
    return Fetched(_onnx_file(said, local), name, version)


def _onnx_file(said: str, local: pathlib.Path) -> pathlib.Path:
    if local.is_file():
        candidates = [local] if local.suffix == ".onnx" else []
    else:
        candidates = sorted(local.rglob("*.onnx"))
    if len(candidates) != 1:
        found = "no ONNX file" if not candidates else f"{len(candidates)} ONNX files"
        raise SettingsError(f"{said}: {found} in the model's artifacts; log it with mlflow.onnx.log_model")
    return candidates[0]


def _first_line(message: str) -> str:
    return redact_url(str(message).strip().splitlines()[0]) if str(message).strip() else "MLflow refused it"
