"""A stateful detector's answers equal one pass over the records that were not dead-lettered, record by
record, whatever the batches, restarts, partitions and ticks: timers fire, keys expire and rejected
records move nothing as that pass would have them."""

from dataclasses import dataclass

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectorkit import Detector, State
from detectorkit.testing import DetectorError, DetectorHarness

from ..detectors import SilenceConfig, quiet_keys, went_quiet

TTL = 10  # seconds


def refusing(detect):
    """`detect`, raising on any record whose `bad` is set (each such record goes to the dead letters)."""

    def wrapped(records, state, config):
        if records["bad"].any():
            raise ValueError("a bad record")
        return detect(records, state, config)

    return wrapped


@dataclass(frozen=True)
class CountConfig:
    every: int = 2


def count(records, state, config):
    counts = state["count"].to_dict()
    hits, rows = [], {}
    for index, key in records["key"].items():
        counts[key] = counts.get(key, 0) + 1
        if counts[key] % config.every == 0:
            hits.append((index, counts[key]))
        rows[key] = counts[key]
    found = pd.DataFrame({"n": [n for _, n in hits]}, index=pd.Index([i for i, _ in hits], dtype=records.index.dtype))
    return found, pd.DataFrame({"count": rows})


SILENCE = Detector(name="silence", detect=refusing(quiet_keys), config=SilenceConfig, state=State(columns={"last_ms": "int64"}), on_timer=went_quiet)
COUNT = Detector(name="count", detect=refusing(count), config=CountConfig, state=State(columns=("count",), ttl_seconds=TTL))
COUNT_TYPED = Detector(name="count", detect=refusing(count), config=CountConfig, state=State(columns={"count": "int64"}, ttl_seconds=TTL))


def stream(rows):
    """rows: (key, seconds) or (key, seconds, bad)"""
    rows = [(*r, False)[:3] for r in rows]
    return pd.DataFrame(
        {
            "key": [k for k, _, _ in rows],
            "event_time": pd.to_datetime([s for _, s, _ in rows], unit="s", utc=True),
            "bad": [b for _, _, b in rows],
        }
    )


def batch(run, rows):
    """One batch; the dead letters it makes are expected here, not errors."""
    try:
        return run.batch(stream(rows))
    except DetectorError as e:
        assert all(r.message.endswith("a bad record") for r in e.rejected), e
        assert not e.failed_timers, e
        return e.detections


