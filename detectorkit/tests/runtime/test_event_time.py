"""A detector whose records carry their own time: its event time from a field, not the Kafka timestamp."""

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from detectorkit import Detector, State
from detectorkit import windows as w
from detectorkit.runtime.stage import KeyedBatch, Source, as_stage
from detectorkit.state.store import PartitionStore
from detectorkit.testing import DetectorError, DetectorHarness

KAFKA_MS = 1_796_000_000_000  # what the producer stamped: not the records' time (later than all of them)


def echo_times(records, state, config):
    seen = pd.DataFrame({"at_ms": records["event_time"].astype("int64") // 1_000_000}, index=records.index)
    return seen, pd.DataFrame({"n": records.groupby("key").size()})


ECHO = Detector(name="echo", detect=echo_times, state=State(columns=("n",)), event_time_field="ts")


def test_the_event_time_comes_from_the_field_and_an_unreadable_one_is_a_dead_letter():
    stage = as_stage(ECHO)
    times = [1_700_000_000_123, "2026-11-26T06:00:00Z", "2026-11-26T07:00:00.5+01:00", "yesterday", True, None]
    values = pa.array([json.dumps({"ts": t}).encode() for t in times], pa.binary())
    keys = pa.array([b"k"] * len(times), pa.binary())
    store = PartitionStore(ECHO.state, 0)

    def source(position):
        return Source("in", 0, position, KAFKA_MS, "k")

    batch = KeyedBatch(values, keys, np.full(len(times), KAFKA_MS, dtype=np.int64), source, store, len(times), "in")
    found, rejected = stage.run_keyed(batch, None, "echo")
    at = [o.value["detection"]["at_ms"] for o in found]
    six = pd.Timestamp("2026-11-26T06:00:00Z").value // 1_000_000
    assert at == [1_700_000_000_123, six, six + 500]  # 07:00:00.5 at +01:00 is 06:00:00.5 UTC
    assert [(r.position, r.reason) for r in rejected] == [(5, "missing_field"), (3, "bad_event_time"), (4, "bad_event_time")]
    assert "ts='yesterday' is not an event time" in rejected[1].message
    assert store.event_ms == six + 500  # the partition's time is the records' own, not the Kafka timestamps' (later)


def test_windows_follow_the_field_and_the_harness_too():
    rule = w.detector("by-ts", w.Tumbling(seconds=60), w.Count(), w.AtLeast(2), event_time_field="ts")
    harness = DetectorHarness(rule)
    records = pd.DataFrame({"key": ["k", "k", "k"], "ts": ["2026-11-26T06:00:10Z", "2026-11-26T06:01:10Z", "2026-11-26T06:01:50Z"]})
    found = harness.batch(records)
    assert found.index.tolist() == [2]  # the first two are a minute apart by their own time
    with pytest.raises(DetectorError, match="bad_event_time"):
        harness.batch(pd.DataFrame({"key": ["k"], "ts": ["soon"]}, index=[3]))


def test_a_stateless_detector_has_no_event_time_to_take():
    with pytest.raises(TypeError, match="needs state"):
        Detector(name="x", detect=lambda records, config: records.iloc[:0], event_time_field="ts")


def test_a_record_whose_key_field_is_not_its_kafka_key_is_a_dead_letter():
    det = Detector(name="by-customer", detect=echo_times, state=State(columns=("n",)), key_field="customer")
    values = pa.array([json.dumps({"customer": c}).encode() for c in ("c-1", "c-2", 7)], pa.binary())
    keys = pa.array([b"c-1", b"c-1", b"7"], pa.binary())
    batch = KeyedBatch(
        values, keys, np.full(3, KAFKA_MS, dtype=np.int64), lambda i: Source("in", 0, i, KAFKA_MS, None), PartitionStore(det.state, 0), 3, "in"
    )
    found, rejected = as_stage(det).run_keyed(batch, None, "by-customer")
    assert len(found) == 2  # "c-1" and 7 (its key "7"): the field as text
    assert [(r.position, r.reason) for r in rejected] == [(1, "key_mismatch")]
    assert "key the topic by customer upstream" in rejected[0].message
    # The harness keys records by the field when they come without a Kafka key, as if keyed upstream.
    assert DetectorHarness(det).batch(pd.DataFrame({"customer": ["c-9"], "ts": [0], "event_time": [KAFKA_MS]})).index.tolist() == [0]
