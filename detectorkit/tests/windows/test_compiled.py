"""A sliding window emitted at every record, compiled on the store's columns (`windows.compiled`),
answers as the engine does, batch by batch: the same detections, state written and read back, late
records and expiry; counts, sums, means and distinct counts, records back in time within the grace
and past it, keys that expire between their records, restarts; values whose exact sums it cannot
hold go to the engine. One pass's answers are `test_single_pass`'s, which runs it too."""

import json
import math
import subprocess
import sys
import textwrap
from unittest import mock

import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

from detectorkit import windows as w
from detectorkit.state import runner
from detectorkit.testing import DetectorHarness
from detectorkit.windows import compiled
from detectorkit.windows import rule as engine

from .test_single_pass import batch_by_batch, frame
from .test_vectorised import AGGREGATES

RULES = st.tuples(
    st.builds(w.Sliding, st.sampled_from([2, 5, 10]), st.sampled_from([0, 3])),
    st.sets(st.sampled_from(sorted(AGGREGATES)), min_size=1).map(lambda names: {n: AGGREGATES[n] for n in sorted(names)}),
    st.sampled_from([None, 0, 20]),  # seconds kept past the window and grace (None: the default hour)
)
ROWS = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.integers(0, 40_000),
        st.sampled_from([-2, 1, 3, 5, 0.5, 0.1, 19.99, -0.3, 1e-3, 1e15, -1e15]),
        st.sampled_from(["failed", "ok", "held"]),
    ),
    min_size=1,
    max_size=80,
)


def run(rule, rows, cuts, restarts, partitions, on):
    window, aggregates, kept = rule
    retention = None if kept is None else window.seconds + window.grace_seconds + kept
    detector = w.detector("rule", window, aggregates, w.Every(), retention_seconds=retention)
    with mock.patch.object(engine, "COMPILED", on), mock.patch.object(engine, "VECTORISED", False):
        return batch_by_batch(DetectorHarness(detector, partitions=partitions), rows, cuts, restarts)


