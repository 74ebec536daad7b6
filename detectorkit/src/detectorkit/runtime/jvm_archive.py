"""The class archive's training run: the JVM that `jvm.build_archive` starts to write the archive.

Its own module because it starts a session through `spark`, which takes the driver's options from
`jvm`; run from `jvm`, the two would import each other.
"""

from __future__ import annotations

import tempfile
import time

from detectorkit.runtime.spark import session


def train() -> None:
    """What the archive's JVM runs: a session, a Python job through Arrow, and a streaming query
    with foreachBatch, so their classes are in the archive (the Kafka source's planning needs a
    broker; its classes load at a service's start as before)."""
    spark = session("local[2]", "detectorkit-class-archive")
    spark.range(0, 4, 1, 2).mapInArrow(lambda batches: batches, "id long").collect()
    seen = []
    query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 10)
        .load()
        .writeStream.foreachBatch(lambda frame, batch_id: seen.append(frame.count()))
        .option("checkpointLocation", tempfile.mkdtemp(prefix="detectorkit-archive-"))
        .start()
    )
    deadline = time.monotonic() + 60
    while len(seen) < 2 and time.monotonic() < deadline:
        query.awaitTermination(0.2)
    query.stop()
    # The JVM writes the archive as it exits, which it does when its stdin closes; wait for it,
    # or the caller would look for the file too soon.
    jvm = spark.sparkContext._gateway.proc
    spark.stop()
    jvm.stdin.close()
    jvm.wait(timeout=120)


if __name__ == "__main__":
    train()
