"""Tests of the detector alone: plain pandas, no Kafka, no Spark."""

from itertools import pairwise

import pandas as pd
import pytest
from detectorkit.testing import DetectorHarness, SettingsError, event_times
from hypothesis import given, settings
from hypothesis import strategies as st

from {{ cookiecutter.package_name }}.detector import DETECTOR, Config

HOUR = pd.Timestamp("2026-11-22T12:00:00Z")


def records(*rows, first_index=10):
    """rows: (customer, seconds after 12:00, amount). As the runtime gives them: the parsed fields,
    and the Kafka key (the customer) and timestamp (the record's time) as `key` and `event_time`."""
    times = [HOUR + pd.Timedelta(seconds=s) for _, s, _ in rows]
    return pd.DataFrame(
        {
            "customer": [c for c, _, _ in rows],
            "amount": [float(a) for _, _, a in rows],
            "key": [c for c, _, _ in rows],
            "event_time": event_times(times),
        },
        index=range(first_index, first_index + len(rows)),
    )


def ms(seconds):
    return (HOUR + pd.Timedelta(seconds=seconds)).value // 1_000_000


def closed(run, at_seconds):
    """What the windows that closed by `at_seconds` detected (event time moves on without records)."""
    run.advance(HOUR + pd.Timedelta(seconds=at_seconds))
    return run.take_fired()


def test_a_customers_hour_above_the_total_once_the_hour_and_the_grace_are_over():
    run = DetectorHarness(DETECTOR, Config(min_total=1000))
    assert run.batch(
        records(("c-1", 10, 600), ("c-1", 1000, 500), ("c-2", 20, 900))
    ).empty  # nothing until the hour closes
    assert closed(run, 3659).empty  # the grace: a late record may still come
    found = closed(run, 3660)
    assert list(found.index) == ["c-1"]
    assert found.loc["c-1"].drop("deadline").to_dict() == {
        "window_start_ms": ms(0),
        "window_end_ms": ms(3600),
        "payments": 2,
        "total": 1100.0,
    }


def test_a_late_record_within_the_grace_counts_and_one_after_the_window_closed_does_not():
    run = DetectorHarness(DETECTOR, Config(min_total=1000))
    run.batch(records(("c-1", 3590, 900), ("c-2", 3620, 1), ("c-1", 3540, 200)))  # 50 s late: within the grace
    run.batch(records(("c-2", 3700, 1), ("c-1", 3599, 5000)))  # the hour closed at 3660: too late
    found = closed(run, 7300)
    assert found.loc["c-1", "total"] == 1100.0


def test_state_survives_a_restart():
    run = DetectorHarness(DETECTOR, Config(min_total=1000), partitions=2)
    for row in (("c-1", 0, 400), ("c-2", 1, 2000), ("c-1", 10, 700)):
        run.batch(records(row))
        run.restart()  # as a redeploy would: the state read back from the changelog
    assert sorted(closed(run, 3700).index) == ["c-1", "c-2"]


def test_settings_come_from_the_environment():
    assert DETECTOR.load_config({"DETECTOR_MIN_TOTAL": "25000"}) == Config(min_total=25000)
    assert DETECTOR.load_config({"DETECTOR_WINDOW_SECONDS": "900"}) == Config(window_seconds=900)
    assert DETECTOR.load_config({}) == Config()


@pytest.mark.parametrize(
    "environ", [{"DETECTOR_WINDOW_SECONDS": "0"}, {"DETECTOR_GRACE_SECONDS": "-1"}, {"DETECTOR_MIN_TOTAL": "nan"}]
)
def test_settings_it_cannot_honour_are_refused_naming_the_variable(environ):
    with pytest.raises(SettingsError, match=next(iter(environ))):
        DETECTOR.load_config(environ)


def test_needs_the_amount_field():
    assert DETECTOR.required_fields == ("amount",)


# ---- the same answers whatever the batches: a property over random record streams -------------------

STEPS = st.lists(
    st.tuples(st.sampled_from(["c-1", "c-2", "c-3"]), st.integers(-40, 400), st.integers(1, 900)), max_size=50
)


@settings(max_examples=75, deadline=None)
@given(steps=STEPS, data=st.data(), partitions=st.integers(1, 3))
def test_windows_close_the_same_whatever_the_batches_restarts_and_partitions(steps, data, partitions):
    """Records mostly forward in time, some late (within the grace and past it), cut into batches
    with restarts between some: the same windows, totals and closing times as one record a batch."""
    rows, t = [], 0
    for customer, step, amount in steps:
        t = max(0, t + step)
        rows.append((customer, t, amount))
    config = Config(min_total=1000, window_seconds=600, grace_seconds=60)
    frame = records(*rows, first_index=0)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(rows)), max_size=8), label="batch boundaries"))
    restarts = data.draw(st.sets(st.integers(0, len(cuts))), label="restarts after batches")
    run, single = (
        DetectorHarness(DETECTOR, config, partitions=partitions),
        DetectorHarness(DETECTOR, config, partitions=partitions),
    )
    for number, (start, end) in enumerate(pairwise([0, *cuts, len(rows)])):
        run.batch(frame.iloc[start:end])
        if number in restarts:
            run.restart()
    for i in range(len(rows)):
        single.batch(frame.iloc[[i]])
    assert sorted(map(tuple, closed(run, t + 1000).reset_index().values.tolist())) == sorted(
        map(tuple, closed(single, t + 1000).reset_index().values.tolist())
    )
