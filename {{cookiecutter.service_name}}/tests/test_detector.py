"""Tests of the detector alone: plain pandas, no Kafka, no Spark."""

import pandas as pd
import pytest

from {{ cookiecutter.package_name }}.detector import DETECTOR, Config, detect
{%- if cookiecutter.detector_kind == "burst" %}


def records(*rows):
    """rows: (customer, seconds after 12:00:00)"""
    index = [10 + i for i in range(len(rows))]
    return pd.DataFrame(
        {
            "customer": [c for c, _ in rows],
            "timestamp": [f"2026-11-22T12:{s // 60:02d}:{s % 60:02d}.000Z" for _, s in rows],
        },
        index=index,
    )


def test_flags_a_customer_with_enough_records_inside_the_window_once():
    batch = records(*[("c-1", s) for s in (0, 5, 10, 15, 20, 25)], ("c-2", 0), ("c-2", 500))
    out = detect(batch, Config(min_records=5, window_seconds=60))
    assert list(out["customer"]) == ["c-1"]
    assert list(out.index) == [14]  # the fifth record completes the burst


def test_records_spread_wider_than_the_window_are_no_burst():
    out = detect(records(*[("c-1", s * 30) for s in range(6)]), Config(min_records=5, window_seconds=60))
    assert out.empty


def test_keeps_the_index_of_the_input_records():
    batch = records(*[("c-3", s) for s in range(5)])
    assert set(detect(batch, Config()).index) <= set(batch.index)


def test_settings_come_from_the_environment():
    assert DETECTOR.load_config({"DETECTOR_MIN_RECORDS": "3"}) == Config(min_records=3)
    assert DETECTOR.load_config({}) == Config()


def test_a_timestamp_that_is_no_time_raises_so_the_record_goes_to_the_dead_letter_topic():
    batch = records(("c-1", 0))
    batch.loc[10, "timestamp"] = "soon"
    with pytest.raises(ValueError):
        detect(batch, Config())


def test_declares_the_fields_it_needs():
    assert set(DETECTOR.required_fields) == {"customer", "timestamp"}
{%- else %}


def records(*amounts):
    index = [10 + i for i in range(len(amounts))]
    return pd.DataFrame({"id": [f"r-{i}" for i in index], "amount": list(amounts)}, index=index)


def test_flags_only_amounts_above_the_threshold():
    out = detect(records(5.0, 1000.0, 1000.5, 20_000.0), Config(threshold=1000.0))
    assert list(out.index) == [12, 13]
    assert list(out["amount"]) == [1000.5, 20_000.0]
    assert (out["threshold"] == 1000.0).all()


def test_keeps_the_index_of_the_input_records():
    batch = records(2000.0, 1.0, 3000.0)
    out = detect(batch, Config())
    assert set(out.index) <= set(batch.index)


def test_no_detection_gives_an_empty_frame():
    out = detect(records(1.0, 2.0), Config(threshold=10.0))
    assert out.empty


def test_threshold_comes_from_the_environment():
    assert DETECTOR.load_config({"DETECTOR_THRESHOLD": "250"}) == Config(threshold=250.0)
    assert DETECTOR.load_config({}) == Config()


def test_a_non_numeric_amount_raises_so_the_record_goes_to_the_dead_letter_topic():
    with pytest.raises(TypeError):
        detect(records(1.0, "n/a"), Config())


def test_declares_the_fields_it_needs():
    assert "amount" in DETECTOR.required_fields
{%- endif %}
