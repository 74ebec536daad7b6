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


def test_flags_a_customer_once_on_the_record_that_completes_the_burst():
    batch = records(*[("c-1", s) for s in (0, 5, 10, 15, 20, 25)], ("c-2", 0), ("c-2", 500))
    out = DetectorHarness(DETECTOR, Config(min_records=5, window_seconds=60)).batch(batch)
    assert list(out.index) == [14]  # the fifth record of c-1
    assert out.loc[14].to_dict() == {"rule": "burst", "customer": "c-1", "records": 5, "window_seconds": 60}


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


def test_a_late_record_counts_with_the_times_its_customer_still_keeps():
    # The record stamped 5 s comes after the one at 30 s, whose window had dropped the one at 0 s.
    batch = records(("c-1", 0), ("c-1", 30), ("c-1", 5), ("c-1", 8), ("c-2", 0), ("c-2", 1))
    out = DetectorHarness(DETECTOR, Config(min_records=3, window_seconds=10)).batch(batch)
    assert list(out.index) == [13]  # 30, 5 and 8 s: the record at 8 s completes the burst


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


def test_state_keeps_only_what_a_later_burst_can_use():
    run = DetectorHarness(DETECTOR, Config(min_records=5, window_seconds=60))
    run.batch(records(*[("c-1", i) for i in range(100)]))
    assert len(run.state()["c-1"]["recent_ms"]) == 4


def test_a_quiet_customers_state_is_dropped_after_the_ttl():
    ttl = DETECTOR.state.ttl_seconds
    run = DetectorHarness(DETECTOR, Config(min_records=5, window_seconds=60))
    run.batch(records(("c-1", 0), ("c-2", 0)))
    run.batch(records(("c-2", ttl / 2)))
    assert set(run.state()) == {"c-1", "c-2"}
    run.batch(records(("c-2", ttl + 1)))  # event time moves on: c-1 has been quiet for longer than the TTL
    assert set(run.state()) == {"c-2"}


def test_settings_come_from_the_environment():
    assert DETECTOR.load_config({"DETECTOR_MIN_RECORDS": "3"}) == Config(min_records=3)
    assert DETECTOR.load_config({"DETECTOR_WINDOW_SECONDS": "90"}) == Config(window_seconds=90)
    assert DETECTOR.load_config({}) == Config()


@pytest.mark.parametrize(
    "environ, names",
    [
        ({"DETECTOR_MIN_RECORDS": "1"}, "DETECTOR_MIN_RECORDS"),
        ({"DETECTOR_WINDOW_SECONDS": "0"}, "DETECTOR_WINDOW_SECONDS"),
        # Past the state's TTL the detector would forget records still inside the window.
        ({"DETECTOR_WINDOW_SECONDS": str(DETECTOR.state.ttl_seconds + 1)}, "DETECTOR_WINDOW_SECONDS"),
    ],
)
def test_settings_it_cannot_honour_are_refused_naming_the_variable(environ, names):
    with pytest.raises(SettingsError, match=names):
        DETECTOR.load_config(environ)


def test_declares_its_state_and_needs_no_field_but_the_key_and_time():
    assert DETECTOR.required_fields == ()
    assert DETECTOR.state.ttl_seconds > Config().window_seconds


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
TTL_MS = int(DETECTOR.state.ttl_seconds * 1000)
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
        found += [(index, row["customer"]) for index, row in out.iterrows()]
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


def rule_record_by_record(stream, config):
    """`reference` for times that may go back: the rule as one plain loop, record by record, as the
    detector ran it before it was vectorised. Each customer keeps the last min_records - 1 of their
    times that are inside the window of their latest record; which those are then depends on the order
    the records came in. The detections as in `reference`, and each customer's state at the end."""
    window_ms = config.window_seconds * 1000
    kept, flagged, found = {}, {}, []
    for position, (customer, t) in enumerate(stream):
        times = [s for s in kept.get(customer, []) if s >= t - window_ms] + [t]
        last = flagged.get(customer)
        if len(times) >= config.min_records and (last is None or t - last > window_ms):
            found.append((position, customer))
            flagged[customer] = t
        kept[customer] = times[1 - config.min_records :]
    return found, {c: {"recent_ms": kept[c], "flagged_ms": flagged.get(c)} for c in kept}


# A customer's times may go back now and then: a late record (Kafka timestamps are the producers'
# clocks). Well within the TTL, so the state the stores hold at the end is every customer's.
LATE_GAPS_MS = st.one_of(st.integers(-3_000, 6_000), st.sampled_from([0, 1, -1, 4_999, 5_000, 5_001, -5_000]))


@settings(max_examples=75, deadline=None)
@given(
    data=st.data(),
    stream=streams(LATE_GAPS_MS),
    min_records=st.integers(2, 4),
    partitions=st.integers(1, 3),
)
def test_late_records_get_the_rules_answers_and_state_whatever_the_batches(data, stream, min_records, partitions):
    config = Config(min_records=min_records, window_seconds=5)
    noon_ms = NOON.value // 1_000_000
    timed = list(zip([c for c, _ in stream], accumulate(gap for _, gap in stream), strict=True))
    run, found = in_batches(data, timed, config, partitions)
    expected, state = rule_record_by_record([(c, noon_ms + t) for c, t in timed], config)
    assert found == expected
    assert run.state() == state
