"""Timers: what did not happen, flagged in event time, the same whatever the batches, restarts and
partitions; a quiet partition's timers fire from the wall clock; a failing on_timer is a dead letter."""

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectorkit import Detector, State
from detectorkit.testing import DetectorError, DetectorHarness

from ..detectors import SILENCE, SILENCE_TYPED, SilenceConfig, quiet_keys, went_quiet

Config = SilenceConfig
detect, on_timer = quiet_keys, went_quiet


def stream(rows):
    """rows: (key, seconds)"""
    return pd.DataFrame({"key": [k for k, _ in rows], "event_time": pd.to_datetime([s for _, s in rows], unit="s", utc=True)})


def reference(rows, silence=10):
    """One pass, record by record: before a record, every timer at or before the newest time so
    far fires; then the record moves its key's timer."""
    timers, fired, now = {}, [], None
    for key, second in rows:
        now = second if now is None else max(now, second)
        for k, at in sorted(timers.items(), key=lambda kv: (kv[1], kv[0])):
            if at <= now:
                fired.append((k, at))
                del timers[k]
        timers[key] = second + silence
    return fired, timers


def fired_of(run):
    out = run.take_fired()
    if out.empty:
        return []
    return sorted(zip(out.index, (out["deadline_ms"] // 1000).astype(int), strict=True))


def test_a_key_that_goes_quiet_fires_once_when_other_records_pass_its_deadline():
    run = DetectorHarness(SILENCE)
    run.batch(stream([("a", 0), ("b", 1), ("a", 5)]))
    run.batch(stream([("b", 10)]))
    assert fired_of(run) == []  # a is due at 15, b at 20
    run.batch(stream([("b", 15), ("b", 16)]))
    assert fired_of(run) == [("a", 15)]
    run.batch(stream([("b", 40)]))
    assert fired_of(run) == [("b", 26)]  # a fired once; b's last record was at 16


def test_a_timer_set_and_due_within_one_batch_fires_before_the_records_after_it():
    run = DetectorHarness(SILENCE)
    run.batch(stream([("a", 0), ("b", 11), ("a", 12)]))
    # a was silent from 0 to 10: it fired at b's record (11), before a came back at 12.
    assert fired_of(run) == [("a", 10)]
    assert set(run.state()) == {"a", "b"}


def test_keys_whose_timers_fall_due_among_a_batchs_records_cost_a_call_or_two_not_one_each():
    """Each of 200 keys sets a timer that falls due among the later records of the batch, each at
    a time of its own: one call runs them all, and one more fires them, as one pass would."""
    calls = {"detect": 0, "on_timer": 0}

    def counted(name, function):
        def call(*args):
            calls[name] += 1
            return function(*args)

        return call

    detector = Detector(name="silence", detect=counted("detect", detect), config=Config, state=SILENCE.state, on_timer=counted("on_timer", on_timer))
    rows = [(f"k{i}", i) for i in range(200)] + [("k0", 205), ("k1", 206)]
    run = DetectorHarness(detector)
    run.batch(stream(rows))
    expected, _ = reference(rows)
    assert fired_of(run) == sorted(expected)
    assert calls["detect"] <= 3 and calls["on_timer"] <= 3, calls  # a call per distinct timer before


def test_timers_survive_a_restart_and_the_partition_moving():
    run = DetectorHarness(SILENCE, partitions=2)
    run.batch(stream([("a", 0), ("b", 0), ("c", 3)]))
    run.restart()
    run.batch(stream([("a", 20), ("b", 20), ("c", 20)]))
    assert fired_of(run) == [("a", 10), ("b", 10), ("c", 13)]


def test_a_quiet_partition_fires_when_the_wall_clock_minus_the_grace_passes_its_timers():
    run = DetectorHarness(SILENCE)
    run.batch(stream([("a", 0)]))
    run.advance(pd.Timestamp(9, unit="s", tz="UTC"))
    assert fired_of(run) == []
    run.advance(pd.Timestamp(10, unit="s", tz="UTC"))
    assert fired_of(run) == [("a", 10)]


def test_on_timer_that_raises_is_a_dead_letter_and_the_others_fire():
    def fragile(fired, config):
        if "bad" in fired.index:
            raise ValueError("cannot")
        return on_timer(fired, config)

    run = DetectorHarness(Detector(name="s", detect=detect, config=Config, state=State(columns=("last_ms",)), on_timer=fragile))
    run.batch(stream([("a", 0), ("bad", 0)]))
    with pytest.raises(DetectorError, match="cannot"):
        run.batch(stream([("c", 30)]))
    assert fired_of(run) == [("a", 10)]


def test_on_timer_that_re_arms_at_or_before_its_deadline_is_refused_as_a_dead_letter_and_later_fires_again():
    def again(fired, config):
        detections, new_state = on_timer(fired, config)
        later = fired["deadline"] + pd.Timedelta(seconds=0 if "loop" in fired.index else 5)
        return detections, fired[["last_ms"]], later

    run = DetectorHarness(Detector(name="s", detect=detect, config=Config, state=State(columns=("last_ms",)), on_timer=again))
    run.batch(stream([("a", 0), ("loop", 0)]))
    with pytest.raises(DetectorError, match="at or before the deadline it fired at") as refused:
        run.batch(stream([("c", 30)]))
    assert [f.key for f in refused.value.failed_timers] == ["loop"]
    assert fired_of(run) == [("a", 10), ("a", 15), ("a", 20), ("a", 25), ("a", 30)]  # re-armed 5 s on each time


def test_the_event_time_a_quiet_partition_reached_survives_a_restart():
    """A late record after the wall clock moved a quiet partition on: with or without a restart, its
    key's timer (already past) fires at once. The partition's event time is in the changelog too."""
    for restart in (False, True):
        run = DetectorHarness(SILENCE)
        run.batch(stream([("a", 0)]))
        run.advance(pd.Timestamp(100, unit="s", tz="UTC"))
        if restart:
            run.restart()
        run.batch(stream([("b", 50)]))
        assert fired_of(run) == [("a", 10), ("b", 60)], restart


@pytest.mark.parametrize("columns", [("last_ms",), {"last_ms": "int64"}], ids=["untyped", "typed"])
def test_a_key_whose_on_timer_fails_loses_its_timer_and_keeps_its_state(columns):
    calls = []

    def failing(fired, config):
        calls.append(list(fired.index))
        raise ValueError("cannot")

    run = DetectorHarness(Detector(name="s", detect=detect, config=Config, state=State(columns=columns, ttl_seconds=5), on_timer=failing))
    run.batch(stream([("a", 0)]))
    with pytest.raises(DetectorError, match="cannot") as raised:
        run.advance(pd.Timestamp(20, unit="s", tz="UTC"))
    # The dead letter holds the key's state as the changelog does (JSON numbers, whatever the store keeps).
    assert b'"state": {"last_ms": 0}' in raised.value.failed_timers[0].value
    run.restart()
    run.advance(pd.Timestamp(40, unit="s", tz="UTC"))  # no second firing, and its TTL applies again
    assert calls == [["a"]]
    assert run.state() == {}


def test_a_timer_for_a_key_without_state_is_refused():
    def no_state(records, state, config):
        return pd.DataFrame(index=records.index[:0]), pd.DataFrame({"last_ms": []}), records["event_time"]

    run = DetectorHarness(Detector(name="s", detect=no_state, config=Config, state=State(columns=("last_ms",)), on_timer=on_timer))
    with pytest.raises(DetectorError, match="a timer needs state"):
        run.batch(stream([("a", 0)]))


def test_on_timer_needs_state():
    with pytest.raises(TypeError, match="state=State"):
        Detector(name="s", detect=detect, on_timer=on_timer)


@st.composite
def streams(draw):
    """In-order event times (per partition, as a producer stamping records writes them), a few keys,
    cut into batches at random, with restarts at random."""
    steps = draw(st.lists(st.tuples(st.sampled_from("abcde"), st.integers(0, 8)), min_size=1, max_size=60))
    rows, now = [], 0
    for key, gap in steps:
        now += gap
        rows.append((key, now))
    cuts = sorted(set(draw(st.lists(st.integers(1, len(rows)), max_size=8))))
    restarts = draw(st.lists(st.booleans(), min_size=len(cuts) + 1, max_size=len(cuts) + 1))
    return rows, cuts, restarts, draw(st.integers(1, 3))


@pytest.mark.parametrize("detector", [SILENCE, SILENCE_TYPED], ids=["untyped", "typed"])
@settings(max_examples=150, deadline=None)
@given(streams())
def test_timers_fire_the_same_whatever_the_batches_restarts_and_partitions(detector, case):
    rows, cuts, restarts, partitions = case
    run = DetectorHarness(detector, partitions=partitions)
    bounds = [0, *cuts, len(rows)]
    for (start, end), restart in zip(zip(bounds, bounds[1:], strict=False), restarts, strict=False):
        if end > start:
            run.batch(stream(rows[start:end]))
        if restart:
            run.restart()
    fired = fired_of(run)
    # The reference runs all keys as one partition: a key's timer waits on its partition's time, so
    # compare per partition.
    expected = []
    for p in range(partitions):
        mine = [(k, s) for k, s in rows if run.partition_of(k) == p]
        expected += reference(mine)[0]
    assert fired == sorted(expected)
