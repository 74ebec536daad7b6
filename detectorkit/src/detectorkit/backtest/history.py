"""Where a backtest's records come from: a range of the input topic, read as the live job reads it
(never committing, in no consumer group of the service's), or files of records.

Either way a history is a sequence of `Chunk`s, each one partition's records in offset order: what
a live task hands the detector, so the backtest parses, rejects and detects exactly as live does.
"""

from __future__ import annotations

import json
import pathlib
import uuid
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from detectorkit.kafka import broker_kind, clients, end_offsets, planning, range_reader
from detectorkit.records import event_times_ms

# Records per chunk from files: a live batch's order of size.
FILE_CHUNK_RECORDS = 50_000


class HistoryError(ValueError):
    """The history asked for cannot be read as asked: one line saying why."""


@dataclass
class Chunk:
    """One partition's records, in offset order."""

    topic: str
    partition: int
    offsets: np.ndarray  # int64
    keys: pa.Array  # binary, null where a record has no key
    values: pa.Array  # binary, null where a record has no value
    stamps_ms: np.ndarray  # int64: the Kafka timestamps (files: the time field, else 0)

    def __len__(self) -> int:
        return len(self.offsets)


@dataclass
class History:
    """Chunks of each partition, the partitions one after another; `records`: how many in all."""

    topic: str
    records: int
    chunks: Iterator[Chunk]
    ranges: dict[int, tuple[int, int]]  # partition -> [start, end) offsets read
    broker_kind: str | None = None  # a Kafka history's broker, resolved


def from_kafka(
    base_conf: Mapping[str, Any],
    topic: str,
    start: Mapping[int, int] | int | None = None,
    end: Mapping[int, int] | int | None = None,
    kind: str = broker_kind.AUTO,
    timeout: float = 30.0,
) -> History:
    """The records of `topic` from `start` to `end` (exclusive): per partition offsets, a time in
    epoch ms (the first offset whose timestamp is at or after it, as Kafka's offsets-for-times
    answers), or None (the earliest record; the end as it is now)."""
    kind = broker_kind.resolve(kind, base_conf, timeout)
    ends = end_offsets.open_end_offsets(kind, base_conf, f"detectorkit-backtest-{uuid.uuid4().hex[:12]}", topic, timeout)
    try:
        partitions = sorted(ends.topic_partitions())
    except LookupError as exc:
        raise HistoryError(f"input topic {topic!r} does not exist") from exc
    try:
        earliest = ends.earliest(partitions)
        latest = ends.end_offsets(partitions, confirmed=True)
        first = _offsets(ends, "start", start, partitions, earliest, latest)
        last = _offsets(ends, "end", end, partitions, earliest, latest)
    finally:
        ends.close()
    for p in partitions:
        if last[p] > latest[p]:
            raise HistoryError(f"--to offset {last[p]} is past the end of {topic}-{p} ({latest[p]}): the history ends there")
        if first[p] < earliest[p]:
            raise HistoryError(f"--from offset {first[p]} of {topic}-{p} is gone (retention); it begins at {earliest[p]}")
    ranges = {p: (first[p], max(first[p], last[p])) for p in partitions}
    total = sum(e - s for s, e in ranges.values())
    return History(topic, total, kafka_chunks(base_conf, topic, kind, ranges, timeout), ranges, kind)


def _offsets(ends, which: str, given, partitions: list[int], earliest: dict[int, int], latest: dict[int, int]) -> dict[int, int]:
    if given is None:
        return dict(earliest if which == "start" else latest)
    if isinstance(given, Mapping):
        stray = set(given) - set(partitions)
        if stray:
            raise HistoryError(f"--{'from' if which == 'start' else 'to'} names partition(s) {sorted(stray)} the topic does not have")
        return {p: int(given.get(p, earliest[p] if which == "start" else latest[p])) for p in partitions}
    if not hasattr(ends, "for_time"):
        raise HistoryError("a time range needs Kafka's offsets-for-times, which the embedded broker lacks: give offsets instead")
    found = ends.for_time(partitions, int(given))
    # No record at or after the time: the partition's end.
    return {p: latest[p] if found[p] < 0 else found[p] for p in partitions}


def kafka_chunks(base_conf: Mapping[str, Any], topic: str, kind: str, ranges: dict[int, tuple[int, int]], timeout: float) -> Iterator[Chunk]:
    """The chunks of `ranges` (partition -> [start, end)), read with the live source's reader."""
    consumer = clients.new_consumer(range_reader.reader_conf(base_conf, f"detectorkit-backtest-{uuid.uuid4().hex[:12]}", kind))
    try:
        for p, (s, e) in sorted(ranges.items()):
            if e <= s:
                continue
            for batch in range_reader.read_ranges(consumer, [planning.PartitionRange(topic, p, s, e)], True, timeout):
                yield Chunk(
                    topic,
                    p,
                    batch.column("offset").to_numpy(),
                    batch.column("key"),
                    batch.column("value"),
                    batch.column("timestamp").cast(pa.int64()).to_numpy() // 1000,
                )
    finally:
        consumer.close()  # it never joined a group and committed nothing


