"""Tests of the detector alone: plain pandas, no Kafka, no Spark."""
{%- if cookiecutter.detector_kind == "burst" %}

from itertools import accumulate, pairwise

import pandas as pd
import pytest
from detectorkit.settings import SettingsError
from detectorkit.testing import DetectorHarness, event_times
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
{%- elif cookiecutter.detector_kind == "silence" %}

from itertools import accumulate

import pandas as pd
import pytest
from detectorkit.settings import SettingsError
from detectorkit.testing import DetectorHarness, event_times
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
    return sorted(
        (customer, (pd.Timestamp(row["last_seen"]) - NOON) / one, (row["deadline"] - NOON) / one)
        for customer, row in fired.iterrows()
    )


def test_detect_flags_nothing_itself_and_keeps_each_customers_newest_time():
    run = DetectorHarness(DETECTOR, Config(silence_seconds=60))
    assert run.batch(records(("c-1", 0), ("c-2", 10), ("c-1", 30))).empty
    assert run.state() == {"c-1": {"last_ms": at(30).value // 10**6}, "c-2": {"last_ms": at(10).value // 10**6}}


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
    assert set(run.state()) == {"c-3", "c-4"}  # a customer's state goes with its detection


def test_a_detection_says_who_since_when_and_for_how_long():
    run = DetectorHarness(DETECTOR, Config(silence_seconds=3600))
    run.batch(records(("c-1", 0), ("c-1", 1.5), ("c-2", 7200)))
    fired = run.take_fired()
    assert fired.loc["c-1"].to_dict() == {
        "rule": "silence",
        "customer": "c-1",
        "last_seen": "2026-11-22T12:00:01.500+00:00",
        "silent_for_seconds": 3600.0,
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


def test_declares_its_state_and_timers_and_needs_no_field_but_the_key_and_time():
    assert DETECTOR.required_fields == ()
    assert DETECTOR.state.columns == ("last_ms",) and DETECTOR.on_timer is not None
    # No TTL: a pending timer keeps a customer's state anyway, and its firing drops it.
    assert DETECTOR.state.ttl_seconds is None


# ---- the same answers whatever the batches: a property over random record streams -------------------


def reference(events, silence_ms, partition_of, partitions):
    """(customer, last record's time, timer's time) of every silence, in ms, one event at a time and
    independently of the detector. An event is (customer, time) for a record, or (None, time) for a
    quiet spell that moves every partition's time on. A partition's time is the newest it has seen; a
    customer is silent once their partition's time reaches their newest record's time + the silence,
    and counts once: then forgotten, until their next record."""
    now, last, found = {}, {}, []

    def flag_silent(p):
        for customer in sorted(c for c, seen in last.items() if partition_of(c) == p and seen + silence_ms <= now[p]):
            seen = last.pop(customer)
            found.append((customer, seen, seen + silence_ms))

    for customer, t in events:
        moved = range(partitions) if customer is None else [partition_of(customer)]
        for p in moved:
            now[p] = max(now.get(p, t), t)
            flag_silent(p)
        if customer is not None:
            last[customer] = max(last.get(customer, t), t)
            flag_silent(moved[0])
    return sorted(found)


# Times in ms after noon, mostly forward as a partition's Kafka timestamps go, now and then a record
# stamped earlier than the one before it (a late one); gaps around a 5 s silence, often on its edges.
GAPS_MS = st.one_of(st.integers(-2_000, 6_000), st.sampled_from([0, 1, 4_999, 5_000, 5_001]))
SOMETIMES = st.sampled_from([False, False, True])
STEPS = st.lists(
    st.tuples(st.sampled_from(["c-1", "c-2", "c-3", None]), GAPS_MS, SOMETIMES, st.sampled_from([False] * 4 + [True])),
    max_size=50,
)


@settings(max_examples=100, deadline=None)
@given(steps=STEPS, partitions=st.integers(1, 3))
def test_silences_do_not_depend_on_batches_partitions_or_restarts(steps, partitions):
    """Each step: a record of a customer (None: a quiet spell, the partitions' time moved on without
    records), then whether the batch ends there, and whether the service restarts after it."""
    silence_ms = 5_000
    times = list(accumulate(gap for _, gap, _, _ in steps))
    run = DetectorHarness(DETECTOR, Config(silence_seconds=silence_ms / 1000), partitions=partitions)
    events, found, pending = [], [], []

    def end_batch():
        if pending:
            run.batch(records(*pending, first_index=len(events), unit="ms"))
            pending.clear()

    for (customer, _, cut, restart), t in zip(steps, times, strict=True):
        events.append((customer, t))
        if customer is None:
            end_batch()
            run.advance(at(t, unit="ms"))
        else:
            pending.append((customer, t))
        if cut or restart:
            end_batch()
        if restart:
            found += silences(run, unit="ms")
            run.restart()
    end_batch()
    found += silences(run, unit="ms")
    expected = reference(events, silence_ms, run.partition_of, partitions)
    assert sorted(found) == expected
{%- else %}

import pandas as pd
import pytest

from {{ cookiecutter.package_name }}.detector import DETECTOR, Config, detect


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
