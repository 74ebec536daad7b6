"""Tests of the detector alone: plain pandas, no Kafka, no Spark."""

import pandas as pd
import pytest
from detectorkit.testing import DetectorHarness

from {{ cookiecutter.package_name }}.detector import DETECTOR, Config, detect


def records(*amounts):
    index = [10 + i for i in range(len(amounts))]
    return pd.DataFrame({"id": [f"r-{i}" for i in index], "amount": list(amounts)}, index=index)


def test_flags_only_amounts_above_the_threshold():
    out = detect(records(5.0, 1000.0, 1000.5, 20_000.0), Config(threshold=1000.0))
    assert list(out.index) == [12, 13]
    assert list(out["amount"]) == [1000.5, 20_000.0]
    assert (out["threshold"] == 1000.0).all()


def test_a_currency_with_a_threshold_of_its_own_is_held_to_it():
    batch = records(600.0, 600.0, 1500.0).assign(currency=["EUR", "USD", "USD"])
    out = DetectorHarness(DETECTOR, Config(threshold=1000.0, thresholds={"EUR": 500.0})).batch(batch)
    assert list(out.index) == [10, 12]
    assert list(out["threshold"]) == [500.0, 1000.0]


def test_keeps_the_index_of_the_input_records():
    batch = records(2000.0, 1.0, 3000.0)
    out = detect(batch, Config())
    assert set(out.index) <= set(batch.index)


def test_no_detection_gives_an_empty_frame():
    out = detect(records(1.0, 2.0), Config(threshold=10.0))
    assert out.empty


def test_threshold_comes_from_the_environment():
    assert DETECTOR.load_config({"DETECTOR_THRESHOLD": "250"}) == Config(threshold=250.0)
    assert DETECTOR.load_config({"DETECTOR_THRESHOLDS": '{"EUR": 500}'}) == Config(thresholds={"EUR": 500.0})
    assert DETECTOR.load_config({}) == Config()


def test_a_non_numeric_amount_raises_so_the_record_goes_to_the_dead_letter_topic():
    with pytest.raises(TypeError):
        detect(records(1.0, "n/a"), Config())


def test_declares_the_fields_it_needs():
    assert "amount" in DETECTOR.required_fields
