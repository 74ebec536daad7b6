"""Tests of the detector alone: plain pandas, no Kafka, no Spark."""

from itertools import accumulate

import pandas as pd
import pytest
from detectorkit.testing import DetectorHarness, SettingsError, event_times
from hypothesis import given, settings
from hypothesis import strategies as st

from {{ cookiecutter.package_name }}.detector import DETECTOR, MAX_SILENCE_SECONDS, Config

NOON = pd.Timestamp("2026-11-22T12:00:00Z")


def records(*rows, first_index=10, unit="s"):
    """rows: (customer, time after 12:00:00 in `unit`). As the runtime gives them: the parsed fields,
    and the Kafka key (the customer) and timestamp (the record's time) as `key` and `event_time`."""
    times = [NOON + pd.Timedelta(t, unit=unit) for _, t in rows]
    return pd.DataFrame(
        {"customer": [c for c, _ in rows], "key": [c for c, _ in rows], "event_time": event_times(times)},
        index=range(first_index, first_index + len(rows)),
    )


def at(seconds, unit="s"):
    return NOON + pd.Timedelta(seconds, unit=unit)


def silences(run, unit="s"):
    """What the timers detected since the last call: (customer, their last record's time, the
    timer's time), times after 12:00:00 in `unit`, sorted."""
    fired = run.take_fired()
    one = pd.Timedelta(1, unit=unit)
    last_seen = pd.to_datetime(fired.get("window_end_ms", []), unit="ms", utc=True)
    deadline = fired.get("deadline", last_seen)
    return sorted(zip(fired.index, (last_seen - NOON) / one, (deadline - NOON) / one, strict=True))


def test_detect_flags_nothing_itself():
    run = DetectorHarness(DETECTOR, Config(silence_seconds=60))
    assert run.batch(records(("c-1", 0), ("c-2", 10), ("c-1", 30))).empty
    assert silences(run) == []


def test_flags_each_customer_once_when_the_partitions_time_passes_their_silence():
    run = DetectorHarness(DETECTOR, Config(silence_seconds=60))
    run.batch(records(("c-1", 0), ("c-2", 10), ("c-1", 30)))
    run.batch(records(("c-3", 69)))
    assert silences(run) == []  # c-2 is due at 70, c-1 at 90
    run.batch(records(("c-3", 70)))
    assert silences(run) == [("c-2", 10, 70)]
    run.batch(records(("c-3", 200)))
    assert silences(run) == [("c-1", 30, 90), ("c-3", 70, 130)]  # c-3's own silence before its record at 200
    run.batch(records(("c-4", 250)))
    assert silences(run) == []  # each silence once


def test_a_detection_says_who_and_the_records_before_the_silence():
    run = DetectorHarness(DETECTOR, Config(silence_seconds=3600))
    run.batch(records(("c-1", 0), ("c-1", 1.5), ("c-2", 7200)))
    fired = run.take_fired()
    first, last = (NOON + pd.Timedelta(s, unit="s") for s in (0, 1.5))
    assert fired.loc["c-1"].to_dict() == {  # indexed by customer
        "window_start_ms": first.value // 10**6,
        "window_end_ms": last.value // 10**6,
        "count": 2,
        "deadline": at(3601.5),
    }


def test_a_customers_own_record_in_time_restarts_the_silence():
    run = DetectorHarness(DETECTOR, Config(silence_seconds=60))
    run.batch(records(("c-1", 0)))
    run.batch(records(("c-1", 59)))
    run.batch(records(("c-2", 118)))
    assert silences(run) == []
    run.batch(records(("c-2", 119)))
    assert silences(run) == [("c-1", 59, 119)]


def test_a_late_record_does_not_move_a_customers_last_time_back():
    run = DetectorHarness(DETECTOR, Config(silence_seconds=60))
    run.batch(records(("c-1", 50), ("c-1", 20)))
    run.advance(at(109))
    assert silences(run) == []
    run.advance(at(110))
    assert silences(run) == [("c-1", 50, 110)]


def test_a_quiet_partition_flags_its_silent_customers_once_its_time_moves_on():
    # In the job: no record for TIMER_IDLE_GRACE_SECONDS, and the wall clock moves the event time.
    run = DetectorHarness(DETECTOR, Config(silence_seconds=60), partitions=3)
    run.batch(records(("c-1", 0), ("c-2", 30)))
    run.advance(at(89))
    assert silences(run) == [("c-1", 0, 60)]
    run.advance(at(3600))
    assert silences(run) == [("c-2", 30, 90)]
    run.advance(at(7200))
    assert silences(run) == []


