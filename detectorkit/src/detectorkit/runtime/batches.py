"""The source's Arrow record batches as a task takes them apart: by Kafka partition, and stamped."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def by_partition(batches: Iterable[pa.RecordBatch]) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Each Kafka partition's records of `batches`, in the order read, as one record batch.

    One stable sort of the whole task's records by partition and one `take`, then zero-copy
    slices: a filter per partition per chunk and a concatenation per partition copied every
    record twice, at 0.3-0.5 µs a record (a fifth of what the state costs a record)."""
    chunks = [b for b in batches if b.num_rows]
    if not chunks:
        return
    batch = chunks[0] if len(chunks) == 1 else pa.Table.from_batches(chunks).combine_chunks().to_batches()[0]
    partitions = batch.column("partition").to_numpy()
    if (partitions == partitions[0]).all():
        yield int(partitions[0]), batch
        return
    order = np.argsort(partitions, kind="stable")
    ordered = batch.take(pa.array(order))
    partitions = partitions[order]
    starts = [0, *(np.flatnonzero(partitions[1:] != partitions[:-1]) + 1).tolist()]
    for start, end in zip(starts, [*starts[1:], len(partitions)], strict=True):
        yield int(partitions[start]), ordered.slice(start, end - start)


def stamps_ms(batch: pa.RecordBatch) -> pa.Array:
    """The records' timestamps in ms, as Kafka has them (the source gives microseconds)."""
    return pc.divide(batch.column("timestamp").cast(pa.int64()), 1000)
