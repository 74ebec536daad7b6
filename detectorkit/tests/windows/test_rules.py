"""Window rules as a data scientist writes them: examples of each piece, through the harness (the
properties that hold them to one pass are `test_single_pass`)."""

import dataclasses

import pandas as pd
import pytest

from detectorkit import windows as w
from detectorkit.testing import DetectorHarness

T0 = 1_794_999_600_000  # on the hour: tumbling windows of a minute or five start at T0


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


def test_a_record_late_within_the_grace_counts_in_the_sliding_windows_of_later_records():
    """Card times 0, 100, 300, 250, 270 s with a 60 s grace: the window that ends at the record of
    300 s takes the two late ones, and holds 5 records within 10 min (Kafka Streams' SlidingWindows)."""
    rule = w.detector("velocity", w.Sliding(600, grace_seconds=60), w.Count(), w.AtLeast(5))
    found = DetectorHarness(rule).batch(frame([("card", s * 1000, 0) for s in (0, 100, 300, 250, 270)]))
    assert found.index.tolist() == [4]  # the record of 270 s completes it
    assert found.loc[4, ["window_start_ms", "window_end_ms", "count"]].tolist() == [T0 - 300_000, T0 + 300_000, 5]


def test_several_aggregates_and_a_condition_over_them():
    rule = w.detector(
        "spree",
        w.Tumbling(3600),
        {"n": w.Count(), "total": w.Sum("amount"), "shops": w.DistinctCount("status")},
        w.When(lambda windows: (windows["n"] >= 3) & (windows["total"] > 1000) & (windows["shops"] >= 2)),
    )
    rows = [("c-1", 0, 600, "s-1"), ("c-1", 1, 300, "s-1"), ("c-1", 2, 200, "s-1"), ("c-1", 3, 50, "s-2"), ("c-1", 4, 10, "s-3")]
    found = DetectorHarness(rule).batch(frame(rows))
    assert found.index.tolist() == [3]  # the third record made 1,100 in one shop only
    assert found.loc[3, ["n", "total", "shops"]].tolist() == [4, 1150.0, 2]


@dataclasses.dataclass(frozen=True)
class Thresholds:
    min_amount: float = 1000.0
    min_total: float = 50_000.0


def test_where_and_the_condition_take_the_config_so_every_threshold_is_a_setting():
    rule = w.detector(
        "merchant-totals",
        w.Tumbling(300, grace_seconds=30),
        w.Sum("amount"),
        w.Final(having=lambda windows, config: windows["sum"] > config.min_total),
        where=lambda records, config: records["amount"] > config.min_amount,
        config=Thresholds,
    )
    harness = DetectorHarness(rule, Thresholds(min_amount=100, min_total=1000))
    harness.batch(frame([("m-1", 1_000, 600), ("m-1", 2_000, 50), ("m-1", 3_000, 500), ("m-2", 4_000, 900)]))
    harness.batch(frame([("m-3", 331_000, 1)], start=4))  # the partition's time passes 300 s and the 30 s grace
    fired = harness.take_fired()
    assert fired.index.tolist() == ["m-1"] and fired.loc["m-1", "sum"] == 1100.0  # the 50 was not counted
    assert fired.loc["m-1", "deadline"] == pd.Timestamp(T0 + 330_000, unit="ms", tz="UTC")


def test_two_windows_of_one_key_that_close_together_are_two_detections():
    rule = w.detector("totals", w.Tumbling(60), w.Count(), w.Final())
    harness = DetectorHarness(rule)
    harness.batch(frame([("m-1", 1_000, 0), ("m-1", 61_000, 0), ("m-1", 62_000, 0)]))
    harness.advance(pd.Timestamp(T0 + 200_000, unit="ms", tz="UTC"))
    fired = harness.take_fired()
    assert fired["count"].tolist() == [1, 2]
    assert (fired["deadline"] - pd.Timestamp(T0, unit="ms", tz="UTC")).dt.total_seconds().tolist() == [60, 120]


def test_a_burst_that_lasts_29_minutes_is_one_episode_not_one_detection_per_window():
    every_minute = [("card", 60_000 * m, 0) for m in range(30)]  # a record a minute for 29 minutes
    per_window = w.detector("velocity", w.Sliding(600), w.Count(), w.AtLeast(5))
    assert len(DetectorHarness(per_window).batch(frame(every_minute))) == 3
    episodes = w.detector("velocity", w.Sliding(600), w.Count(), w.AtLeast(5, per="episode"))
    harness = DetectorHarness(episodes)
    assert harness.batch(frame(every_minute)).empty
    assert harness.take_fired().empty  # not over while a window could still join it
    harness.advance(pd.Timestamp(T0 + 29 * 60_000 + 600_000, unit="ms", tz="UTC"))
    assert harness.take_fired().empty  # a sliding window holds its end: over once time has passed it
    harness.advance(pd.Timestamp(T0 + 29 * 60_000 + 600_001, unit="ms", tz="UTC"))
    (episode,) = harness.take_fired().to_dict(orient="records")
    # From the first window with 5 records (ending at 4 min) to the last (ending at 29 min), at its peak 11.
    assert episode == {
        "window_start_ms": T0 - 6 * 60_000,
        "window_end_ms": T0 + 29 * 60_000,
        "windows": 26,
        "count": 11,
        "deadline": pd.Timestamp(T0 + 29 * 60_000 + 600_001, unit="ms", tz="UTC"),
    }


