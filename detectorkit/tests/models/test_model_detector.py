"""A model detector scores each record's features as the model it was trained as does, emits what
reaches the threshold with the model's name, version and score, refuses a record it cannot score
and a model it cannot load."""

import dataclasses
import functools
import pathlib
import tempfile

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.ensemble import GradientBoostingClassifier

from detectorkit import models
from detectorkit import windows as w
from detectorkit.records import UNSCORABLE
from detectorkit.runtime.stage import detect_isolating
from detectorkit.settings import SettingsError
from detectorkit.testing import DetectorHarness
from detectorkit.testing.harness import DetectorError

FEATURES = ("amount", "items", "hour")


def trained(rows: int = 2_000, seed: int = 7) -> GradientBoostingClassifier:
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.exponential(200, rows), rng.integers(1, 20, rows), rng.integers(0, 24, rows)]).astype(np.float32)
    y = ((X[:, 0] > 500) & ((X[:, 2] < 6) | (X[:, 1] > 10))).astype(int)
    return GradientBoostingClassifier(n_estimators=30, max_depth=3, random_state=seed).fit(X, y)


def exported(model, path, name="fraud-gb", version="3"):
    models.export(model, path, name=name, version=version)
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


def test_export_writes_a_pipeline_as_the_detector_scores_it_and_refuses_a_model_not_fitted(tmp_path):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    batch = records(500, seed=4)
    X = batch[list(FEATURES)].to_numpy(np.float32)
    pipeline = make_pipeline(StandardScaler(), LogisticRegression()).fit(X, (X[:, 0] > 300).astype(int))
    exported = models.export(pipeline, tmp_path / "pipeline.onnx", version="2")
    assert {p.key: p.value for p in exported.metadata_props} == {"version": "2"}
    config = models.ModelConfig(model_uri=str(tmp_path / "pipeline.onnx"), threshold=0.0)
    found = DetectorHarness(models.detector(name="big-orders", features=FEATURES), config).batch(batch)
    assert len(found) == len(batch) and set(found["model_version"]) == {"2"}
    np.testing.assert_allclose(found["score"], pipeline.predict_proba(X)[:, 1], atol=1e-5)
    with pytest.raises(ValueError, match="not fitted"):
        models.export(GradientBoostingClassifier(), tmp_path / "unfitted.onnx")


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
    scoring._TREES.clear()
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


# ---- features from windows ------------------------------------------------------------------------

T0 = 1_795_000_000_000
WINDOWED = {"count_10s": w.Count(), "sum_10s": w.Sum("amount")}


