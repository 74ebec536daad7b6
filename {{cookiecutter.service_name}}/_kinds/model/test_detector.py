"""Tests of the detector alone: plain pandas and the shipped model, no Kafka, no Spark."""

import json
import re
import runpy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from detectorkit.cli import run_detector
from detectorkit.testing import DetectorError, DetectorHarness, SettingsError, event_times

from {{ cookiecutter.package_name }}.detector import DETECTOR, Config

NOON = pd.Timestamp("2026-11-22T12:00:00Z")


def records(*rows, first_index=10):
    """rows: (customer, seconds after 12:00:00, amount). As the runtime gives them: the parsed fields,
    and the Kafka key (the customer) and timestamp (the record's time) as `key` and `event_time`."""
    return pd.DataFrame(
        {
            "customer": [c for c, _, _ in rows],
            "amount": [a for _, _, a in rows],
            "key": [c for c, _, _ in rows],
            "event_time": event_times([NOON + pd.Timedelta(seconds=t) for _, t, _ in rows]),
        },
        index=range(first_index, first_index + len(rows)),
    )


SPREE = [("c-1", 60 * m, 900.0) for m in range(5)]
ORDINARY = [("c-2", 1200 * m, 40.0) for m in range(5)]


def test_a_spree_of_large_orders_is_flagged_with_the_models_name_version_and_score():
    out = DetectorHarness(DETECTOR, Config()).batch(records(*SPREE, *ORDINARY))
    assert set(out["key"]) == {"c-1"}
    assert set(out.index) >= {12, 13, 14}  # from its third large order in minutes
    assert set(out["model"]) == {"orders-last-hour"} and set(out["model_version"]) == {"1"}
    assert (out["score"] >= 0.5).all()
    assert out.loc[14, "orders_1h"] == 5 and out.loc[14, "spent_1h"] == 4500.0


def test_ordinary_orders_are_not_flagged():
    assert DetectorHarness(DETECTOR, Config()).batch(records(*ORDINARY)).empty


def test_a_higher_threshold_flags_fewer():
    low = DetectorHarness(DETECTOR, Config(threshold=0.05)).batch(records(*SPREE, *ORDINARY))
    high = DetectorHarness(DETECTOR, Config(threshold=0.99)).batch(records(*SPREE, *ORDINARY))
    assert set(high.index) <= set(low.index)


def test_the_answers_are_the_same_whatever_the_batches():
    batch = records(*SPREE, *ORDINARY)
    whole = DetectorHarness(DETECTOR, Config(threshold=0.0)).batch(batch)
    run = DetectorHarness(DETECTOR, Config(threshold=0.0))
    one_by_one = pd.concat([run.batch(batch.iloc[[i]]) for i in range(len(batch))])
    pd.testing.assert_frame_equal(one_by_one.sort_index(), whole.sort_index())


def test_an_amount_that_is_no_number_is_a_dead_letter():
    batch = records(("c-1", 0, 10.0), ("c-1", 5, 20.0)).astype({"amount": object})
    batch.loc[11, "amount"] = "n/a"
    with pytest.raises(DetectorError, match="not finite numbers"):
        DetectorHarness(DETECTOR, Config(threshold=0.0)).batch(batch)


def test_the_shipped_model_is_the_one_train_py_makes(tmp_path):
    made = tmp_path / "model.onnx"
    runpy.run_path(str(Path(__file__).parents[1] / "train.py"))["train"](made)
    batch = records(*SPREE, *ORDINARY)
    shipped = DetectorHarness(DETECTOR, Config(threshold=0.0)).batch(batch)
    retrained = DetectorHarness(DETECTOR, Config(model_uri=str(made), threshold=0.0)).batch(batch)
    np.testing.assert_allclose(retrained["score"], shipped["score"], atol=1e-6)


def test_a_model_that_is_not_there_stops_the_service_in_one_line():
    with pytest.raises(SettingsError, match="DETECTOR_MODEL_URI='nowhere.onnx'"):
        DetectorHarness(DETECTOR, Config(model_uri="nowhere.onnx"))


def test_a_threshold_that_is_no_probability_is_refused():
    with pytest.raises(ValueError, match="DETECTOR_THRESHOLD must be a probability"):
        Config(threshold=1.5)


def test_a_backtest_with_labels_prints_the_roc_auc_precision_and_recall(tmp_path, capsys):
    """The shipped model over a history it was not trained on (train.py's, another seed): the ROC
    AUC of every score, then the precision and recall of its detections at the threshold."""
    history = runpy.run_path(str(Path(__file__).parents[1] / "train.py"))["history"](customers=100, seed=11)
    rows = [
        {"id": f"r-{i}", "customer": key, "amount": amount, "timestamp": t.isoformat()}
        for i, (key, amount, t) in enumerate(zip(history["key"], history["amount"], history["event_time"], strict=True))
    ]
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    labelled = [f"r-{i}" for i in np.flatnonzero(history["label"].to_numpy())]
    (tmp_path / "labels.txt").write_text("id\n" + "".join(f"{i}\n" for i in labelled))
    files = ["--files", str(tmp_path / "history.jsonl"), "--key-field", "customer", "--time-field", "timestamp"]
    argv = ["backtest", *files, "--out", str(tmp_path / "found.jsonl"), "--labels", str(tmp_path / "labels.txt")]
    argv.append("--no-progress")
    assert run_detector(DETECTOR, argv) == 0
    printed = capsys.readouterr().out
    scored = re.search(r"([\d,]+) scored, ([\d,]+) of them labelled: ROC AUC ([0-9.]+)", printed)
    assert scored, printed
    assert int(scored[1].replace(",", "")) == len(rows) and int(scored[2].replace(",", "")) == len(labelled)
    assert float(scored[3]) > 0.9  # sprees stand out
    measured = re.search(r"precision ([0-9.]+), recall ([0-9.]+)", printed)
    assert measured and float(measured[1]) > 0.5 and float(measured[2]) > 0.5, printed
