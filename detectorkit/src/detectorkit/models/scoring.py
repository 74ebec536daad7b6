"""A trained model as the runtime holds it: its bytes, name and version read once where the job
starts, and an ONNX Runtime session made once per process that scores (a Python worker's, reused
across its tasks and slices; the session itself never travels). A binary tree ensemble that
`trees` scores as ONNX Runtime does, bit for bit, is scored by it instead."""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import threading
from typing import Any

import numpy as np

from detectorkit.models import registry, trees
from detectorkit.settings import SettingsError, redact_url

# Sessions of this process by the model's digest: a worker scores every slice with one.
_SESSIONS: dict[str, Any] = {}
_SESSIONS_LOCK = threading.Lock()
_LOADED: dict[str, Model] = {}
# The compiled ensemble of each model this process scored, None where ONNX Runtime scores it.
_TREES: dict[str, trees.Trees | None] = {}


@dataclasses.dataclass(frozen=True)
class Model:
    """A model to score with: `score(features)` gives one float per row, higher meaning more
    likely a detection (a binary classifier's probability of its second class, or a model's one
    output)."""

    uri: str
    name: str
    version: str
    features: int
    digest: str
    content: bytes = dataclasses.field(repr=False)

    @classmethod
    def load(cls, uri: str) -> Model:
        """The model at `uri` (an .onnx file, or an MLflow URI: `models:/name/version`,
        `models:/name@alias`, `runs:/...`), checked by scoring nothing with it; SettingsError in one
        line when it cannot be."""
        fetched = registry.fetch(uri) if registry.is_mlflow_uri(uri) else registry.Fetched(pathlib.Path(uri))
        path = fetched.path
        uri = redact_url(uri)
        if path.suffix != ".onnx":
            raise SettingsError(f"DETECTOR_MODEL_URI={uri!r}: not an ONNX file (.onnx); export the model with skl2onnx")
        try:
            content = path.read_bytes()
        except OSError as exc:
            raise SettingsError(f"DETECTOR_MODEL_URI={uri!r}: {exc.strerror or exc}") from None
        digest = hashlib.sha256(content).hexdigest()
        try:
            import onnxruntime  # noqa: F401 - its absence said as what to install, not as a broken model
        except ImportError:
            raise SettingsError(f"DETECTOR_MODEL_URI={uri!r}: scoring needs onnxruntime: pip install 'detectorkit[model]'") from None
        try:
            session = _session(digest, content)
        except Exception as exc:  # noqa: BLE001 - onnxruntime's own errors: any of them means no model
            raise SettingsError(f"DETECTOR_MODEL_URI={uri!r}: not a model ONNX Runtime can load ({str(exc).splitlines()[0]})") from None
        inputs = session.get_inputs()
        if len(inputs) != 1 or len(inputs[0].shape) != 2 or not isinstance(inputs[0].shape[1], int):
            raise SettingsError(f"DETECTOR_MODEL_URI={uri!r}: the model must take one float matrix of a fixed number of features")
        _check_output(uri, session)
        meta = session.get_modelmeta()
        props = meta.custom_metadata_map
        name = fetched.name or props.get("name") or path.stem
        version = fetched.version or props.get("version") or str(meta.version)
        return cls(uri, name, version, int(inputs[0].shape[1]), digest, content)

    @classmethod
    def cached(cls, uri: str) -> Model:
        """`load(uri)` once per process: for a detector run without its config (the job and the
        harness configure it, which loads the model where they start)."""
        model = _LOADED.get(uri)
        return model if model is not None else _LOADED.setdefault(uri, cls.load(uri))

    def warm(self) -> None:
        """This process's session (and compiled ensemble) made now, not at the first batch it scores."""
        _trees(self)

    def score(self, features: np.ndarray) -> np.ndarray:
        """One score per row of `features` (rows of float32, in the declared order)."""
        if len(features) == 0:
            return np.zeros(0)
        compiled = _trees(self)
        # A missing value (NaN) takes the branch the model says: ONNX Runtime reads that, the trees do not.
        if compiled is not None and np.isfinite(features).all():
            return compiled.score(features).astype(np.float64)
        return _onnx_scores(_session(self.digest, self.content), features).astype(np.float64)


def _onnx_scores(session, features: np.ndarray) -> np.ndarray:
    outputs = session.run(None, {session.get_inputs()[0].name: np.ascontiguousarray(features, dtype=np.float32)})
    return _score_of(session, outputs)


def _trees(model: Model) -> trees.Trees | None:
    """The model's compiled ensemble, once checked against ONNX Runtime's scores in this process."""
    if model.digest not in _TREES:
        session = _session(model.digest, model.content)
        _TREES[model.digest] = trees.checked(trees.of_onnx(model.content), lambda matrix: _onnx_scores(session, matrix), model.features)
    return _TREES[model.digest]


def _session(digest: str, content: bytes):
    with _SESSIONS_LOCK:
        session = _SESSIONS.get(digest)
        if session is None:
            import onnxruntime as ort

            options = ort.SessionOptions()
            # A Python worker per core already: the model's own threads would fight them for it.
            options.intra_op_num_threads = 1
            options.inter_op_num_threads = 1
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            session = _SESSIONS[digest] = ort.InferenceSession(content, sess_options=options, providers=["CPUExecutionProvider"])
        return session


def _check_output(uri: str, session) -> None:
    names = [o.name for o in session.get_outputs()]
    if "probabilities" in names:
        shape = session.get_outputs()[names.index("probabilities")].shape
        if len(shape) == 2 and shape[1] not in (2, None):
            raise SettingsError(f"DETECTOR_MODEL_URI={uri!r}: a classifier of {shape[1]} classes; a detector scores with a binary one")
        return
    if "output_probability" in names:
        raise SettingsError(f"DETECTOR_MODEL_URI={uri!r}: probabilities as a ZipMap; export with detectorkit.models.export (skl2onnx's zipmap=False)")
    if len(names) != 1:
        raise SettingsError(f"DETECTOR_MODEL_URI={uri!r}: outputs {names}: a detector scores with 'probabilities' or with one output")


def _score_of(session, outputs: list[np.ndarray]) -> np.ndarray:
    names = [o.name for o in session.get_outputs()]
    if "probabilities" in names:
        return outputs[names.index("probabilities")][:, -1]
    return outputs[0].reshape(len(outputs[0]), -1)[:, 0]