@functools.cache
def windowed_model(orders: int = 3, spend: float = 150):
    """A model of the record's amount and items and its key's count and sum over the last 10 s: a
    key's `orders`-th record or more within them when they sum above `spend`."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="windowed-model-")) / "model.onnx"
    rng = np.random.default_rng(5)
    columns = [rng.exponential(50, 3000), rng.integers(1, 5, 3000), rng.integers(1, 8, 3000), rng.exponential(200, 3000)]
    X = np.column_stack(columns).astype(np.float32)
    y = ((X[:, 2] >= orders) & (X[:, 3] > spend)).astype(int)
    model = GradientBoostingClassifier(n_estimators=20, max_depth=3, random_state=5).fit(X, y)
    models.export(model, path)
    return model, str(path)


def keyed(rows, start=0):
    """rows: (key, ms after T0, amount, items) -> records as the runtime hands them to a stateful detector."""
    return pd.DataFrame(
        {
            "key": [r[0] for r in rows],
            "event_time": pd.to_datetime([T0 + r[1] for r in rows], unit="ms", utc=True),
            "amount": [float(r[2]) for r in rows],
            "items": [r[3] for r in rows],
        },
        index=pd.RangeIndex(start, start + len(rows)),
    )


def test_a_models_window_features_are_the_keys_aggregates_as_of_each_record():
    model, uri = windowed_model()
    detector = models.detector(name="bursty-spend", features=("amount", "items"), window=w.Sliding(10), aggregates=WINDOWED)
    rows = [("a", 0, 100, 1), ("a", 2_000, 120, 2), ("b", 3_000, 10, 1), ("a", 4_000, 300, 1), ("a", 15_000, 5, 1)]
    found = DetectorHarness(detector, models.ModelConfig(model_uri=uri, threshold=0.0)).batch(keyed(rows))
    assert list(found.index) == [0, 1, 2, 3, 4]  # threshold 0: every record, each with its features
    # The record's fields, its key (what `detectorkit diff` and a notification name), the aggregates, the model's.
    assert list(found.columns) == ["amount", "items", "key", "count_10s", "sum_10s", "model", "model_version", "score"]
    assert found["key"].tolist() == ["a", "a", "b", "a", "a"]
    assert found["count_10s"].tolist() == [1, 2, 1, 3, 1] and found["sum_10s"].tolist() == [100, 220, 10, 520, 5]
    X = found[["amount", "items", "count_10s", "sum_10s"]].to_numpy(np.float32)
    np.testing.assert_allclose(found["score"], model.predict_proba(X)[:, 1], atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(
    rows=st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 40_000), st.integers(1, 400), st.integers(1, 4)), min_size=1, max_size=40),
    cuts=st.lists(st.integers(1, 39), max_size=4),
    restarts=st.lists(st.booleans(), min_size=1, max_size=3),
    partitions=st.sampled_from([1, 2]),
)
def test_a_models_window_features_and_scores_are_one_pass_whatever_the_batches(rows, cuts, restarts, partitions):
    _, uri = windowed_model()
    detector = models.detector(name="bursty-spend", features=("amount", "items"), window=w.Sliding(10, grace_seconds=3), aggregates=WINDOWED)
    # Every record a detection (threshold 0): its features and score compared, not only whether it is one.
    config = models.ModelConfig(model_uri=uri, threshold=0.0)
    one = DetectorHarness(detector, config, partitions=partitions)
    whole = one.batch(keyed(rows))
    # A record later than its key's newest by more than the grace changes no window: not scored, counted late.
    assert len(whole) + one.late == len(rows)
    harness = DetectorHarness(detector, config, partitions=partitions)
    parts = []
    bounds = sorted({0, len(rows), *(c for c in cuts if c < len(rows))})
    for n, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        if restarts[n % len(restarts)]:
            harness.restart()
        parts.append(harness.batch(keyed(rows[lo:hi], start=lo)))
    batched = pd.concat([p for p in parts if len(p)]) if any(len(p) for p in parts) else whole.iloc[:0]
    assert batched.sort_index().drop(columns="score").equals(whole.sort_index().drop(columns="score"))
    np.testing.assert_allclose(batched.sort_index()["score"], whole.sort_index()["score"], atol=1e-6)


def test_a_record_it_cannot_score_changes_no_window_and_is_a_dead_letter():
    _, uri = windowed_model()
    detector = models.detector(name="bursty-spend", features=("amount", "items"), window=w.Sliding(10), aggregates=WINDOWED)
    harness = DetectorHarness(detector, models.ModelConfig(model_uri=uri, threshold=0.0))
    batch = keyed([("a", 0, 100, 1), ("a", 1_000, 50, 1), ("a", 2_000, 70, 1)]).astype({"items": object})
    batch.loc[1, "items"] = "two"
    with pytest.raises(DetectorError) as raised:
        harness.batch(batch)
    assert [(r.position, r.reason) for r in raised.value.rejected] == [(1, UNSCORABLE)]
    found = raised.value.detections
    assert found["count_10s"].tolist() == [1, 2] and found["sum_10s"].tolist() == [100, 170]  # as if it never came


# ---- versions and scores in the metrics ---------------------------------------------------------


def test_every_score_reaches_the_jobs_histogram_and_the_model_its_info(tmp_path):
    """From the worker's batch (process_batch), through a checkpoint's counts and a slice's end
    results, to detector_model_scores; the model's name and version to detector_model_info."""
    import json

    from detectorkit.kafka.access import KafkaAccess
    from detectorkit.metrics.registry import JobMetrics
    from detectorkit.runtime import task_result
    from detectorkit.runtime.driver_checkpoint import DriverCheckpoint
    from detectorkit.runtime.processing import process_batch, summary_batch, take_counts
    from detectorkit.runtime.stage import as_stage
    from detectorkit.runtime.task_context import TaskContext

    from ..detectors import THRESHOLD
    from ..runtime.test_driver_parts import Ends, Member, plan_of
    from ..runtime.test_processing import FakeSink, arrow

    model = trained()
    uri = exported(model, tmp_path / "model.onnx", version="12")
    config = models.ModelConfig(model_uri=uri, threshold=0.5)
    detector = models.detector(name="fraud-score", features=FEATURES).configured(config)
    assert detector.model_info == ("fraud-gb", "12")
    batch = records(200, seed=9)
    values = [json.dumps(r).encode() for r in batch[list(FEATURES)].to_dict(orient="records")]
    context = TaskContext("fraud-score", as_stage(detector), config, KafkaAccess({}, "fraud-score"), "out", "fraud-score.dlq")
    summaries = {}
    process_batch(context, arrow(values[:120]), FakeSink(), summaries)
    reported = take_counts(summaries)  # a checkpoint's
    process_batch(context, arrow(values[120:], first_offset=220), FakeSink(), summaries)
    ended = task_result.rows_of([summary_batch(summaries, written_ms=0.0)])  # the slice's end

    metrics = JobMetrics(process_tree=False)
    committer = DriverCheckpoint(plan_of(THRESHOLD), metrics, member=Member(), ends=Ends())
    committer.allow({3})
    committer.count_reported(reported)
    committer.finish(1, ended, started=0.0)
    family = next(f for f in metrics.registry.collect() if f.name == "detector_model_scores")
    samples = {s.labels.get("le"): s.value for s in family.samples if s.name.endswith("_bucket")}
    expected = model.predict_proba(batch[list(FEATURES)].to_numpy(np.float32))[:, 1]
    assert samples["+Inf"] == 200
    assert samples["0.5"] == pytest.approx(int((expected <= 0.5).sum()), abs=2)  # float32's reach at the edge
    total = next(s.value for s in family.samples if s.name.endswith("_sum"))
    assert total == pytest.approx(expected.sum(), rel=1e-4)


