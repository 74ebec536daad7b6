"""Tests of the detector alone: plain pandas, no Kafka, no Spark."""

from itertools import accumulate, pairwise

import pandas as pd
import pytest
from detectorkit.testing import DetectorHarness, SettingsError, event_times
from hypothesis import given, settings
from hypothesis import strategies as st

from {{ cookiecutter.package_name }}.detector import DETECTOR, Config

NOON = pd.Timestamp("2026-11-22T12:00:00Z")


def records(*rows, first_index=10, unit="s"):
    """rows: (customer, time after 12:00:00 in `unit`). As the runtime gives them: the parsed fields,
    and the Kafka key (the customer) and timestamp (the record's time) as `key` and `event_time`."""
    times = [NOON + pd.Timedelta(t, unit=unit) for _, t in rows]
    return pd.DataFrame(
        {
            "customer": [c for c, _ in rows],
            "timestamp": [t.isoformat() for t in times],
            "key": [c for c, _ in rows],
            "event_time": event_times(times),
        },
        index=range(first_index, first_index + len(rows)),
    )


def one_by_one(frame):
    """A batch per record: what a caught-up job sees."""
    return [frame.iloc[[i]] for i in range(len(frame))]


def ms(seconds):
    return (NOON + pd.Timedelta(seconds, unit="s")).value // 1_000_000


def test_flags_a_customer_once_on_the_record_that_completes_the_burst():
    batch = records(*[("c-1", s) for s in (0, 5, 10, 15, 20, 25)], ("c-2", 0), ("c-2", 500))
    out = DetectorHarness(DETECTOR, Config(min_records=5, window_seconds=60)).batch(batch)
    assert list(out.index) == [14]  # the fifth record of c-1
    assert out.loc[14].to_dict() == {"key": "c-1", "window_start_ms": ms(20 - 60), "window_end_ms": ms(20), "count": 5}


def test_a_burst_spread_over_many_batches_is_detected():
    # Five records 3 s apart, each in a batch of its own.
    run = DetectorHarness(DETECTOR, Config(min_records=5, window_seconds=60))
    out = run.run(one_by_one(records(*[("c-1", 3 * i) for i in range(5)])))
    assert list(out.index) == [14]


def test_records_spread_wider_than_the_window_are_no_burst():
    run = DetectorHarness(DETECTOR, Config(min_records=5, window_seconds=60))
    assert run.run(one_by_one(records(*[("c-1", 30 * i) for i in range(6)]))).empty


def test_a_record_exactly_a_window_after_the_first_completes_the_burst():
    run = DetectorHarness(DETECTOR, Config(min_records=5, window_seconds=60))
    assert list(run.batch(records(*[("c-1", 15 * i) for i in range(5)])).index) == [14]  # 0, 15, ... 60 s


def test_a_late_record_counts_within_the_grace_in_every_window_that_holds_it_and_not_past_it():
    # After the record at 30 s, one at 26 s is within the 5 s grace: it counts in the window up to
    # 30 s too, which then holds 3 (as Kafka Streams' sliding windows). One at 12 s is not.
    batch = records(("c-1", 20), ("c-1", 30), ("c-1", 26), ("c-1", 12), ("c-1", 27))
    out = DetectorHarness(DETECTOR, Config(min_records=3, window_seconds=10, grace_seconds=5)).batch(batch)
    assert list(out.index) == [12]  # the record of 26 s
    assert out.loc[12].to_dict() == {"key": "c-1", "window_start_ms": ms(20), "window_end_ms": ms(30), "count": 3}


def test_a_customer_still_bursting_is_flagged_again_once_a_window_has_passed_since_the_last_flag():
    batch = records(*[("c-1", 5 * i) for i in range(37)], first_index=0)  # every 5 s for 3 minutes
    run = DetectorHarness(DETECTOR, Config(min_records=5, window_seconds=60))
    assert [5 * i for i in run.run(one_by_one(batch)).index] == [20, 85, 150]


def test_state_survives_a_restart():
    run = DetectorHarness(DETECTOR, Config(min_records=3, window_seconds=60), partitions=2)
    found = []
    for batch in one_by_one(records(("c-1", 0), ("c-2", 1), ("c-1", 10), ("c-2", 11), ("c-1", 20))):
        found += list(run.batch(batch).index)
        run.restart()  # as a redeploy would: the state read back from the changelog
    assert found == [14]


def test_a_quiet_customer_is_forgotten_after_an_hour():
    config = Config(min_records=5, window_seconds=60, grace_seconds=5)
    assert DETECTOR.configured(config).state.ttl_seconds == 3600  # nothing to set: an hour, or the window if longer
    run = DetectorHarness(DETECTOR, config)
    run.batch(records(("c-1", 0), ("c-2", 0)))
    run.batch(records(("c-2", 1800)))
    assert set(run.state()) == {"c-1", "c-2"}
    run.batch(records(("c-2", 3601)))  # event time moves on: c-1 has been quiet for more than an hour
    assert set(run.state()) == {"c-2"}


