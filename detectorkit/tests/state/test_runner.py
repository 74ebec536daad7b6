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
