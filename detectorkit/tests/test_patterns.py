"""A record, then another within a time, per key: examples, and one pass over the records whatever
the batches, restarts and partitions, against a reference written from the definitions alone."""

import dataclasses
from itertools import pairwise

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectorkit import patterns
from detectorkit.testing import DetectorHarness

T0 = 1_795_000_000_000


def frame(rows, start=0):
    """rows: (key, seconds after T0, type[, amount])"""
    return pd.DataFrame(
        {
            "key": [r[0] for r in rows],
            "event_time": pd.to_datetime([T0 + round(r[1] * 1000) for r in rows], unit="ms", utc=True),
            "type": [r[2] for r in rows],
            "amount": [float(r[3]) if len(r) > 3 else 0.0 for r in rows],
        },
        index=pd.RangeIndex(start, start + len(rows)),
    )


@dataclasses.dataclass(frozen=True)
class Config:
    min_amount: float = 1000.0
    within_seconds: float = 600.0


RESET_THEN_TRANSFER = patterns.followed_by(
    "reset-then-transfer",
    first=lambda r: r["type"] == "reset",
    then=lambda r, config: (r["type"] == "transfer") & (r["amount"] > config.min_amount),
    within_seconds=lambda config: config.within_seconds,
    grace_seconds=60,
    config=Config,
    required_fields=("type", "amount"),
)


def test_a_reset_then_a_large_transfer_within_ten_minutes_is_one_detection_on_the_transfer():
    run = DetectorHarness(RESET_THEN_TRANSFER)
    found = run.batch(frame([("c-1", 0, "reset"), ("c-1", 100, "transfer", 50), ("c-1", 200, "transfer", 5000), ("c-1", 300, "transfer", 9000)]))
    assert found.to_dict(orient="index") == {2: {"key": "c-1", "first_ms": T0, "then_ms": T0 + 200_000}}  # once: the reset is matched


def test_a_transfer_more_than_ten_minutes_after_the_reset_is_no_match_and_settings_move_the_bounds():
    rows = [("c-1", 0, "reset"), ("c-1", 601, "transfer", 5000), ("c-2", 0, "reset"), ("c-2", 500, "transfer", 900)]
    assert DetectorHarness(RESET_THEN_TRANSFER).batch(frame(rows)).empty
    wider = DetectorHarness(RESET_THEN_TRANSFER, Config(min_amount=500, within_seconds=700)).batch(frame(rows))
    assert wider["key"].tolist() == ["c-1", "c-2"]


def test_a_reset_that_arrives_after_the_transfer_it_precedes_within_the_grace_is_matched_on_the_reset():
    run = DetectorHarness(RESET_THEN_TRANSFER)
    assert run.batch(frame([("c-1", 100, "transfer", 5000)])).empty
    found = run.batch(frame([("c-1", 70, "reset")], start=1))  # 30 s late, within the 60 s grace
    assert found.to_dict(orient="index") == {1: {"key": "c-1", "first_ms": T0 + 70_000, "then_ms": T0 + 100_000}}
    assert run.batch(frame([("c-2", 200, "transfer", 5000), ("c-2", 100, "reset")], start=2)).empty  # 100 s late: dropped


def test_state_survives_a_restart_and_a_quiet_key_is_forgotten():
    run = DetectorHarness(RESET_THEN_TRANSFER)
    run.batch(frame([("c-1", 0, "reset")]))
    run.restart()
    assert run.batch(frame([("c-1", 300, "transfer", 5000)], start=1)).index.tolist() == [1]
    assert RESET_THEN_TRANSFER.state.ttl_seconds == 3600


# ---- one pass ------------------------------------------------------------------------------------


def reference(rows, partition_of, within, grace, ttl):
    """(n, first, then) of every match in one pass, record by record: a then-record matches the
    earliest unmatched first-record in [t - within, t]; a first-record the earliest unmatched
    then-record in [t, t + within] (it came late); a record older than its key's newest counted one
    by more than the grace is dropped; a key quiet for longer than the TTL starts afresh."""
    parts, keys, found = {}, {}, []
    for n, (key, t, kind) in enumerate(rows):
        p = partition_of(key)
        now = parts[p] = max(parts.get(p, t), t)
        k = keys.get(key)
        if k is None or now - k["seen"] > ttl:
            k = keys[key] = {"seen": t, "firsts": [], "thens": [], "newest": None}
        k["seen"] = max(k["seen"], t)
        is_a, is_b = "a" in kind, "b" in kind
        if not (is_a or is_b) or (k["newest"] is not None and t < k["newest"] - grace):
            continue
        matched = False
        if is_b:
            can = [a for a in k["firsts"] if t - within <= a <= t]
            if can:
                k["firsts"].remove(min(can))
                found.append((n, min(can), t))
                matched = True
        if is_a:
            can = [b for b in k["thens"] if t <= b <= t + within]
            if can:
                k["thens"].remove(min(can))
                found.append((n, t, min(can)))
            else:
                k["firsts"].append(t)
        if is_b and not matched:
            k["thens"].append(t)
        k["newest"] = t if k["newest"] is None else max(k["newest"], t)
    return sorted(found)


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(st.tuples(st.sampled_from("xyz"), st.integers(-4, 6), st.sampled_from(["a", "b", "ab", "-"])), min_size=5, max_size=60),
    cuts=st.lists(st.integers(1, 60), max_size=8),
    restarts=st.lists(st.booleans(), min_size=9, max_size=9),
    partitions=st.integers(1, 2),
    grace=st.sampled_from([0, 3]),
)
def test_matches_are_one_pass_whatever_the_batches_restarts_and_partitions(steps, cuts, restarts, partitions, grace):
    rows, now = [], 0
    for key, step, kind in steps:
        now = max(0, now + step)
        rows.append((key, now, kind))  # times mostly forward, now and then back a few seconds
    within, retention = 5, 5 + grace
    rule = patterns.followed_by(
        "seq",
        first=lambda r: r["type"].str.contains("a"),
        then=lambda r: r["type"].str.contains("b"),
        within_seconds=within,
        grace_seconds=grace,
        retention_seconds=retention,
    )
    run = DetectorHarness(rule, partitions=partitions)
    got = []
    bounds = sorted({0, len(rows), *(c for c in cuts if c < len(rows))})
    for n, (lo, hi) in enumerate(pairwise(bounds)):
        if restarts[n]:
            run.restart()
        out = run.batch(frame(rows[lo:hi], start=lo))
        got += [(int(i), int(r["first_ms"] - T0) // 1000, int(r["then_ms"] - T0) // 1000) for i, r in out.iterrows()]
    assert sorted(got) == reference(rows, run.partition_of, within, grace, retention)


def test_a_rule_that_needs_its_config_refuses_one_without_defaults():
    @dataclasses.dataclass(frozen=True)
    class NoDefaults:
        limit: float

    with pytest.raises(TypeError, match="needs a default for every field"):
        patterns.followed_by("x", first=lambda r, c: r["a"] > c.limit, then=lambda r: r["b"], within_seconds=60, config=NoDefaults)