def test_a_session_of_at_least_three_records_once_it_closes():
    rule = w.detector("active-then-quiet", w.Session(1800), w.Count(), w.Final(having=lambda s: s["count"] >= 3))
    harness = DetectorHarness(rule)
    harness.batch(frame([("c-1", 0, 0), ("c-1", 60_000, 0), ("c-2", 0, 0), ("c-1", 120_000, 0), ("c-2", 100_000, 0)]))
    harness.advance(pd.Timestamp(T0 + 3_600_000, unit="ms", tz="UTC"))
    assert harness.take_fired().index.tolist() == ["c-1"]


def test_a_record_for_a_window_the_partitions_time_closed_is_dropped_even_if_on_time_for_its_key():
    rule = w.detector("totals", w.Tumbling(60), w.Count(), w.Final())
    harness = DetectorHarness(rule)
    # b's first record is for [0, 60 s), which the partition's time (a's 130 s) has closed.
    harness.batch(frame([("a", 130_000, 0), ("b", 30_000, 0), ("b", 125_000, 0)]))
    harness.advance(pd.Timestamp(T0 + 300_000, unit="ms", tz="UTC"))
    fired = harness.take_fired()
    assert sorted(zip(fired.index, fired["window_start_ms"] - T0, fired["count"], strict=True)) == [("a", 120_000, 1), ("b", 120_000, 1)]


def test_bad_rules_are_refused_saying_what_to_write():
    with pytest.raises(ValueError, match="needs of=, one of"):
        w.detector("x", w.Tumbling(60), {"n": w.Count(), "total": w.Sum("amount")}, w.AtLeast(5))
    with pytest.raises(ValueError, match="per must be 'window' or 'episode'"):
        w.AtLeast(5, per="burst")
    with pytest.raises(TypeError, match="takes no field"):
        w.Count("amount")
    with pytest.raises(ValueError, match="may not be named 'key'"):
        w.detector("x", w.Tumbling(60), {"key": w.Count()}, w.Every())


def test_active_then_silent_three_records_within_an_hour_then_half_an_hour_without_one():
    rule = w.detector("went-quiet", w.Sliding(3600), w.Count(), w.Silent(1800, having=lambda w_: w_["count"] >= 3))
    harness = DetectorHarness(rule)
    minutes = [("c-1", 0, 0), ("c-1", 10, 0), ("c-1", 20, 0), ("c-1", 45, 0), ("c-2", 0, 0), ("c-2", 100, 0), ("c-3", 200, 0)]
    harness.batch(frame([(k, m * 60_000, v) for k, m, v in minutes]))
    fired = harness.take_fired()
    # c-1 went quiet after 45 min with 4 records in the hour up to it; c-2 had 1 in its hour.
    assert fired.index.tolist() == ["c-1"] and fired.loc["c-1", "count"] == 4
    assert fired.loc["c-1", "window_end_ms"] == T0 + 45 * 60_000
    assert fired.loc["c-1", "deadline"] == pd.Timestamp(T0 + 75 * 60_000, unit="ms", tz="UTC")


def test_silent_follows_a_sliding_window_only():
    with pytest.raises(TypeError, match="window=Sliding"):
        w.detector("x", w.Tumbling(60), w.Count(), w.Silent(60))


def test_records_dropped_as_late_are_counted_for_the_job_and_the_backtest():
    from detectorkit import backtest
    from detectorkit.metrics.registry import JobMetrics

    rule = w.detector("totals", w.Tumbling(60, grace_seconds=5), w.Count(), w.Final())
    rows = [("a", 130_000, 0), ("a", 100_000, 0), ("b", 30_000, 0), ("a", 129_000, 0)]  # 30 s late for a; b's window closed
    harness = DetectorHarness(rule)
    harness.batch(frame(rows))
    assert harness.late == 2
    result = backtest.run(rule, backtest.from_frame(frame(rows)))
    assert result.late == 2 and any(line.startswith("late: 2 records dropped") for line in backtest.summarise(result).lines())
    metrics = JobMetrics(process_tree=False)
    metrics.record_state(0, {"keys": 1, "bytes": 0, "written": 0, "expired": 0, "restored": 0, "restore_seconds": 0, "late": 2})
    assert metrics.registry.get_sample_value("detector_late_records_total") == 2