# ---- a candidate backtested with labels ------------------------------------------------------------


def test_a_candidate_model_is_backtested_with_labels_roc_auc_and_the_precision_at_its_threshold(tmp_path, capsys, monkeypatch):
    """`<service> backtest --model-uri CANDIDATE --labels`: every record scored by the candidate for
    the ROC AUC; the detections, their precision and recall at DETECTOR_THRESHOLD."""
    import json
    import re

    from sklearn.metrics import roc_auc_score

    from detectorkit.cli.run import run_detector

    live = exported(trained(seed=7), tmp_path / "live.onnx", version="1")
    candidate_model = trained(rows=4_000, seed=8)
    candidate = exported(candidate_model, tmp_path / "candidate.onnx", version="2")
    batch = records(400, seed=21)
    rows = [
        {"id": f"r-{i}", **{f: float(v) for f, v in zip(FEATURES, values, strict=True)}} for i, values in enumerate(batch[list(FEATURES)].to_numpy())
    ]
    history = tmp_path / "history.jsonl"
    history.write_text("".join(json.dumps(r) + "\n" for r in rows))
    truth = ((batch["amount"] > 500) & ((batch["hour"] < 6) | (batch["items"] > 10))).to_numpy()
    labels = tmp_path / "labels.txt"
    labels.write_text("id\n" + "".join(f"r-{i}\n" for i in np.flatnonzero(truth)))
    monkeypatch.setenv("DETECTOR_MODEL_URI", live)
    monkeypatch.setenv("DETECTOR_THRESHOLD", "0.7")
    out = tmp_path / "found.jsonl"
    detector = models.detector(name="fraud-score", features=FEATURES)
    argv = ["backtest", "--files", str(history), "--out", str(out), "--labels", str(labels), "--model-uri", candidate, "--no-progress"]
    assert run_detector(detector, argv) == 0
    printed = capsys.readouterr().out

    scores = candidate_model.predict_proba(batch[list(FEATURES)].to_numpy(np.float32))[:, 1]
    found = [json.loads(line)["detection"] for line in out.read_text().splitlines()]
    assert {d["model_version"] for d in found} == {"2"} and all(d["score"] >= 0.7 for d in found)
    assert len(found) == int((scores >= 0.7).sum())
    auc = float(re.search(r"400 scored, (\d+) of them labelled: ROC AUC ([0-9.]+)", printed)[2])
    assert auc == pytest.approx(roc_auc_score(truth, scores), abs=1e-3)
    flagged = set(np.flatnonzero(scores >= 0.7))
    both = len(flagged & set(np.flatnonzero(truth)))
    assert f"{truth.sum()} labelled, {len(flagged)} flagged, {both} both" in printed


