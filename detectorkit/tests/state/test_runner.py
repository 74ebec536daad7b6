"""A stateful detector run over batches without Kafka or Spark (the harness uses the runtime's runner,
store and changelog encoding): failures isolated with the state they leave, and what it refuses."""

from dataclasses import dataclass

import pandas as pd
import pytest

from detectorkit import Detector, State
from detectorkit.testing import DetectorError, DetectorHarness


@dataclass(frozen=True)
class Config:
    every: int = 3


def count(records, state, config):
    """Flag every `every`-th record of a key; records whose `bad` is set make it raise."""
    if "bad" in records and records["bad"].fillna(False).astype(bool).any():
        raise ValueError("a bad record")
    counts = state["count"].to_dict()
    hits, rows = [], {}
    for index, key in records["key"].items():
        counts[key] = counts.get(key, 0) + 1
        if counts[key] % config.every == 0:
            hits.append(index)
        rows[key] = counts[key]
    return pd.DataFrame({"n": [counts[records.at[i, "key"]] for i in hits]}, index=hits), pd.DataFrame({"count": rows})


COUNT = Detector(name="count", detect=count, config=Config, state=State(columns=("count",)))


def stream(keys, start="2026-01-01"):
    return pd.DataFrame({"key": keys, "event_time": pd.date_range(start, periods=len(keys), freq="s", tz="UTC")})


def test_state_carries_from_batch_to_batch_and_across_a_restart():
    run = DetectorHarness(COUNT)
    records = stream(["a", "b", "a", "a", "b", "b", "a", "a", "a"])
    found = []
    for i in range(0, len(records), 2):
        found.append(run.batch(records.iloc[i : i + 2]))
        run.restart()
    assert list(pd.concat(found).index) == [3, 5, 8]
    assert run.state() == {"a": {"count": 6}, "b": {"count": 3}}


def test_a_record_that_makes_the_detector_raise_leaves_the_others_and_their_state_alone():
    records = stream(["a", "a", "a", "a"]).assign(bad=[False, True, False, False])
    run = DetectorHarness(COUNT)
    with pytest.raises(DetectorError, match="a bad record"):
        run.batch(records)
    # In the job the bad record goes to the dead-letter topic; the others count in order.
    assert run.state() == {"a": {"count": 3}}


def append_in_place(records, state, config):
    """Appends each record's id to its key's list in the state it was handed (in place), then fails
    on a record whose `bad` is set."""
    held = state["ids"].to_dict()
    for index, key in records["key"].items():
        held.setdefault(key, []).append(int(records.at[index, "id"]))
    if records["bad"].fillna(False).astype(bool).any():
        raise ValueError("a bad record")
    return pd.DataFrame(index=records.index[:0]), pd.DataFrame({"ids": pd.Series(held, dtype=object)})


APPEND = Detector(name="append", detect=append_in_place, config=Config, state=State(columns=("ids",)))


def test_a_detector_that_changes_its_state_in_place_and_fails_leaves_the_state_as_it_was():
    run = DetectorHarness(APPEND)
    run.batch(stream(["a", "a"]).assign(id=[1, 2], bad=False))
    # The second record fails: the first is run alone (bisection) from the state before both.
    with pytest.raises(DetectorError, match="a bad record"):
        run.batch(stream(["a", "a"], start="2026-01-02").assign(id=[3, 4], bad=[False, True]))
    assert run.state() == {"a": {"ids": [1, 2, 3]}}
    run.restart()
    assert run.state() == {"a": {"ids": [1, 2, 3]}}


def append_and_time(records, state, config):
    """As append_in_place, and a timer 1.5 s after the batch's first record."""
    detections, new_state = append_in_place(records.assign(bad=False), state, config)
    first = records.index[0]
    return detections, new_state, pd.Series([records.at[first, "event_time"] + pd.Timedelta(seconds=1.5)], index=[first])


def fired_ids(fired, config):
    return pd.DataFrame({"ids": [list(ids) for ids in fired["ids"]]}, index=fired.index), fired[["ids"]]


TIMED = Detector(name="timed", detect=append_and_time, config=Config, state=State(columns=("ids",)), on_timer=fired_ids)


def test_records_cut_at_a_timer_are_run_again_from_the_state_they_started_from():
    run = DetectorHarness(TIMED)
    run.batch(stream(["a"], start="2026-01-01").assign(id=[0]))
    # Its timer fires before the next day's first record. Then the timer set at that record falls
    # due at its third: the records are run up to there, the timer fires, then the rest; the first
    # try over all four (which changed the state it was handed in place) is not written.
    run.batch(stream(["a"] * 4, start="2026-01-02").assign(id=[1, 2, 3, 4]))
    assert run.take_fired()["ids"].tolist() == [[0], [0, 1, 2]]
    assert run.state() == {"a": {"ids": [0, 1, 2, 3, 4]}}
    run.restart()
    assert run.state() == {"a": {"ids": [0, 1, 2, 3, 4]}}


def test_what_a_stateful_detector_returns_is_checked():
    def no_state(records, state, config):
        return pd.DataFrame(index=records.index[:0])

    def stray_key(records, state, config):
        return pd.DataFrame(index=records.index[:0]), pd.DataFrame({"count": [1]}, index=["not-in-batch"])

    def wrong_columns(records, state, config):
        return pd.DataFrame(index=records.index[:0]), pd.DataFrame({"total": [1]}, index=[records["key"].iloc[0]])

    for detect, message in ((no_state, "returns \\(detections, new_state\\)"), (stray_key, "not in the batch"), (wrong_columns, "declares")):
        run = DetectorHarness(Detector(name="x", detect=detect, config=Config, state=State(columns=("count",))))
        with pytest.raises(DetectorError, match=message):
            run.batch(stream(["a"]))


def test_records_need_the_key_and_event_time_the_runtime_adds():
    with pytest.raises(ValueError, match="event_time"):
        DetectorHarness(COUNT).batch(pd.DataFrame({"key": ["a"]}))


def test_a_state_declaration_with_no_columns_or_a_bad_name_is_refused():
    with pytest.raises(ValueError, match="columns"):
        State(columns=())
    with pytest.raises(ValueError, match="name"):
        State(columns=("a",), name="has space")
    with pytest.raises(ValueError, match="ttl"):
        State(columns=("a",), ttl_seconds=0)
    with pytest.raises(TypeError, match="detectorkit.State"):
        Detector(name="x", detect=count, state={"columns": ("a",)})