def from_files(paths: list[str], key_field: str | None = None, time_field: str | None = None, partitions: int = 1, topic: str = "") -> History:
    """Records from JSON lines (each line a record's value, as the input topic would hold it) or
    Parquet (each row a record), local paths or URIs of any filesystem pyarrow knows (file://,
    s3://, gs://, hdfs://). The Kafka key comes from `key_field`, the timestamp from `time_field`
    (epoch ms or ISO 8601); with `partitions` > 1 the keys are spread by a stable hash, and each
    partition's offsets count its own records, as a topic's do."""
    return _from_values(read_files(paths), key_field, time_field, partitions, topic or files_topic(paths))


def read_files(paths: list[str]) -> list[bytes]:
    """Each record's value, as JSON, of JSON lines or Parquet files; HistoryError for one that cannot be read."""
    values: list[bytes] = []
    for name in paths:
        try:
            values += _read_values(name)
        except (OSError, ValueError, ImportError) as exc:
            raise HistoryError(f"cannot read {name}: {exc}".splitlines()[0]) from None
    return values


def files_topic(paths: list[str]) -> str:
    """What a detection's source names as the topic of records read from files."""
    return ",".join(paths)


def is_parquet(name: str) -> bool:
    return name.rstrip("/").endswith(".parquet")


def _read_values(name: str) -> list[bytes]:
    from pyarrow import fs

    filesystem, path = fs.FileSystem.from_uri(name) if "://" in name else (fs.LocalFileSystem(), str(pathlib.Path(name).absolute()))
    if is_parquet(name):
        import pyarrow.parquet as pq

        return table_values(pq.read_table(path, filesystem=filesystem))
    with filesystem.open_input_stream(path) as stream:
        return line_values(stream.read().splitlines())


def table_values(table: pa.Table) -> list[bytes]:
    """A record's value per row of a table: the row as a JSON object, as pandas writes it."""
    text = table.to_pandas().to_json(orient="records", lines=True, date_format="iso")
    return [line.encode() for line in text.splitlines()]


def line_values(lines: list[bytes]) -> list[bytes]:
    """A record's value per line of JSON lines; blank lines are no records."""
    return [line.rstrip(b"\r\n") for line in lines if line.strip()]


def from_frame(frame, key_field: str | None = "key", time_field: str | None = "event_time", partitions: int = 1) -> History:
    """Records from a pandas DataFrame, a row each (its columns the record's fields), keyed and
    stamped by two of its columns: a notebook's history."""
    lines = frame.to_json(orient="records", lines=True, date_format="iso", date_unit="ms").splitlines()
    return _from_values([line.encode() for line in lines], key_field, time_field, partitions, "dataframe")


def keyed(values: list[bytes], key_field: str | None, time_field: str | None, partitions: int) -> tuple[list[bytes | None], np.ndarray, np.ndarray]:
    """Each value's Kafka key (its `key_field`, as text), timestamp (its `time_field`, else 0) and
    partition (a stable hash of the key; keyless records go to partition 0)."""
    import pandas as pd

    parsed = [_parsed(v) for v in values]
    keys = [None if key_field is None or not isinstance(r, dict) or r.get(key_field) is None else str(r[key_field]).encode() for r in parsed]
    stamps = np.zeros(len(values), dtype=np.int64)
    if time_field is not None:
        ms, bad = event_times_ms(pd.Series([r.get(time_field) if isinstance(r, dict) else None for r in parsed], dtype=object))
        stamps = np.where(bad, 0, ms).astype(np.int64)
    part = np.array([0 if k is None else zlib.crc32(k) % partitions for k in keys], dtype=np.int64)
    return keys, stamps, part


def _from_values(values: list[bytes], key_field: str | None, time_field: str | None, partitions: int, topic: str) -> History:
    keys, stamps, part = keyed(values, key_field, time_field, partitions)
    rows_of = {p: np.flatnonzero(part == p) for p in range(partitions)}

    def chunks() -> Iterator[Chunk]:
        for p, at in rows_of.items():
            for lo in range(0, len(at), FILE_CHUNK_RECORDS):
                rows = at[lo : lo + FILE_CHUNK_RECORDS]
                yield Chunk(
                    topic,
                    p,
                    np.arange(lo, lo + len(rows), dtype=np.int64),
                    pa.array([keys[i] for i in rows.tolist()], pa.binary()),
                    pa.array([values[i] for i in rows.tolist()], pa.binary()),
                    stamps[rows],
                )

    return History(topic, len(values), chunks(), {p: (0, len(at)) for p, at in rows_of.items()})


def _parsed(value: bytes) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return None  # the detector's parsing makes it a dead letter, as live
