"""Window rules answer as one pass over the records, whatever the batches, restarts and partitions:
every window kind, aggregate and emit, several aggregates and a condition over them, records out
of order within the grace and later than it, against `reference.one_pass`, written from the
definitions alone."""

import math
from unittest import mock

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectorkit import windows as w
from detectorkit.testing import DetectorHarness
from detectorkit.windows import rule as engine
from detectorkit.windows.rule import BUSY

from .reference import one_pass

T0 = 1_795_000_000_000


def frame(rows, start=0):
    """rows: (key, ms after T0, value, status) -> records as the runtime hands them to a stateful detector."""
    return pd.DataFrame(
        {
            "key": [r[0] for r in rows],
            "event_time": pd.to_datetime([T0 + r[1] for r in rows], unit="ms", utc=True),
            "amount": [float(r[2]) for r in rows],
            "status": [r[3] for r in rows],
        },
        index=pd.RangeIndex(start, start + len(rows)),
    )


def in_batches(detector, rows, cuts, restarts, partitions):
    """`rows` through the harness in batches cut at `cuts`, restarting before the n-th batch where
    `restarts[n]` says: the harness, the detections of the records and what timers detected."""
    harness = DetectorHarness(detector, partitions=partitions)
    found, fired = [], []
    bounds = sorted({0, len(rows), *(c for c in cuts if c < len(rows))})
    for n, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        if restarts[n % len(restarts)]:
            harness.restart()
        found.append(harness.batch(frame(rows[lo:hi], start=lo)))
        fired.append(harness.take_fired())
    return harness, [f for f in found if len(f)], [f for f in fired if len(f)]


def batch_by_batch(harness, rows, cuts, restarts):
    """What `harness` answers and holds after each batch of `rows` cut at `cuts`, restarting before
    the n-th batch where `restarts[n]` says: (its detections in order, their types, the state, the
    late records so far)."""
    bounds = sorted({0, len(rows), *(c for c in cuts if c < len(rows))})
    steps = []
    for n, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        if restarts[n % len(restarts)]:
            harness.restart()
        found = harness.batch(frame(rows[lo:hi], start=lo))
        steps.append((found.reset_index().to_numpy().tolist(), list(found.dtypes.astype(str)), harness.state(), harness.late))
    return steps


AGGREGATES = [w.Count(), w.Sum("amount"), w.Min("amount"), w.Max("amount"), w.Mean("amount"), w.DistinctCount("amount"), w.Last("amount")]


@st.composite
def rules(draw, emits):
    """(window, aggregates by name, emit, the condition on a window's row or None, where)."""
    window = draw(
        st.one_of(
            st.builds(w.Sliding, st.sampled_from([5, 10]), st.sampled_from([0, 3])),
            st.builds(w.Tumbling, st.sampled_from([5, 10]), st.sampled_from([0, 3])),
            st.builds(w.Hopping, st.just(10), st.sampled_from([5, 10, 4]), st.sampled_from([0, 3])),
            st.builds(w.Session, st.sampled_from([2, 5]), st.sampled_from([0, 3])),
        )
    )
    chosen = draw(st.lists(st.sampled_from(AGGREGATES), min_size=1, max_size=2, unique_by=lambda a: a.kind))
    aggregates = {a.kind: a for a in chosen}
    name = draw(st.sampled_from(sorted(aggregates)))
    bar = draw(st.sampled_from([2, 3, 5]))
    kind = draw(st.sampled_from(emits))
    if isinstance(window, w.Hopping) and kind == "every":
        kind = "when"
    per = draw(st.sampled_from(["window", "episode"]))
    conditioned = draw(st.booleans())
    condition = (lambda row: row[name] >= bar) if conditioned else None
    having = (lambda frame: frame[name] >= bar) if conditioned else None
    if kind == "every":
        emit, mode = w.Every(having=having), "every"
    elif kind == "when":
        emit, mode = (w.AtLeast(bar, of=name) if conditioned else w.When(lambda f: f[name] >= bar)), "when"
        condition = lambda row: row[name] >= bar  # noqa: E731 - AtLeast and When alike
        if per == "episode":
            emit, mode = (w.AtLeast(bar, of=name, per="episode") if conditioned else w.When(lambda f: f[name] >= bar, per="episode")), "episode"
    elif kind == "silent":
        window = w.Sliding(window.seconds if isinstance(window, w.Sliding | w.Tumbling) else 5, window.grace_seconds)
        emit, mode = w.Silent(draw(st.sampled_from([2, 4])), having=having), "silent"
    else:
        emit, mode = w.Final(having=having, per=per), ("final" if per == "window" else "episode")
    where = draw(st.booleans())
    return window, aggregates, emit, mode, condition, where