def fired_of(run):
    out = run.take_fired()
    return [] if out.empty else sorted(zip(out.index, (out["deadline_ms"] // 1000).astype(int), strict=True))


def counts_of(run):
    return {k: v["count"] for k, v in run.state().items()}


# ---- the scenarios, each once ------------------------------------------------------------------


def test_a_record_that_raises_does_not_stop_other_keys_timers_from_firing_where_they_fall():
    run = DetectorHarness(SILENCE)
    batch(run, [("a", 0), ("b", 11), ("a", 12), ("bad", 13, True)])
    # a was silent from 0 to 10: it fires at b's record, before a came back at 12, as without "bad".
    assert fired_of(run) == [("a", 10)]
    assert set(run.state()) == {"a", "b"}


def test_a_rejected_record_far_in_the_future_fires_no_timer_and_expires_no_key():
    silence, counter = DetectorHarness(SILENCE), DetectorHarness(COUNT)
    for run in (silence, counter):
        batch(run, [("a", 0)])
        batch(run, [("x", 1_000_000, True)])
        batch(run, [("a", 5), ("b", 6)])
    assert fired_of(silence) == []
    assert set(silence.state()) == {"a", "b"}
    assert counts_of(counter) == {"a": 2, "b": 1}  # a's first record is 5 s old, not a million


@pytest.mark.parametrize("detector", [COUNT, COUNT_TYPED], ids=["untyped", "typed"])
def test_whether_a_key_has_expired_does_not_depend_on_where_batches_fall(detector):
    rows = [("j", 0), ("x", 15), ("j", 16)]
    whole, split = DetectorHarness(detector), DetectorHarness(detector)
    batch(whole, rows)
    batch(split, rows[:2])
    batch(split, rows[2:])
    # At j's second record the partition's event time is 16: j, last seen at 0, expired at 10.
    assert counts_of(whole) == counts_of(split) == {"j": 1, "x": 1}


def test_a_key_expires_between_two_of_its_records_in_one_batch():
    run = DetectorHarness(COUNT)
    found = batch(run, [("j", 0), ("j", 5), ("x", 30), ("j", 31), ("j", 32)])
    # j counts 1, 2, then expires (last seen 5, event time 31), and counts 1, 2 again.
    assert found["n"].tolist() == [2, 2]


def test_a_key_is_judged_by_the_partitions_event_time_not_its_own_late_record():
    run = DetectorHarness(COUNT)
    batch(run, [("j", 0), ("x", 15), ("j", 5)])  # j's record at 5 comes when the partition is at 15
    assert counts_of(run)["j"] == 1


# ---- one pass, record by record, against any batches ---------------------------------------------


def silence_reference(events, silence=10):
    """events: ("rec", key, t, bad) or ("tick", t). Before a record that is kept, every timer at or
    before the newest time so far fires; a rejected record changes nothing."""
    timers, fired, now = {}, [], None
    for event in events:
        if event[0] == "rec":
            _, key, t, bad = event
            if bad:
                continue
        else:
            t = event[1]
        now = t if now is None else max(now, t)
        for k, at in sorted(timers.items(), key=lambda kv: (kv[1], kv[0])):
            if at <= now:
                fired.append((k, at))
                del timers[k]
        if event[0] == "rec":
            timers[key] = t + silence
    return fired


def count_reference(events, every=CountConfig.every, ttl=TTL):
    """The state (key -> (count, newest time)), the event time reached and the detections (as
    (key, n)) of one pass: a key whose newest record is more than
    the TTL before the partition's event time starts again from nothing."""
    state, found, now = {}, [], None
    for event in events:
        if event[0] == "tick":
            now = event[1] if now is None else max(now, event[1])
            continue
        _, key, t, bad = event
        if bad:
            continue
        now = t if now is None else max(now, t)
        n, seen = state.get(key, (0, t))
        if seen + ttl < now:
            n, seen = 0, t
        state[key] = (n + 1, max(seen, t))
        if (n + 1) % every == 0:
            found.append((key, n + 1))
    return state, now, sorted(found)


@st.composite
def histories(draw):
    """In-order event times with now and then a gap past the TTL, a few keys, some records that
    raise, cut into batches at random with restarts and ticks (the wall clock moving a quiet
    partition on) between them, over 1-3 partitions."""
    step = st.tuples(st.sampled_from("abcde"), st.sampled_from([0, 1, 3, 8, 12, 30]), st.booleans(), st.integers(0, 9))
    steps = draw(st.lists(step, min_size=1, max_size=50))
    rows, now = [], 0
    for key, gap, bad, far in steps:
        now += gap
        # A rejected record may be stamped far in the future: it must move nothing.
        rows.append((key, now + (10_000 if bad and far == 0 else 0), bad and far < 3))
    cuts = sorted(set(draw(st.lists(st.integers(1, len(rows)), max_size=8))))
    between = draw(st.lists(st.sampled_from(["", "restart", "tick"]), min_size=len(cuts) + 1, max_size=len(cuts) + 1))
    return rows, cuts, between, draw(st.integers(1, 3))


def replay(detector, case):
    """The harness over the case's batches; (the harness, each partition's events in order, the
    detections as (key, n))."""
    rows, cuts, between, partitions = case
    run = DetectorHarness(detector, partitions=partitions)
    events, detected = {p: [] for p in range(partitions)}, []
    bounds = [0, *cuts, len(rows)]
    for (start, end), then in zip(zip(bounds, bounds[1:], strict=False), between, strict=False):
        part = rows[start:end]
        if part:
            found = batch(run, part)
            for key, t, bad in part:
                events[run.partition_of(key)].append(("rec", key, t, bad))
            if "n" in found:
                detected += zip(stream(part)["key"][found.index], found["n"], strict=True)
        if then == "restart":
            run.restart()
        elif then == "tick":
            # The wall clock a little past the newest record kept: it may fire timers and expire keys.
            kept = [t for _, t, bad in rows[:end] if not bad]
            at = (max(kept) if kept else 0) + 7
            run.advance(pd.Timestamp(at, unit="s", tz="UTC"))
            for p in events:
                events[p].append(("tick", at))
    return run, events, detected


@settings(max_examples=200, deadline=None)
@given(histories())
def test_timers_fire_as_one_pass_would_whatever_the_batches_failures_restarts_and_ticks(case):
    run, events, _ = replay(SILENCE, case)
    expected = sorted(f for p in events for f in silence_reference(events[p]))
    assert fired_of(run) == expected


@pytest.mark.parametrize("detector", [COUNT, COUNT_TYPED], ids=["untyped", "typed"])
@settings(max_examples=150, deadline=None)
@given(histories())
def test_keys_expire_as_one_pass_would_whatever_the_batches_failures_restarts_and_ticks(detector, case):
    run, events, detected = replay(detector, case)
    held, live, found = counts_of(run), {}, []
    for p in events:
        state, now, f = count_reference(events[p])
        found += f
        assert {k: n for k, n in held.items() if run.partition_of(k) == p}.items() <= {k: n for k, (n, _) in state.items()}.items()
        live |= {k: n for k, (n, seen) in state.items() if seen + TTL >= now}
    assert sorted(detected) == sorted(found)
    # A key the pass finds expired may be held until a sweep drops it; a live one is held.
    assert live.items() <= held.items()
