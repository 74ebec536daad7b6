"""Windows as a detector: the answers of one pass over the records, whatever the batches, restarts and
partitions, against a reference written from the definitions alone; and the rules a data scientist
writes with them."""

import dataclasses
import math

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectorkit import windows as w
from detectorkit.testing import DetectorHarness

T0 = 1_795_000_000_000


def frame(rows, start=0):
    """rows: (key, ms after T0, value[, status]) -> records as the runtime hands them to a stateful detector."""
    return pd.DataFrame(
        {
            "key": [r[0] for r in rows],
            "event_time": pd.to_datetime([T0 + r[1] for r in rows], unit="ms", utc=True),
            "amount": [float(r[2]) for r in rows],
            "status": [r[3] if len(r) > 3 else "failed" for r in rows],
        },
        index=pd.RangeIndex(start, start + len(rows)),
    )


def shortest_kept(name, window, aggregate, emit, **options):
    """A window detector that forgets a quiet key as soon as no window can take its records, so the
    properties see keys expire (the references' `admitted` TTL) within the seconds they span."""
    reach = window.gap_seconds if isinstance(window, w.Session) else window.seconds
    return w.detector(name, window, aggregate, emit, retention_seconds=reach + window.grace_seconds, **options)


def in_batches(detector, rows, cuts, restarts, partitions, fired=False):
    """`rows` through the harness in batches cut at `cuts`, restarting before the n-th batch where
    `restarts[n]` says: the harness and each batch's detections, or with `fired` what timers
    detected after each (Final() emits from timers only: the batches detect nothing themselves)."""
    harness = DetectorHarness(detector, partitions=partitions)
    out = []
    bounds = sorted({0, len(rows), *(c for c in cuts if c < len(rows))})
    for n, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        if restarts[n % len(restarts)]:
            harness.restart()
        found = harness.batch(frame(rows[lo:hi], start=lo))
        if fired:
            assert found.empty
        out.append(harness.take_fired() if fired else found)
    return harness, out


def admitted(
    window,
    rows,
    partition_of,
    where,
    counted,
    forget,
    partition_time,
    held=lambda key: False,
    before=lambda p, mark: None,
    closed=lambda key, at: False,
):
    """The records one pass counts, from the definitions, each yielded as (n, key, time) once it is
    in counted[key]: a record older than its key's newest counted one by more than the grace is
    dropped, and so is one `closed` says would join a window already closed; a key whose newest
    record (counted or not) is more than window (a session's gap) + grace behind its partition's
    time starts afresh (the runtime's TTL), unless `held`; `before(partition, time)` runs before
    each record, with the partition's time it brings."""
    grace = round(window.grace_seconds * 1000)
    reach = window.gap_seconds if isinstance(window, w.Session) else window.seconds
    ttl = int((reach + window.grace_seconds) * 1000)
    seen = {}
    for n, row in enumerate(rows):
        key, at, value = row[0], T0 + row[1], float(row[2])
        p = partition_of(key)
        mark = max(partition_time.get(p, -math.inf), at)
        before(p, mark)
        if key in seen and mark - seen[key] > ttl and not held(key):
            counted.pop(key, None), forget(key)
        partition_time[p] = mark
        seen[key] = max(seen.get(key, at), at)
        if not where(row):
            continue
        mine = counted.setdefault(key, [])
        if mine and at < max(t for t, _ in mine) - grace or closed(key, at):
            continue
        mine.append((at, value))
        yield n, key, at