ROWS = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 30_000), st.integers(-2, 5), st.sampled_from(["failed", "ok"])),
    min_size=20,
    max_size=60,
)


def check(rule, rows, cuts, restarts, partitions, busy=BUSY):
    """`busy`: above how many records a window keeps its aggregates running (windows.rule.BUSY):
    0, every window's are, through the same records as taken over them."""
    with mock.patch.object(engine, "BUSY", busy):
        _check(rule, rows, cuts, restarts, partitions)


def _check(rule, rows, cuts, restarts, partitions):
    window, aggregates, emit, mode, condition, where = rule
    silence = round(emit.seconds * 1000) if isinstance(emit, w.Silent) else 0
    rows = sorted(rows, key=lambda r: r[1] // 4_000)  # roughly in time, with disorder within 4 s (some of it past the grace)
    reach = window.gap_seconds if isinstance(window, w.Session) else window.seconds
    # Forgets a quiet key as soon as no window can take its records, so keys expire within the seconds the rows span.
    detector = w.detector(
        "rule", window, aggregates, emit, where=(lambda r: r["status"] == "failed") if where else None, retention_seconds=reach + window.grace_seconds
    )
    harness, found, fired = in_batches(detector, rows, cuts, restarts, partitions)
    names = list(aggregates)
    expected_found, expected_fired = one_pass(
        window,
        aggregates,
        mode,
        condition,
        rows,
        harness.partition_of,
        where=(lambda r: r[3] == "failed") if where else (lambda r: True),
        silence_ms=silence,
    )
    got = sorted((int(i), int(r["window_start_ms"]), int(r["window_end_ms"]), *(float(r[n]) for n in names)) for f in found for i, r in f.iterrows())
    assert got == sorted((n, s + T0, e + T0, *map(pytest.approx, aggs)) for n, s, e, *aggs in expected_found)
    extra = ["windows"] if mode == "episode" else []
    got = sorted(
        (str(k), int(r["window_start_ms"]), int(r["window_end_ms"]), *(int(r[x]) for x in extra), *(float(r[n]) for n in names))
        for f in fired
        for k, r in f.iterrows()
    )
    assert got == sorted((k, s + T0, e + T0, *rest[: len(extra)], *map(pytest.approx, rest[len(extra) :])) for k, s, e, *rest in expected_fired)


@settings(max_examples=400, deadline=None)
@given(
    rule=rules(["every", "when"]),
    rows=ROWS,
    cuts=st.lists(st.integers(0, 60), max_size=8),
    restarts=st.lists(st.booleans(), min_size=9, max_size=9),
    partitions=st.integers(1, 2),
    busy=st.sampled_from([0, BUSY]),
)
def test_rules_that_emit_as_records_come_answer_as_one_pass_whatever_the_batches(rule, rows, cuts, restarts, partitions, busy):
    check(rule, rows, cuts, restarts, partitions, busy)


@settings(max_examples=300, deadline=None)
@given(
    rule=rules(["final", "silent"]),
    rows=ROWS,
    cuts=st.lists(st.integers(0, 60), max_size=8),
    restarts=st.lists(st.booleans(), min_size=9, max_size=9),
    partitions=st.integers(1, 2),
    busy=st.sampled_from([0, BUSY]),
)
def test_rules_that_emit_when_windows_close_answer_as_one_pass_whatever_the_batches(rule, rows, cuts, restarts, partitions, busy):
    check(rule, rows, cuts, restarts, partitions, busy)


def test_the_reference_and_the_rule_agree_on_a_sum_to_the_last_bit():
    """Sums are exact: a threshold on one answers the same whatever order the values came in."""
    values = [0.1] * 10
    assert math.fsum(values) == 1.0 and sum(values) != 1.0
    rule = w.detector("sums", w.Tumbling(60), w.Sum("amount"), w.AtLeast(1.0))
    found = DetectorHarness(rule).batch(frame([("a", i * 1000, 0.1, "ok") for i in range(10)]))
    assert found.index.tolist() == [9] and found.loc[9, "sum"] == 1.0
