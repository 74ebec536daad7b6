"""The commonest rules as array operations (`windows.vectorised`) give what the engine gives, batch
by batch: the same detections, the same state written and read back, the same late records; for
counts, sums, means and distinct counts of several fields, records back in time under a sliding
window (those keys go to the engine) and sums of fractions (exact through integers, as the
engine's are)."""

import math
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectorkit import windows as w
from detectorkit.testing import DetectorHarness
from detectorkit.windows import rule as engine
from detectorkit.windows import vectorised

from .test_single_pass import batch_by_batch, frame


@pytest.fixture(autouse=True)
def _arrays_not_compiled():
    """The arrays, not the compiled window that runs their sliding shapes first (`test_compiled`)."""
    with mock.patch.object(engine, "COMPILED", False):
        yield


WINDOWS = st.one_of(
    st.builds(w.Sliding, st.sampled_from([5, 10]), st.sampled_from([0, 3])),
    st.builds(w.Tumbling, st.sampled_from([5, 10]), st.sampled_from([0, 3])),
)
# (window, aggregate, emit, a where filter): one count or sum on reaching a threshold, or counts,
# sums, means and distinct counts of any fields for every record (a model's features).
AGGREGATES = {
    "n": w.Count(),
    "spent": w.Sum("amount"),
    "mean": w.Mean("amount"),
    "amounts": w.DistinctCount("amount"),
    "statuses": w.DistinctCount("status"),
}
SHAPES = st.one_of(
    st.tuples(WINDOWS, st.sampled_from([w.Count(), w.Sum("amount")]), st.sampled_from([w.Every(), w.AtLeast(2), w.AtLeast(4)]), st.booleans()),
    st.tuples(
        WINDOWS,
        st.sets(st.sampled_from(sorted(AGGREGATES)), min_size=1).map(lambda names: {n: AGGREGATES[n] for n in sorted(names)}),
        st.just(w.Every()),
        st.booleans(),
    ),
)

ROWS = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.integers(0, 30_000),
        st.sampled_from([-2, 1, 3, 5, 0.5, 0.1, 19.99, -0.3, 1e-3, 1e15]),
        st.sampled_from(["failed", "ok"]),
    ),
    min_size=20,
    max_size=60,
)


def run(shape, rows, cuts, restarts, on):
    window, aggregate, emit, where = shape
    detector = w.detector("rule", window, aggregate, emit, where=(lambda r: r["status"] == "failed") if where else None)
    with mock.patch.object(engine, "VECTORISED", on):
        steps = batch_by_batch(DetectorHarness(detector), rows, cuts, restarts)
    return [(sorted(map(tuple, found)), state, late) for found, _, state, late in steps]


