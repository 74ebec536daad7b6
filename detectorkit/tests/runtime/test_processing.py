"""The task's work (parse, detect, dead-letter, summarise) without Spark or Kafka."""

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from detectorkit import records as rec
from detectorkit.detector import Detector
from detectorkit.kafka.access import KafkaAccess
from detectorkit.kafka.range_reader import arrow_schema
from detectorkit.runtime.batches import by_partition
from detectorkit.runtime.processing import process_batch, send_outputs
from detectorkit.runtime.stage import Output, Sources, as_stage, detect_isolating
from detectorkit.runtime.task_context import PartitionSummary, TaskContext

from ..detectors import THRESHOLD, Config


class FakeSink:
    def __init__(self):
        self.sent = []

    def send(self, topic, key, value, headers=None, partition=None, timestamp_ms=None):
        self.sent.append((topic, key, value, dict(headers or [])))


def ctx(detector=THRESHOLD, config=Config()):
    return TaskContext("svc", as_stage(detector), config, KafkaAccess({}, "svc"), "out", "svc.dlq")


def arrow(values, partition=3, first_offset=100):
    n = len(values)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([f"k{i}".encode() for i in range(n)], pa.binary()),
            pa.array(values, pa.binary()),
            pa.array(["in"] * n),
            pa.array(partition if isinstance(partition, list) else [partition] * n, pa.int32()),
            pa.array(range(first_offset, first_offset + n), pa.int64()),
            pc.multiply(pa.array([1_700_000_000_000 + i for i in range(n)], pa.int64()), 1000).cast(pa.timestamp("us", tz="UTC")),
        ],
        schema=arrow_schema(),
    )


def test_parse_sorts_records_from_the_bad_ones():
    values = [b'{"amount": 1}', b"{not json", b"[1, 2]", b'{"id": 1}', b'{"amount": null}', None, b"\xff\xfe", b'"text"']
    frame, rejected = rec.parse(values, ("amount",))
    assert list(frame.index) == [0]
    assert [(r.position, r.reason) for r in rejected] == [
        (1, rec.MALFORMED_JSON),
        (2, rec.NOT_AN_OBJECT),
        (3, rec.MISSING_FIELD),
        (4, rec.MISSING_FIELD),
        (5, rec.NOT_AN_OBJECT),
        (6, rec.MALFORMED_JSON),
        (7, rec.NOT_AN_OBJECT),
    ]
    assert "amount" in rejected[2].message


def test_detections_keep_the_position_of_their_record():
    frame = pd.DataFrame({"amount": [5.0, 2000.0, 3000.0]}, index=[4, 7, 9])
    found, failed = detect_isolating(THRESHOLD, Config(), frame)
    assert [p for p, _ in found] == [7, 9] and failed == []
    assert found[0][1] == {"amount": 2000.0}


def test_a_raising_batch_is_split_until_only_the_bad_records_are_left():
    frame = pd.DataFrame({"amount": [5.0, "n/a", 3000.0, "x"]}, index=[0, 1, 2, 3])
    found, failed = detect_isolating(THRESHOLD, Config(), frame)
    assert [p for p, _ in found] == [2]
    assert [(r.position, r.reason) for r in failed] == [(1, rec.DETECTOR_ERROR), (3, rec.DETECTOR_ERROR)]
    assert "TypeError" in failed[0].message


def test_splitting_calls_the_detector_far_fewer_times_than_records():
    calls = []

    def counting(records, config):
        calls.append(len(records))
        return THRESHOLD.detect(records, config)

    amounts = [float(i) for i in range(1024)]
    amounts[700] = "n/a"
    found, failed = detect_isolating(Detector(name="c", detect=counting), Config(threshold=1000.0), pd.DataFrame({"amount": amounts}))
    assert [r.position for r in failed] == [700]
    assert [p for p, _ in found] == list(range(1001, 1024))
    assert len(calls) <= 2 * 10 + 1


def test_a_detector_returning_the_wrong_type_loses_nothing():
    broken = Detector(name="broken", detect=lambda records, config: records.to_dict())
    found, failed = detect_isolating(broken, None, pd.DataFrame({"amount": [1, 2]}))
    assert found == [] and len(failed) == 2
    assert "must return a pandas DataFrame" in failed[0].message


def test_a_detector_inventing_an_index_is_caught():
    def made_up(records, config):
        return pd.DataFrame({"x": [1]}, index=[999])

    found, failed = detect_isolating(Detector(name="made-up", detect=made_up), None, pd.DataFrame({"amount": [1, 2]}, index=[0, 1]))
    # Record by record, each output row belongs to the one record given: nothing is lost.
    assert [p for p, _ in found] == [0, 1] and failed == []