@settings(max_examples=300, deadline=None)
@given(
    rule=RULES,
    rows=ROWS,
    cuts=st.lists(st.integers(0, 80), max_size=8),
    restarts=st.lists(st.booleans(), min_size=9, max_size=9),
    partitions=st.integers(1, 2),
    disorder=st.sampled_from([1, 4_000, 20_000]),
)
def test_the_compiled_window_answers_and_keeps_state_as_the_engine_does(rule, rows, cuts, restarts, partitions, disorder):
    # Roughly in time, with disorder within `disorder` ms: some of it back in time within the
    # grace, some past it, and with 20 s gaps, keys that expire between their records.
    rows = sorted(rows, key=lambda r: r[1] // disorder)
    assert run(rule, rows, cuts, restarts, partitions, on=True) == run(rule, rows, cuts, restarts, partitions, on=False)


def calls_of_compiled():
    real, calls = compiled.sliding_every, []
    return mock.patch.object(compiled, "sliding_every", side_effect=lambda *a: calls.append(real(*a)) or calls[-1]), calls


def test_the_compiled_window_runs_a_models_features_with_exact_sums():
    """Without this the test above could pass with the compiled code never run: it runs, and its
    sums are math.fsum's (a float running sum would lose the cents beside 1e15)."""
    aggregates = {"n": w.Count(), "spent": w.Sum("amount"), "mean": w.Mean("amount"), "statuses": w.DistinctCount("status")}
    detector = w.detector("spend", w.Sliding(10, grace_seconds=3), aggregates, w.Every())
    rows = [("a", 0, 0.1, "ok"), ("a", 1_000, 0.2, "failed"), ("a", 2_000, 19.99, "ok"), ("a", 1_500, 0.5, "ok"), ("a", 20_000, 1e-3, "ok")]
    rows += [("b", 500, 1e15, "ok"), ("b", 600, 0.3, "ok"), ("b", 700, -1e15, "ok")]
    patch, calls = calls_of_compiled()
    with patch:
        found = DetectorHarness(detector).batch(frame(rows))
    assert [c[0] for c in calls] == [compiled.OK]
    sums = [[0.1], [0.1, 0.2], [0.1, 0.2, 19.99], [0.1, 0.2, 0.5], [1e-3], [1e15], [1e15, 0.3], [1e15, 0.3, -1e15]]
    assert found["n"].tolist() == [len(s) for s in sums]
    assert found["spent"].tolist() == [math.fsum(s) for s in sums]
    assert found["mean"].tolist() == [math.fsum(s) / len(s) for s in sums]
    assert found["statuses"].tolist() == [1, 2, 2, 2, 1, 1, 1, 1]
    assert found["spent"].iloc[-1] == 0.3 != (1e15 + 0.3) - 1e15


def test_values_near_a_floats_limits_go_to_the_engine():
    """Values whose partials could overflow on the way to an exact sum: it declines before it runs,
    and the engine answers."""
    detector = w.detector("spend", w.Sliding(1000), {"n": w.Count(), "spent": w.Sum("amount")}, w.Every())
    amounts = [1e300, 1e-300, 1e301]
    rows = [("a", i, x, "ok") for i, x in enumerate(amounts)]
    patch, calls = calls_of_compiled()
    with patch:
        found = DetectorHarness(detector).batch(frame(rows))
    assert calls == []
    with mock.patch.object(engine, "COMPILED", False):
        assert found.equals(DetectorHarness(detector).batch(frame(rows)))
    assert found["spent"].tolist() == [math.fsum(amounts[: i + 1]) for i in range(3)]


def test_a_key_expires_between_its_records_where_the_partitions_time_passed_its_newest_by_the_ttl():
    """A key's state goes once the partition's event time (another key's record) is more than the
    TTL past the key's newest record, even between two of its records in one batch, and not a
    millisecond before: the record after that counts alone."""
    detector = w.detector("spend", w.Sliding(5, grace_seconds=3), {"n": w.Count()}, w.Every(), retention_seconds=8)
    for other, alone in ((8_000, False), (8_001, True)):
        rows = [("a", 0, 1, "ok"), ("b", other, 1, "ok"), ("a", 1_000, 1, "ok")]
        patch, calls = calls_of_compiled()
        with patch:
            found = DetectorHarness(detector).batch(frame(rows))
        assert [c[0] for c in calls] == [compiled.OK]
        assert found["n"].tolist() == [1, 1, 1 if alone else 2]
        with mock.patch.object(engine, "COMPILED", False):
            assert found.equals(DetectorHarness(detector).batch(frame(rows)))


def test_a_compiled_run_that_fails_leaves_the_engine_to_answer_and_says_so_once():
    """numba unable to compile here, or any error of the compiled run: each batch is answered by
    the engine as if the compiled window were off, and the log says why once, not once a batch."""
    detector = w.detector("said-once", w.Sliding(10), {"n": w.Count(), "spent": w.Sum("amount")}, w.Every())
    batches = [frame([("a", 0, 1, "ok"), ("b", 500, 2, "ok")]), frame([("a", 1_000, 3, "ok"), ("a", 2_000, 4, "ok")])]
    harness, plain = DetectorHarness(detector), DetectorHarness(detector)
    broken = mock.patch.object(compiled, "sliding_every_of", side_effect=RuntimeError("cannot cache"))
    with broken, mock.patch.object(runner, "_TOLD", set()), structlog.testing.capture_logs() as logs:
        found = [harness.batch(b) for b in batches]
    with mock.patch.object(engine, "COMPILED", False):
        expected = [plain.batch(b) for b in batches]
    assert all(a.equals(b) for a, b in zip(found, expected, strict=True)) and found[1]["n"].tolist() == [2, 3]
    assert [(e["detector"], e["error"]) for e in logs if e["log_level"] == "warning"] == [("said-once", "RuntimeError: cannot cache")]


WARMED_THEN_RUN = textwrap.dedent(
    """
    import json, pandas as pd
    from detectorkit import windows as w
    from detectorkit.state import compiled_rows
    from detectorkit.testing import DetectorHarness
    from detectorkit.windows import compiled

    aggregates = {"n": w.Count(), "spent": w.Sum("amount"), "mean": w.Mean("amount"), "statuses": w.DistinctCount("status")}
    detector = w.detector("warm", w.Sliding(10), aggregates, w.Every())
    kernels = (compiled.sliding_every, compiled_rows.gather, compiled_rows.scatter)
    detector.warm()
    warmed = [sorted(map(str, k.signatures)) for k in kernels]
    at = pd.to_datetime([1_000, 2_000, 3_000], unit="ms", utc=True)
    records = pd.DataFrame({"key": ["a", "b", "a"], "event_time": at, "amount": [1.5, 2.0, 3.0], "status": ["ok", "ok", "failed"]})
    found = DetectorHarness(detector).batch(records)
    print(json.dumps({"warmed": warmed, "after": [sorted(map(str, k.signatures)) for k in kernels], "n": found["n"].tolist()}))
    """
)


def test_a_warmed_worker_has_nothing_left_to_load_at_its_first_batch():
    """A worker warms a compiled window before its first task (`Detector.warm`, run by the job's
    start): in a fresh process, the compiled code a batch then runs is all of it already loaded,
    each kernel with the very types the batch calls it with."""
    out = subprocess.run([sys.executable, "-c", WARMED_THEN_RUN], capture_output=True, text=True, check=True, timeout=300)
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["n"] == [1, 1, 2]
    assert all(got["warmed"]) and got["after"] == got["warmed"]
