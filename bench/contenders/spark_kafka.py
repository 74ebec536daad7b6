"""Peer (4): what a Spark user would write instead, with Spark's own Kafka connector.

spark-sql-kafka-0-10 (from Maven Central; bench/run.py fetches it with Maven) reads the topic; the same
pandas detector runs in mapInArrow; detections go out through Spark's Kafka sink; each batch's
offsets are committed to the consumer group from foreachBatch once the sink has written, and a
start reads them back as startingOffsets (earliest where the group has none). No dead letters, no
metrics, no hand-over: the contract's bare minimum.
Usage: spark_kafka.py BOOTSTRAP INPUT OUTPUT GROUP MODULE:DETECTOR CORES JARS
"""

import importlib
import json
import os
import signal
import sys
import tempfile
import threading

import pandas as pd
import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from detectorkit.kafka import clients


def main(bootstrap, input_topic, output_topic, group, detector_path, cores, jars):
    module, _, attr = detector_path.partition(":")
    detector = getattr(importlib.import_module(module), attr)
    config = detector.load_config()
    committer = Consumer(clients.consumer(clients.base(bootstrap), group))
    partitions = clients.topic_partitions(committer, input_topic, 30)
    committed = {tp.partition: tp.offset for tp in committer.committed([TopicPartition(input_topic, p) for p in partitions], timeout=30)}
    # -2 is Spark's "earliest" for a partition in startingOffsets.
    starting = json.dumps({input_topic: {str(p): (o if o >= 0 else -2) for p, o in committed.items()}})

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the workers import the detector from here
    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName("spark-kafka-peer")
        .config("spark.jars", jars)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", input_topic)
        .option("startingOffsets", starting)
        .load()
    )

    def detect(batches):
        for batch in batches:
            values = batch.column("value").to_pylist()
            rows, index = [], []
            for i, raw in enumerate(values):
                try:
                    record = json.loads(raw)
                except (TypeError, ValueError):
                    continue
                if isinstance(record, dict) and all(record.get(f) is not None for f in detector.required_fields):
                    rows.append(record)
                    index.append(i)
            if not rows:
                continue
            found = detector.detect(pd.DataFrame.from_records(rows, index=index), config)
            keys, outs = [], []
            partition, offset, stamp, key = (batch.column(c) for c in ("partition", "offset", "timestamp", "key"))
            for i, fields in zip(found.index, found.to_dict(orient="records"), strict=True):
                source = {
                    "topic": input_topic,
                    "partition": partition[i].as_py(),
                    "offset": offset[i].as_py(),
                    "timestamp_ms": int(stamp[i].as_py().timestamp() * 1000),
                }
                keys.append(key[i].as_py())
                outs.append(json.dumps({"service": "spark-kafka", "detection": fields, "source": source}, default=str).encode())
            yield pa.RecordBatch.from_arrays([pa.array(keys, pa.binary()), pa.array(outs, pa.binary())], names=["key", "value"])

    def on_batch(frame, batch_id):
        frame.persist()
        try:
            (
                frame.select("key", "value", "partition", "offset", "timestamp")
                .mapInArrow(detect, "key binary, value binary")
                .write.format("kafka")
                .option("kafka.bootstrap.servers", bootstrap)
                .option("topic", output_topic)
                .save()
            )
            ends = frame.groupBy("partition").agg(F.max("offset").alias("last")).collect()
        finally:
            frame.unpersist()
        if ends:  # written: the group's position may move
            committer.commit(offsets=[TopicPartition(input_topic, r.partition, r.last + 1) for r in ends], asynchronous=False)

    query = stream.writeStream.foreachBatch(on_batch).option("checkpointLocation", tempfile.mkdtemp(prefix="spark-kafka-peer-")).start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5) and query.isActive:
        pass
    failed = query.exception()
    query.stop()
    committer.close()
    spark.stop()
    if failed is not None:
        print(f"the query failed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:8]))