@settings(max_examples=300, deadline=None)
@given(
    shape=SHAPES,
    rows=ROWS,
    cuts=st.lists(st.integers(0, 60), max_size=8),
    restarts=st.lists(st.booleans(), min_size=9, max_size=9),
    whole=st.booleans(),
)
def test_the_arrays_answer_and_keep_state_as_the_engine_does(shape, rows, cuts, restarts, whole):
    if whole:
        rows = [(k, t, round(v), s) for k, t, v, s in rows]
    rows = sorted(rows, key=lambda r: r[1] // 4_000)  # roughly in time, with disorder within 4 s (some past the grace)
    assert run(shape, rows, cuts, restarts, on=True) == run(shape, rows, cuts, restarts, on=False)


def test_the_arrays_run_the_burst_rule_and_leave_a_key_back_in_time_to_the_engine():
    """Without this the test above could pass with the arrays never used."""
    detector = w.detector("burst", w.Sliding(10, grace_seconds=3), w.Count(), w.AtLeast(3))
    rows = [("a", 0, 1, "ok"), ("a", 1_000, 1, "ok"), ("b", 5_000, 1, "ok"), ("b", 4_000, 1, "ok"), ("a", 2_000, 1, "ok"), ("b", 6_000, 1, "ok")]
    real, returned = vectorised.detect, []
    with mock.patch.object(vectorised, "detect", side_effect=lambda *a: returned.append(real(*a)) or returned[-1]):
        found = DetectorHarness(detector).batch(frame(rows))
    [(arrays_found, _, slow, _)] = returned
    assert arrays_found["index"].tolist() == [4] and list(slow) == ["b"]
    assert found.index.tolist() == [4, 5] and found["count"].tolist() == [3, 3]


def test_the_arrays_add_fractions_exactly_as_the_engine_does_and_run_a_models_features():
    """Sums of amounts with cents, a count, a sum, a mean and a distinct count for every record: the arrays' answers,
    each sum the correctly rounded sum of the window's amounts, as math.fsum gives it (not a float
    running sum, which drifts)."""
    aggregates = {"n": w.Count(), "spent": w.Sum("amount"), "mean": w.Mean("amount"), "statuses": w.DistinctCount("status")}
    detector = w.detector("spend", w.Sliding(10), aggregates, w.Every())
    rows = [("a", 0, 0.1, "ok"), ("a", 1_000, 0.2, "failed"), ("a", 2_000, 19.99, "ok"), ("a", 20_000, 1e-3, "ok")]
    rows += [("b", 500, 1e15, "ok"), ("b", 600, 0.3, "ok"), ("b", 700, -1e15, "ok")]
    real, returned = vectorised.detect, []
    with mock.patch.object(vectorised, "detect", side_effect=lambda *a: returned.append(real(*a)) or returned[-1]):
        found = DetectorHarness(detector).batch(frame(rows))
    assert returned[0] is not None and returned[0][2] is None  # the arrays answered, every key
    sums = [[0.1], [0.1, 0.2], [0.1, 0.2, 19.99], [1e-3], [1e15], [1e15, 0.3], [1e15, 0.3, -1e15]]
    assert found["n"].tolist() == [len(s) for s in sums]
    assert found["spent"].tolist() == [math.fsum(s) for s in sums]
    assert found["mean"].tolist() == [math.fsum(s) / len(s) for s in sums]
    assert found["statuses"].tolist() == [1, 2, 2, 1, 1, 1, 1]
    assert found["spent"].iloc[-1] == 0.3 != (1e15 + 0.3) - 1e15  # the float running sum would have lost the cents


def test_sums_the_arrays_cannot_make_exact_go_to_the_engine_with_the_values_already_read():
    """Amounts too far apart in magnitude for exact integers: the arrays decline, and the engine
    answers with the value columns (a distinct count's hashes among them) the arrays were given."""
    aggregates = {"n": w.Count(), "spent": w.Sum("amount"), "statuses": w.DistinctCount("status")}
    detector = w.detector("spend", w.Sliding(10), aggregates, w.Every())
    rows = [("a", 0, 1e300, "ok"), ("a", 1_000, 1e-300, "failed"), ("a", 2_000, -1e300, "ok"), ("b", 500, 0.5, "ok")]
    real, returned = vectorised.detect, []
    with mock.patch.object(vectorised, "detect", side_effect=lambda *a: returned.append(real(*a)) or returned[-1]):
        found = DetectorHarness(detector).batch(frame(rows))
    assert returned == [None]
    with mock.patch.object(engine, "VECTORISED", False):
        assert found.equals(DetectorHarness(detector).batch(frame(rows)))
    assert found["spent"].tolist() == [1e300, 1e300, 1e-300, 0.5]
    assert found["statuses"].tolist() == [1, 2, 2, 1]


def test_the_arrays_new_state_comes_in_the_order_of_the_batchs_keys_new_ones_among_held_ones():
    """The runner takes a new state in the order of the batch's keys as it is, and looks each key
    up otherwise: the arrays keep that order, whichever keys were held before."""
    detector = w.detector("spend", w.Sliding(10), {"n": w.Count(), "spent": w.Sum("amount")}, w.Every())
    harness = DetectorHarness(detector)
    harness.batch(frame([("a", 0, 1, "ok"), ("b", 100, 2, "ok")]))
    real, returned = vectorised.detect, []
    with mock.patch.object(vectorised, "detect", side_effect=lambda *a: returned.append(real(*a)) or returned[-1]):
        second = [("c", 1_000, 1, "ok"), ("b", 1_100, 1, "ok"), ("d", 1_200, 1, "ok"), ("a", 1_300, 1, "ok"), ("c", 1_400, 1, "ok")]
        found = harness.batch(frame(second))
    [(_, new_state, slow, _)] = returned
    assert slow is None and new_state.index.tolist() == ["c", "b", "d", "a"]
    assert found["n"].tolist() == [1, 2, 1, 2, 2]