def test_a_customer_who_comes_back_is_flagged_again_after_another_silence():
    run = DetectorHarness(DETECTOR, Config(silence_seconds=60))
    run.batch(records(("c-1", 0)))
    run.advance(at(60))
    run.batch(records(("c-1", 100)))
    run.advance(at(160))
    assert silences(run) == [("c-1", 0, 60), ("c-1", 100, 160)]


def test_timers_survive_a_restart_and_fire_once():
    run = DetectorHarness(DETECTOR, Config(silence_seconds=60), partitions=2)
    run.batch(records(("c-1", 0), ("c-2", 10)))
    run.restart()  # as a redeploy would: state and timers read back from the changelog
    run.batch(records(("c-3", 65)))
    run.restart()
    run.advance(at(1000))
    run.restart()
    run.advance(at(2000))
    assert silences(run) == [("c-1", 0, 60), ("c-2", 10, 70), ("c-3", 65, 125)]


def test_settings_come_from_the_environment():
    assert DETECTOR.load_config({"DETECTOR_SILENCE_SECONDS": "600"}) == Config(silence_seconds=600)
    assert DETECTOR.load_config({}) == Config() == Config(silence_seconds=3 * 3600)


@pytest.mark.parametrize("value", ["0", "-60", "0.0001", "nan", "inf", str(MAX_SILENCE_SECONDS + 1), "3h"])
def test_settings_it_cannot_honour_are_refused_naming_the_variable(value):
    with pytest.raises(SettingsError, match="DETECTOR_SILENCE_SECONDS"):
        DETECTOR.load_config({"DETECTOR_SILENCE_SECONDS": value})


def test_needs_no_field_but_the_key_and_time_and_forgets_a_quiet_customer_after_an_hour_or_the_silence():
    assert DETECTOR.required_fields == ()
    assert DETECTOR.configured(Config(silence_seconds=600)).state.ttl_seconds == 3600
    assert DETECTOR.configured(Config(silence_seconds=7200)).state.ttl_seconds == 7200


# ---- the same answers whatever the batches: a property over random record streams -------------------

# Times in ms after noon, mostly forward as a partition's Kafka timestamps go, now and then a record
# stamped earlier than the one before it (a late one); gaps around a 5 s silence, often on its edges.
GAPS_MS = st.one_of(st.integers(-2_000, 6_000), st.sampled_from([0, 1, 4_999, 5_000, 5_001]))
SOMETIMES = st.sampled_from([False, False, True])
STEPS = st.lists(
    st.tuples(st.sampled_from(["c-1", "c-2", "c-3", None]), GAPS_MS, SOMETIMES, st.sampled_from([False] * 4 + [True])),
    max_size=50,
)


def replay(steps, partitions, batches=True):
    """Each step: a record of a customer (None: a quiet spell, the partitions' time moved on without
    records), then whether the batch ends there, and whether the service restarts after it. Without
    `batches`: one record per batch and no restart, as one pass would see them. The silences."""
    times = list(accumulate(gap for _, gap, _, _ in steps))
    run = DetectorHarness(DETECTOR, Config(silence_seconds=5), partitions=partitions)
    found, pending, position = [], [], 0

    def end_batch():
        if pending:
            run.batch(records(*pending, first_index=position - len(pending), unit="ms"))
            pending.clear()

    for (customer, _, cut, restart), t in zip(steps, times, strict=True):
        position += 1
        if customer is None:
            end_batch()
            run.advance(at(t, unit="ms"))
        else:
            pending.append((customer, t))
        if cut or restart or not batches:
            end_batch()
        if restart and batches:
            found += silences(run, unit="ms")
            run.restart()
    end_batch()
    return sorted(found + silences(run, unit="ms"))


@settings(max_examples=100, deadline=None)
@given(steps=STEPS, partitions=st.integers(1, 3))
def test_silences_do_not_depend_on_batches_or_restarts(steps, partitions):
    assert replay(steps, partitions) == replay(steps, partitions, batches=False)


def test_the_silences_of_a_stream_in_order_are_its_gaps():
    """In time order, a customer is silent after each of their records that the next one follows by
    the silence or more, and after their last record."""
    stream = [("c-1", 0), ("c-2", 1_000), ("c-1", 4_000), ("c-1", 9_000), ("c-2", 12_000), ("c-1", 30_000)]
    times = [t for _, t in stream]
    steps = [(c, t - before, False, False) for (c, t), before in zip(stream, [0, *times], strict=False)]
    steps.append((None, 60_000, False, False))  # a quiet spell: every partition's time moves on
    assert replay(steps, partitions=1) == [
        ("c-1", 4_000, 9_000),
        ("c-1", 9_000, 14_000),
        ("c-1", 30_000, 35_000),
        ("c-2", 1_000, 6_000),
        ("c-2", 12_000, 17_000),
    ]