def test_settings_come_from_the_environment():
    assert DETECTOR.load_config({"DETECTOR_MIN_RECORDS": "3"}) == Config(min_records=3)
    assert DETECTOR.load_config({"DETECTOR_WINDOW_SECONDS": "90"}) == Config(window_seconds=90)
    assert DETECTOR.load_config({"DETECTOR_GRACE_SECONDS": "0"}) == Config(grace_seconds=0)
    assert DETECTOR.load_config({}) == Config()


@pytest.mark.parametrize(
    "environ, names",
    [
        ({"DETECTOR_MIN_RECORDS": "1"}, "DETECTOR_MIN_RECORDS"),
        ({"DETECTOR_WINDOW_SECONDS": "0"}, "DETECTOR_WINDOW_SECONDS"),
        ({"DETECTOR_WINDOW_SECONDS": "nan"}, "DETECTOR_WINDOW_SECONDS"),
        ({"DETECTOR_GRACE_SECONDS": "-1"}, "DETECTOR_GRACE_SECONDS"),
    ],
)
def test_settings_it_cannot_honour_are_refused_naming_the_variable(environ, names):
    with pytest.raises(SettingsError, match=names):
        DETECTOR.load_config(environ)


def test_needs_no_field_but_the_key_and_time():
    assert DETECTOR.required_fields == ()


# ---- the same answers whatever the batches: a property over random record streams -------------------


def reference(stream, config):
    """The (position, customer) of every detection in `stream`, a list of (customer, time in ms) in
    order: one record at a time, over each customer's whole history, independently of the detector."""
    window_ms = config.window_seconds * 1000
    history, last_flag, found = {}, {}, []
    for position, (customer, t) in enumerate(stream):
        history.setdefault(customer, []).append(t)
        in_window = sum(1 for s in history[customer] if t - s <= window_ms)
        flagged_lately = customer in last_flag and t - last_flag[customer] <= window_ms
        if in_window >= config.min_records and not flagged_lately:
            found.append((position, customer))
            last_flag[customer] = t
    return found


# Each record comes `gap` ms after the one before: event time never goes back, as Kafka timestamps in a
# partition roughly do (the TTL follows the partition's newest time). Gaps around a 5 s window, often
# on its edges, some longer than the state's TTL. One customer alone puts its own gaps on the edges.
TTL_MS = int(DETECTOR.configured(Config(window_seconds=5)).state.ttl_seconds * 1000)
GAPS_MS = st.one_of(st.integers(0, 6_000), st.sampled_from([0, 1, 2_500, 4_999, 5_000, 5_001, TTL_MS, TTL_MS + 1]))
CUSTOMERS = st.sampled_from([["c-1"], ["c-1", "c-2", "c-3"]])


def streams(gaps):
    return CUSTOMERS.flatmap(lambda names: st.lists(st.tuples(st.sampled_from(names), gaps), max_size=60))


def in_batches(data, timed, config, partitions):
    """Runs `timed`, a list of (customer, time in ms), cut into batches, with restarts between some,
    both drawn from `data`: the harness and the detections as (position, customer), sorted."""
    frame = records(*timed, first_index=0, unit="ms")
    cuts = sorted(data.draw(st.lists(st.integers(0, len(timed)), max_size=10), label="batch boundaries"))
    restarts = data.draw(st.sets(st.integers(0, len(cuts))), label="restarts after batches")
    run = DetectorHarness(DETECTOR, config, partitions=partitions)
    found = []
    for number, (start, end) in enumerate(pairwise([0, *cuts, len(timed)])):
        out = run.batch(frame.iloc[start:end])
        found += [(index, row["key"]) for index, row in out.iterrows()]
        if number in restarts:
            run.restart()
    return run, sorted(found)


@settings(max_examples=75, deadline=None)
@given(
    data=st.data(),
    stream=streams(GAPS_MS),
    min_records=st.integers(2, 4),
    partitions=st.integers(1, 3),
)
def test_detections_do_not_depend_on_batches_partitions_or_restarts(data, stream, min_records, partitions):
    config = Config(min_records=min_records, window_seconds=5)
    timed = list(zip([c for c, _ in stream], accumulate(gap for _, gap in stream), strict=True))
    _, found = in_batches(data, timed, config, partitions)
    assert found == reference(timed, config)


# A customer's times may go back now and then: a late record (Kafka timestamps are the producers'
# clocks), some of them past the grace.
LATE_GAPS_MS = st.one_of(st.integers(-3_000, 6_000), st.sampled_from([0, 1, -1, 4_999, 5_000, 5_001, -5_000]))


@settings(max_examples=75, deadline=None)
@given(
    data=st.data(),
    stream=streams(LATE_GAPS_MS),
    min_records=st.integers(2, 4),
    partitions=st.integers(1, 3),
)
def test_late_records_get_the_same_answers_and_state_whatever_the_batches(data, stream, min_records, partitions):
    """What one record per batch gives, without restarts, is what any batches and restarts give."""
    config = Config(min_records=min_records, window_seconds=5, grace_seconds=2)
    timed = list(zip([c for c, _ in stream], accumulate(gap for _, gap in stream), strict=True))
    run, found = in_batches(data, timed, config, partitions)
    single = DetectorHarness(DETECTOR, config, partitions=partitions)
    one_pass = single.run(one_by_one(records(*timed, first_index=0, unit="ms")))
    assert found == sorted((index, row["key"]) for index, row in one_pass.iterrows())
    assert run.state() == single.state()