def reference(window, aggregate, emit, rows, partition_of, where=lambda row: True):
    """One pass, record by record, from the definitions: a record older than its key's newest counted
    one by more than the grace is dropped; a window's aggregate is over the key's counted records so
    far within it; AtLeast emits when a window first reaches the threshold (a sliding window: not
    again for the key within a window's length). Which records count: `admitted`."""
    size = round(window.seconds * 1000)
    counted, emitted, out = {}, {}, []
    for n, key, at in admitted(window, rows, partition_of, where, counted, lambda key: emitted.pop(key, None), {}):
        mine = counted[key]
        if isinstance(window, w.Sliding):
            spans = [(at - size, at)]
        elif isinstance(window, w.Tumbling):
            spans = [(at // size * size, at // size * size + size)]
        else:
            hop = round(window.hop_seconds * 1000)
            spans = sorted((s, s + size) for s in range(at // hop * hop, at - size, -hop))
        made = None
        for start, end in spans:
            inside = [v for t, v in mine if (start <= t <= end if isinstance(window, w.Sliding) else start <= t < end)]
            result = AGGREGATE_OF[type(aggregate)](inside)
            if isinstance(emit, w.Every):
                made = (start, end, float(result))
                break
            if result < emit.threshold:
                continue
            done = emitted.setdefault(key, [])
            if isinstance(window, w.Sliding):
                if done and at - done[-1] <= size:
                    break
                done[:] = [at]
                made = (start, end, float(result))
                break
            if start not in done:
                done.append(start)
                made = made or (start, end, float(result))
        if made is not None:
            out.append((n, *made))
    return out


AGGREGATES = st.sampled_from([w.Count(), w.Sum("amount"), w.Min("amount"), w.Max("amount"), w.Mean("amount"), w.DistinctCount("amount")])


AGGREGATE_OF = {
    w.Count: len,
    w.Sum: sum,
    w.Min: min,
    w.Max: max,
    w.Mean: lambda vs: sum(vs) / len(vs),
    w.DistinctCount: lambda vs: len(set(vs)),
}


def reference_final(window, aggregate, rows, partition_of, where=lambda row: True):
    """Final(), from the definitions: a key's window closes once its partition's time reaches the
    window's end and grace (before the record that brings it there, and after the last record);
    its aggregate is over the key's counted records that reached it, each window once. A key with a
    window still open is held past the TTL; a record older than its key's newest by more than the
    grace is dropped. (key, start, end, aggregate) of each window, in no order."""
    size, grace = round(window.seconds * 1000), round(window.grace_seconds * 1000)
    hop = round(window.hop_seconds * 1000) if isinstance(window, w.Hopping) else size
    partition_time, counted, closed, out = {}, {}, {}, []

    def spans(at):
        return [(s, s + size) for s in range(at // hop * hop, at - size, -hop)]

    def open_spans(key):
        return sorted({sp for at, _ in counted.get(key, []) for sp in spans(at)} - {sp for sp in closed.get(key, set())})

    def fire(p, upto):
        for key in [k for k in counted if partition_of(k) == p]:
            for start, end in open_spans(key):
                if end + grace <= upto:
                    inside = [v for at, v in counted[key] if start <= at < end]
                    out.append((key, start, end, float(AGGREGATE_OF[type(aggregate)](inside))))
                    closed.setdefault(key, set()).add((start, end))

    for _ in admitted(window, rows, partition_of, where, counted, lambda key: closed.pop(key, None), partition_time, held=open_spans, before=fire):
        pass
    for p, upto in partition_time.items():
        fire(p, upto)
    return sorted(out)


@settings(max_examples=200, deadline=None)
@given(
    window=st.one_of(
        st.builds(w.Tumbling, st.sampled_from([5, 10]), st.sampled_from([0, 3])),
        st.builds(w.Hopping, st.just(10), st.sampled_from([5, 10]), st.sampled_from([0, 3])),
        st.builds(w.Session, st.sampled_from([2, 5]), st.sampled_from([0, 3])),
    ),
    aggregate=AGGREGATES,
    rows=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 30_000), st.integers(-2, 5), st.sampled_from(["failed", "ok"])),
        min_size=20,
        max_size=60,
    ),
    cuts=st.lists(st.integers(0, 60), min_size=2, max_size=8),
    restarts=st.lists(st.booleans(), min_size=9, max_size=9),
    partitions=st.integers(1, 2),
    where=st.booleans(),
)
def test_final_windows_and_sessions_close_as_one_pass_closes_them_whatever_the_batches(window, aggregate, rows, cuts, restarts, partitions, where):
    rows = sorted(rows, key=lambda r: r[1] // 4_000)
    pick = (lambda records: records["status"] == "failed") if where else None
    harness, fired = in_batches(shortest_kept("closing", window, aggregate, w.Final(), where=pick), rows, cuts, restarts, partitions, fired=True)
    got = sorted((str(k), int(r["window_start_ms"]), int(r["window_end_ms"]), float(r[aggregate.name])) for f in fired for k, r in f.iterrows())
    close = reference_sessions_final if isinstance(window, w.Session) else reference_final
    expected = close(window, aggregate, rows, harness.partition_of, where=failed_only if where else everything)
    assert got == [(k, s, e, pytest.approx(v)) for k, s, e, v in expected]


def answers(detections, aggregate):
    return sorted((int(i), int(r["window_start_ms"]), int(r["window_end_ms"]), float(r[aggregate.name])) for i, r in detections.iterrows())


WINDOWS = st.one_of(
    st.builds(w.Sliding, st.sampled_from([5, 10]), st.sampled_from([0, 3])),
    st.builds(w.Tumbling, st.sampled_from([5, 10]), st.sampled_from([0, 3])),
    st.builds(w.Hopping, st.just(10), st.sampled_from([5, 10]), st.sampled_from([0, 3])),
    st.builds(w.Session, st.sampled_from([2, 5]), st.sampled_from([0, 3])),
)


# Sessions joined this property with the 300 examples they had alone.
@settings(max_examples=600, deadline=None)
@given(
    window=WINDOWS,
    aggregate=AGGREGATES,
    every=st.booleans(),
    threshold=st.sampled_from([2, 3, 5]),
    rows=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 30_000), st.integers(-2, 5), st.sampled_from(["failed", "ok"])),
        min_size=20,
        max_size=60,
    ),
    cuts=st.lists(st.integers(0, 60), min_size=2, max_size=8),
    restarts=st.lists(st.booleans(), min_size=9, max_size=9),
    partitions=st.integers(1, 2),
    where=st.booleans(),
)
def test_a_window_detector_gives_the_single_pass_answers_whatever_the_batches_restarts_and_partitions(
    window, aggregate, every, threshold, rows, cuts, restarts, partitions, where
):
    emit = w.Every() if every and not isinstance(window, w.Hopping) else w.AtLeast(threshold)
    rows = sorted(rows, key=lambda r: r[1] // 4_000)  # roughly in time, with disorder within 4 s (some of it past the grace)
    pick = (lambda records: records["status"] == "failed") if where else None
    detector = shortest_kept("rule", window, aggregate, emit, where=pick)
    harness, found = in_batches(detector, rows, cuts, restarts, partitions)
    got = answers(pd.concat(found) if found else pd.DataFrame(), aggregate) if rows else []
    one_pass = reference_sessions if isinstance(window, w.Session) else reference
    expected = one_pass(window, aggregate, emit, rows, harness.partition_of, where=failed_only if where else everything)
    assert got == [(n, s, e, pytest.approx(v)) for n, s, e, v in expected]


FAILED_LOGINS = w.detector(
    "failed-logins",
    window=w.Sliding(seconds=60),
    aggregate=w.Count(),
    emit=w.AtLeast(5),
    where=lambda records: records["status"] == "failed",
    required_fields=("status",),
)


def test_five_failed_logins_within_a_minute_across_batches_that_hold_only_successful_ones():
    """The filter-first trap: a customer's batch that holds only successful logins keeps the
    failures counted before it."""
    harness = DetectorHarness(FAILED_LOGINS)
    assert harness.batch(frame([("c-1", 0, 0), ("c-1", 5_000, 0), ("c-2", 6_000, 0)])).empty
    assert harness.batch(frame([("c-1", 7_000, 0, "ok"), ("c-1", 8_000, 0, "ok")], start=3)).empty  # successes only
    harness.restart()
    found = harness.batch(frame([("c-1", 9_000, 0), ("c-1", 30_000, 0), ("c-1", 59_000, 0), ("c-1", 61_000, 0)], start=5))
    assert found.index.tolist() == [7] and found.loc[7, "count"] == 5  # the fifth failure within 60 s
    assert harness.batch(frame([("c-1", 62_000, 0)], start=9)).empty  # not again within the window's length


def test_more_than_ten_thousand_eur_per_customer_in_an_hour():
    rule = w.detector("big-spender", window=w.Tumbling(seconds=3600), aggregate=w.Sum("amount"), emit=w.AtLeast(10_000))
    harness = DetectorHarness(rule)
    found = harness.batch(frame([("c-1", 1_000, 6_000), ("c-1", 2_000, 3_000), ("c-1", 3_000, 2_000), ("c-1", 4_000, 500)]))
    assert found.index.tolist() == [2] and found.loc[2, "sum"] == 11_000
    assert found.loc[2, "window_end_ms"] - found.loc[2, "window_start_ms"] == 3_600_000


def test_a_record_later_than_the_grace_is_dropped():
    rule = w.detector("late", window=w.Tumbling(seconds=10, grace_seconds=2), aggregate=w.Count(), emit=w.AtLeast(3))
    harness = DetectorHarness(rule)
    assert harness.batch(frame([("k", 15_000, 0), ("k", 13_500, 0)])).empty  # 1.5 s behind: within the grace, counted
    found = harness.batch(frame([("k", 11_000, 0), ("k", 14_000, 0)], start=2))  # 11 s is 4 s behind: dropped
    assert found.index.tolist() == [3] and found.loc[3, "count"] == 3


def test_a_quiet_keys_windows_are_kept_an_hour_or_the_window_and_grace_if_longer():
    assert FAILED_LOGINS.state.ttl_seconds == 3600
    assert w.detector("x", w.Tumbling(10, grace_seconds=5), w.Count(), w.Every()).state.ttl_seconds == 3600  # an hour by default
    assert w.detector("x", w.Tumbling(7200, grace_seconds=5), w.Count(), w.Every()).state.ttl_seconds == 7205  # at least the window and grace
    assert w.detector("x", w.Tumbling(10, grace_seconds=5), w.Count(), w.Every(), retention_seconds=15).state.ttl_seconds == 15
    with pytest.raises(ValueError, match="at least the window and its grace, 15 s"):
        w.detector("x", w.Tumbling(10, grace_seconds=5), w.Count(), w.Every(), retention_seconds=14)


def test_a_hopping_window_that_would_emit_each_record_once_per_window_is_refused():
    with pytest.raises(TypeError, match="AtLeast"):
        w.detector("x", w.Hopping(10, 5), w.Count(), w.Every())


def failed_only(row):
    return row[3] == "failed"


def everything(row):
    return True


def sessions_of(times, gap):
    """(first, last) of each session: a key's times, sorted, cut wherever two are a gap or more apart."""
    out = []
    for t in sorted(times):
        if out and t - out[-1][1] < gap:
            out[-1][1] = t
        else:
            out.append([t, t])
    return [tuple(s) for s in out]


def reference_sessions(window, aggregate, emit, rows, partition_of, where=lambda row: True):
    """Every() and AtLeast() over sessions, from the definitions: after each counted record, the
    session it is in, over the key's counted records so far; AtLeast emits once per session (a
    session that merged with one that emitted has emitted)."""
    gap = round(window.gap_seconds * 1000)
    counted, emitted, out = {}, {}, []
    for n, key, at in admitted(window, rows, partition_of, where, counted, lambda key: emitted.pop(key, None), {}):
        start, end = next(s for s in sessions_of([t for t, _ in counted[key]], gap) if s[0] <= at <= s[1])
        result = float(AGGREGATE_OF[type(aggregate)]([v for t, v in counted[key] if start <= t <= end]))
        if isinstance(emit, w.Every):
            out.append((n, start, end, result))
        elif result >= emit.threshold and not any(start <= x <= end for x in emitted.get(key, [])):
            emitted.setdefault(key, []).append(at)
            out.append((n, start, end, result))
    return out


def reference_sessions_final(window, aggregate, rows, partition_of, where=lambda row: True):
    """Final() over sessions, from the definitions: a session closes once its partition's time
    reaches its last record + the gap + the grace; a record that would join a closed session is
    dropped; a key with a session open is held past the TTL."""
    gap, grace = round(window.gap_seconds * 1000), round(window.grace_seconds * 1000)
    partition_time, counted, closed, out = {}, {}, {}, []

    def open_sessions(key):
        return [s for s in sessions_of([t for t, _ in counted.get(key, [])], gap) if key not in closed or s[1] > closed[key]]

    def fire(p, upto):
        for key in [k for k in counted if partition_of(k) == p]:
            for start, end in open_sessions(key):
                if end + gap + grace <= upto:
                    inside = [v for at, v in counted[key] if start <= at <= end]
                    out.append((key, start, end, float(AGGREGATE_OF[type(aggregate)](inside))))
                    closed[key] = end

    def joins_closed(key, at):
        return key in closed and at < closed[key] + gap

    for _ in admitted(
        window,
        rows,
        partition_of,
        where,
        counted,
        lambda key: closed.pop(key, None),
        partition_time,
        held=open_sessions,
        before=fire,
        closed=joins_closed,
    ):
        pass
    for p, upto in partition_time.items():
        fire(p, upto)
    return sorted(out)


def test_a_customer_silent_for_ten_minutes_is_a_session_that_closed():
    silence = w.detector("silence", window=w.Session(gap_seconds=600), aggregate=w.Count(), emit=w.Final())
    harness = DetectorHarness(silence)
    harness.batch(frame([("c-1", 0, 0), ("c-2", 1_000, 0), ("c-1", 599_000, 0)]))
    harness.batch(frame([("c-2", 1_200_000, 0)], start=3))  # c-2 back after 20 minutes; c-1 quiet since 599 s
    fired = harness.take_fired()
    assert sorted(fired.index) == ["c-1", "c-2"]
    assert (fired.loc["c-1", "window_start_ms"], fired.loc["c-1", "window_end_ms"], fired.loc["c-1", "count"]) == (T0, T0 + 599_000, 2)
    assert fired.loc["c-2", "count"] == 1
    harness.advance(pd.Timestamp(T0 + 1_800_000, unit="ms", tz="UTC"))
    assert harness.take_fired().index.tolist() == ["c-2"]  # its second session closed too


@dataclasses.dataclass(frozen=True)
class BurstConfig:
    min_records: int = 5
    window_seconds: float = 60.0


def test_a_window_sized_by_a_setting_takes_its_size_and_expiry_from_the_config():
    rule = w.detector(
        "burst",
        window=lambda config: w.Sliding(config.window_seconds),
        aggregate=w.Count(),
        emit=lambda config: w.AtLeast(config.min_records),
        config=BurstConfig,
    )
    assert rule.state.ttl_seconds == 3600  # the defaults': a 60 s window, kept an hour
    assert rule.configured(BurstConfig(window_seconds=5400)).state.ttl_seconds == 5400  # a window past the hour
    configured = rule.configured(BurstConfig(min_records=2, window_seconds=10))
    assert configured.name == "burst" and configured.state.name == rule.state.name
    harness = DetectorHarness(rule, BurstConfig(min_records=2, window_seconds=10))
    assert harness.batch(frame([("c-1", 0, 0), ("c-1", 11_000, 0)])).empty  # 11 s apart: not within 10 s
    assert harness.batch(frame([("c-1", 20_000, 0)], start=2)).index.tolist() == [2]
    with pytest.raises(TypeError, match="needs a default for every field"):
        w.detector("x", window=lambda c: w.Sliding(c.s), aggregate=w.Count(), emit=w.Every(), config=NoDefaults)


@dataclasses.dataclass(frozen=True)
class NoDefaults:
    s: float