def test_process_batch_writes_detections_and_dead_letters_and_counts():
    sink, summaries = FakeSink(), {}
    values = [b'{"amount": 5}', b'{"amount": 1500, "id": "a"}', b"oops", b'{"amount": "n/a"}', b'{"id": 3}']
    process_batch(ctx(), arrow(values), sink, summaries)

    out = [(k, json.loads(v)) for t, k, v, _ in sink.sent if t == "out"]
    assert out == [
        (
            b"k1",
            {
                "service": "svc",
                "detection": {"amount": 1500},
                "source": {"topic": "in", "partition": 3, "offset": 101, "timestamp_ms": 1_700_000_000_001, "key": "k1"},
            },
        )
    ]
    dead = [(k, v, h) for t, k, v, h in sink.sent if t == "svc.dlq"]
    assert [(k, v) for k, v, _ in dead] == [(b"k2", b"oops"), (b"k4", b'{"id": 3}'), (b"k3", b'{"amount": "n/a"}')]
    headers = {h["error_type"]: h for _, _, h in dead}
    assert set(headers) == {b"malformed_json", b"missing_field", b"detector_error"}
    assert headers[b"malformed_json"]["source_offset"] == b"102"
    assert headers[b"missing_field"]["source_partition"] == b"3"
    assert headers[b"detector_error"]["service"] == b"svc"
    assert headers[b"detector_error"]["source_topic"] == b"in"
    assert b"TypeError" in headers[b"detector_error"]["error_message"]

    s = summaries[3]
    assert (s.records, s.detections, s.next_offset) == (5, 1, 105)
    assert s.dead_letters == {"malformed_json": 1, "missing_field": 1, "detector_error": 1}


def test_each_output_goes_out_under_its_own_records_key_or_the_one_it_names():
    """Timers' outputs cite no record, a re-keyed one names its key: the others take their
    record's key, whatever comes between them."""
    keys = pa.array([b"k0", b"k1", b"k2"], pa.binary())
    found = [
        Output(2, {"d": 2}),
        Output(-1, {"t": 1}, key="timer", partition=3, timestamp_ms=5),
        Output(0, {"d": 0}, key="rekeyed"),
        Output(1, {"d": 1}),
    ]
    sink, summaries = FakeSink(), {}
    send_outputs(ctx(), found, sink, summaries, keys, np.array([3, 3, 3]), np.array([10, 11, 12]), "in")
    assert [k for _, k, _, _ in sink.sent] == [b"k2", b"timer", b"rekeyed", b"k1"]
    assert summaries[3].detected_at == [12, 10, 11]


def test_a_batch_of_several_partitions_counts_each_ones_detections_and_their_times():
    """A stateless task's batch holds records of its partitions interleaved: each partition's
    summary gets its own detections and their records' timestamps, in the order they went out."""
    sink, summaries = FakeSink(), {}
    values = [b'{"amount": 2000}', b'{"amount": 5}', b'{"amount": 3000}', b'{"amount": 4000}', b'{"amount": 5000}']
    process_batch(ctx(), arrow(values, partition=[1, 3, 3, 1, 1]), sink, summaries)
    assert (summaries[1].records, summaries[1].detections, summaries[3].records, summaries[3].detections) == (3, 3, 2, 1)
    start = 1_700_000_000_000
    assert summaries[1].detected_at == [start, start + 3, start + 4] and summaries[3].detected_at == [start + 2]
    assert [json.loads(v)["detection"]["amount"] for t, _, v, _ in sink.sent if t == "out"] == [2000, 3000, 4000, 5000]


def test_a_detection_is_written_as_json_whatever_its_fields_types():
    """NumPy's numbers as numbers, a timestamp as its text, a missing number as null: what a
    detector's frame holds, written so that any JSON reader (not Python's alone) takes it."""
    detection = {
        "score": np.float32(0.25),
        "orders": np.int64(3),
        "flagged": np.bool_(True),
        "at": pd.Timestamp("2026-11-29T10:00:00Z"),
        "mean": float("nan"),
        "by_hour": {7: 2},
    }
    written = rec.detection_json(detection)
    assert b"NaN" not in written
    assert json.loads(written) == {"score": 0.25, "orders": 3, "flagged": True, "at": "2026-11-29 10:00:00+00:00", "mean": None, "by_hour": {"7": 2}}


def test_summaries_accumulate_over_batches():
    sink, summaries = FakeSink(), {3: PartitionSummary()}
    process_batch(ctx(), arrow([b'{"amount": 2000}'] * 3, first_offset=0), sink, summaries)
    process_batch(ctx(), arrow([b'{"amount": 1}'] * 2, first_offset=3), sink, summaries)
    assert (summaries[3].records, summaries[3].detections, summaries[3].next_offset) == (5, 3, 5)


@pytest.mark.parametrize("value", [b"", b"null", b"1e999999", b'{"amount": NaN}'])
def test_odd_values_never_crash_the_batch(value):
    sink, summaries = FakeSink(), {}
    process_batch(ctx(), arrow([value]), sink, summaries)
    assert summaries[3].records == 1
    assert len(sink.sent) <= 1