@dataclasses.dataclass(frozen=True)
class ProbabilityConfig:
    """A service's config: its own check of the threshold, as the template's has."""

    model_uri: str = "model/model.onnx"
    threshold: float = 0.5

    def __post_init__(self):
        if not 0 <= self.threshold <= 1:
            raise ValueError("DETECTOR_THRESHOLD must be a probability, from 0 to 1")


def test_a_backtest_with_labels_scores_every_record_past_the_configs_own_checks(tmp_path, capsys, monkeypatch):
    from detectorkit.cli.run import run_detector

    monkeypatch.setenv("DETECTOR_MODEL_URI", exported(trained(seed=7), tmp_path / "live.onnx"))
    (tmp_path / "h.jsonl").write_text("".join(f'{{"id": "r-{i}", "amount": {100 * i}, "items": 12, "hour": 3}}\n' for i in range(10)))
    (tmp_path / "labels.txt").write_text("id\nr-9\n")
    detector = models.detector(name="fraud-score", features=FEATURES, config=ProbabilityConfig)
    loads = []
    load = models.Model.load.__func__
    monkeypatch.setattr(models.Model, "load", classmethod(lambda cls, uri: loads.append(uri) or load(cls, uri)))
    argv = ["backtest", "--files", str(tmp_path / "h.jsonl"), "--out", str(tmp_path / "f.jsonl"), "--labels", str(tmp_path / "labels.txt")]
    assert run_detector(detector, [*argv, "--no-progress"]) == 0
    assert "10 scored, 1 of them labelled: ROC AUC" in capsys.readouterr().out
    assert len(loads) == 1  # checked before any record is read, then scored with


def test_a_candidate_for_a_detector_that_scores_with_no_model_is_refused(tmp_path, capsys):
    from detectorkit.cli.run import run_detector

    from ..detectors import THRESHOLD

    (tmp_path / "h.jsonl").write_text('{"amount": 1}\n')
    argv = ["backtest", "--files", str(tmp_path / "h.jsonl"), "--out", str(tmp_path / "f.jsonl"), "--model-uri", "m.onnx"]
    assert run_detector(THRESHOLD, argv) == 2
    assert "--model-uri is for a model detector" in capsys.readouterr().err


def test_a_champion_and_a_candidate_backtested_with_window_features_are_diffed_record_by_record(tmp_path, capsys, monkeypatch):
    """Two models' backtests over the same history, then `detectorkit diff`: a detection is its
    record's (the same record flagged by both, once), never matched to another record of its key
    whose window overlaps."""
    import json

    from detectorkit.cli.main import main
    from detectorkit.cli.run import run_detector

    _, champion = windowed_model()
    _, candidate = windowed_model(orders=4, spend=100)
    rng = np.random.default_rng(4)
    rows = [
        {"id": f"r-{i}", "customer": f"c{i % 3}", "ts": T0 + 997 * i, "amount": float(rng.exponential(60)), "items": int(rng.integers(1, 5))}
        for i in range(300)
    ]
    history = tmp_path / "history.jsonl"
    history.write_text("".join(json.dumps(r) + "\n" for r in rows))
    detector = models.detector(
        name="fraud-score", features=("amount", "items"), window=w.Sliding(10), aggregates=WINDOWED, key_field="customer", event_time_field="ts"
    )
    monkeypatch.setenv("DETECTOR_THRESHOLD", "0.3")
    found = {}
    for name, uri in (("champion", champion), ("candidate", candidate)):
        argv = ["backtest", "--files", str(history), "--out", str(tmp_path / f"{name}.jsonl"), "--model-uri", uri, "--no-progress"]
        assert run_detector(detector, argv) == 0
        lines = (tmp_path / f"{name}.jsonl").read_text().splitlines()
        found[name] = {json.loads(line)["source"]["offset"] for line in lines}
    a, b = found["champion"], found["candidate"]
    champion_only, candidate_only, both = a - b, b - a, a & b
    assert champion_only and candidate_only and both  # models that disagree on some records
    capsys.readouterr()
    assert main(["diff", str(tmp_path / "champion.jsonl"), str(tmp_path / "candidate.jsonl")]) == 0
    total = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("total"))
    assert total.split()[1:] == [f"{len(champion_only):,}", f"{len(candidate_only):,}", f"{len(both):,}"]
