"""A backtest over files as a Spark batch job: the files read by Spark (any filesystem it reads:
local, file://, s3a://, hdfs://, abfss://), each record keyed, stamped and given its partition by
the functions `from_files` uses, the partitions spread over tasks, and each partition's records run
through the stage in file order, as `run` does in one process.

Spark packs a file's splits into tasks by size, not in order, so the order is taken where it is
known: the file's place in the list, its path, the split's start in it, and the row's place in
its split (`monotonically_increasing_id` rises within a task, and a split is read in order).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from detectorkit.backtest.history import (
    FILE_CHUNK_RECORDS,
    Chunk,
    History,
    HistoryError,
    files_topic,
    is_parquet,
    keyed,
    line_values,
    table_values,
)
from detectorkit.backtest.replay import Backtest, merged, run
from detectorkit.detector import Detector

ORDER = ["_dk_file", "_dk_path", "_dk_block", "_dk_row"]
KEYED = pa.schema(
    [
        ("_dk_file", pa.int32()),
        ("_dk_path", pa.string()),
        ("_dk_block", pa.int64()),
        ("_dk_row", pa.int64()),
        ("part", pa.int32()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("stamp", pa.int64()),
    ]
)
DONE = pa.schema([("result", pa.binary())])


def run_files_on_spark(
    spark: Any,
    detector: Detector,
    paths: list[str],
    key_field: str | None = None,
    time_field: str | None = None,
    partitions: int = 1,
    config: Any = None,
    service: str | None = None,
) -> Backtest:
    """`run(detector, from_files(paths, ...))`, with Spark reading the files and a task per group of
    partitions running them: the same detections, dead letters and pending timers."""
    config = detector.load_config() if config is None else config
    name, topic = service or detector.name, files_topic(paths)
    frames = [_keyed(spark, i, path, key_field, time_field, partitions) for i, path in enumerate(paths)]
    records = frames[0]
    for frame in frames[1:]:
        records = records.unionByName(frame)
    ordered = records.repartition(partitions, "part").sortWithinPartitions("part", *ORDER)

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        found = run(detector, History(topic, 0, _chunks(topic, batches), {}), config, name)
        yield pa.RecordBatch.from_pylist([{"result": pickle.dumps(found)}], DONE)

    # Batches of a file chunk's size: the stage runs fewer, larger chunks (the session's own
    # setting comes back after).
    conf, before = "spark.sql.execution.arrow.maxRecordsPerBatch", spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", None)
    spark.conf.set(conf, str(FILE_CHUNK_RECORDS))
    try:
        return merged(name, [pickle.loads(row.result) for row in ordered.mapInArrow(task, spark_schema(DONE)).collect()])
    finally:
        if before is None:
            spark.conf.unset(conf)
        else:
            spark.conf.set(conf, before)


def _keyed(spark: Any, index: int, path: str, key_field: str | None, time_field: str | None, partitions: int) -> Any:
    """One path's records (a file, a directory or a glob), each with where it stood and its key,
    value, timestamp and partition."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    parquet = is_parquet(path)
    try:
        read = spark.read.parquet(path) if parquet else spark.read.text(path)
    except AnalysisException as exc:
        raise HistoryError(f"cannot read {path}: {exc}".splitlines()[0]) from None
    fields = read.columns
    placed = read.select(
        F.lit(index).cast("int").alias("_dk_file"),
        F.col("_metadata.file_path").alias("_dk_path"),
        F.col("_metadata.file_block_start").alias("_dk_block"),
        F.monotonically_increasing_id().alias("_dk_row"),
        "*",
    )

    def key(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            where = batch.select(ORDER)
            if parquet:
                values = table_values(pa.Table.from_batches([batch.select(fields)]))
            else:
                # A blank line is no record: its place goes with it.
                lines = [b"" if v is None else v.encode() for v in batch.column("value").to_pylist()]
                kept = np.array([bool(v.strip()) for v in lines], dtype=bool)
                values = line_values(lines)
                where = where.filter(pa.array(kept))
            keys, stamps, part = keyed(values, key_field, time_field, partitions)
            columns = [
                *where.columns,
                pa.array(part, pa.int32()),
                pa.array(keys, pa.binary()),
                pa.array(values, pa.binary()),
                pa.array(stamps, pa.int64()),
            ]
            yield pa.RecordBatch.from_arrays(columns, schema=KEYED)

    return placed.mapInArrow(key, spark_schema(KEYED))


def spark_schema(schema: pa.Schema) -> Any:
    """The Arrow schema a task yields, as Spark's: one definition of each, not two to keep equal."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def _chunks(topic: str, batches: Iterator[pa.RecordBatch]) -> Iterator[Chunk]:
    """A task's records, sorted by partition and place, as each partition's chunks with its own
    offsets counting from 0."""
    offset: dict[int, int] = {}
    for batch in batches:
        if batch.num_rows == 0:
            continue
        parts = batch.column("part").to_numpy()
        # Where the partition changes within the batch: the chunks' bounds.
        bounds = [0, *(np.flatnonzero(np.diff(parts)) + 1).tolist(), len(parts)]
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            p = int(parts[lo])
            for at in range(lo, hi, FILE_CHUNK_RECORDS):
                rows = batch.slice(at, min(hi, at + FILE_CHUNK_RECORDS) - at)
                first = offset.get(p, 0)
                offset[p] = first + rows.num_rows
                yield Chunk(
                    topic,
                    p,
                    np.arange(first, offset[p], dtype=np.int64),
                    rows.column("key"),
                    rows.column("value"),
                    rows.column("stamp").to_numpy(),
                )