def test_fast_and_record_by_record_parsing_agree():
    values = [
        b'{"amount": 1500.5, "id": "a", "n": 3, "ok": true}',
        b'{"amount": 2, "id": "b", "n": null, "ok": false}',
        b'{"id": "c"}',
        b'{"amount": null, "id": "d"}',
    ]
    fast, fast_rejected = rec.parse_arrow(pa.array(values, pa.binary()), ("amount",))
    slow, slow_rejected = rec.parse(values, ("amount",))
    assert fast_rejected == slow_rejected
    pd.testing.assert_frame_equal(fast[sorted(fast.columns)], slow[sorted(slow.columns)], check_dtype=False)
    assert list(fast.index) == [0, 1]


def test_the_fast_path_reads_a_slice_of_a_column_and_values_over_several_lines():
    """The values' bytes are read where they lie in the column: a batch cut from a longer one
    starts inside its buffer. A value over several lines is one object all the same."""
    values = [b'{"amount": 1}', b'{"amount": 2,\n "n": 7}', b'{"amount": 3}', b'{"amount": 4}']
    column = pa.array(values, pa.binary()).slice(1, 2)
    fast = rec._parse_all_at_once(column, ("amount",))
    assert fast is not None
    frame, rejected = fast
    assert rejected == []
    assert frame["amount"].tolist() == [2, 3]
    assert frame["n"].fillna(0).tolist() == [7, 0]


@pytest.mark.parametrize(
    "odd",
    [
        b"null",
        b"[1]",
        b'"s"',
        b"",
        b'{"ts": "2020-01-01T00:00:00Z", "amount": 1}',
        b'{"amount": 1, "tags": [1, 2]}',
        b'{"amount": 1, "o": {"a": 1}}',
        b'{"amount": 1}{"amount": 2}',
        b'{"amount": 1} ',
    ],
)
def test_batches_arrow_cannot_take_as_is_fall_back_to_record_by_record(odd):
    values = [b'{"amount": 5}', odd, b'{"amount": 2000}']
    assert rec._parse_all_at_once(pa.array(values, pa.binary()), ("amount",)) is None
    fast, fast_rejected = rec.parse_arrow(pa.array(values, pa.binary()), ("amount",))
    slow, slow_rejected = rec.parse(values, ("amount",))
    assert fast_rejected == slow_rejected
    pd.testing.assert_frame_equal(fast, slow)


def test_a_tasks_interleaved_chunks_come_out_as_one_batch_per_partition_in_the_order_read():
    # Three chunks as the reader hands them over: partitions interleaved, each in offset order.
    chunks = [arrow([b"{}"] * 3, partition=p, first_offset=o) for p, o in ((5, 10), (2, 40), (5, 13))]
    mixed = pa.Table.from_batches(chunks[1:]).combine_chunks().to_batches()[0]
    empty = arrow([], partition=9)
    parts = dict(by_partition(iter([chunks[0], empty, mixed])))
    assert sorted(parts) == [2, 5]
    assert parts[5].column("offset").to_pylist() == [10, 11, 12, 13, 14, 15]
    assert parts[2].column("offset").to_pylist() == [40, 41, 42]
    assert parts[5].column("key").to_pylist() == [b"k0", b"k1", b"k2"] * 2
    assert all(isinstance(b, pa.RecordBatch) for b in parts.values())
    assert dict(by_partition(iter([empty]))) == {}
    (only,) = by_partition(iter([chunks[0]]))  # one partition: handed over as it is
    assert only == (5, chunks[0])


def test_many_interleaved_records_keep_their_order_within_each_partition():
    n = 500
    batch = arrow([b"{}"] * n)
    partitions = pa.array([i % 3 for i in range(n)], pa.int32())
    batch = batch.set_column(batch.schema.get_field_index("partition"), "partition", partitions)
    parts = dict(by_partition(iter([batch.slice(0, 200), batch.slice(200)])))
    for p in range(3):
        assert parts[p].column("offset").to_pylist() == [100 + i for i in range(p, n, 3)]


def test_a_batchs_sources_at_once_are_each_records_source_null_and_broken_keys_included():
    keys = pa.array([b"c1", None, b"\xff\xfebad", "clé".encode(), b""], pa.binary())
    sources = Sources("in", np.array([3, 3, 4, 4, 5]), np.array([10, 11, 7, 8, 0]), np.array([1_000, 1_001, 999, 1_002, 5]), keys)
    positions = [4, 2, 0, 1, 3, 2]
    assert sources.dicts(positions) == [sources(p).as_dict() for p in positions]
    assert [d["key"] for d in sources.dicts(positions)] == ["", "\ufffd\ufffdbad", "c1", None, "clé", "\ufffd\ufffdbad"]
    assert sources.dicts([]) == []
