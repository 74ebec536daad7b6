"""How fast a backtest reads and detects, in one process, against the live stage's own cost.

    python bench/backtest.py                 # 1,000,000 records from a JSON lines file
    python bench/backtest.py --records 200000
    python bench/backtest.py --kafka --records 10000000   # from Apache Kafka: one process against Spark's tasks,
                                                          # on local[2] and on `detectorkit cluster`'s standalone cluster
    python bench/backtest.py --spark-files --records 5000000   # files: read in one process, then by Spark on local[2]

Writes the stateful benchmark's kind of records (100,000 customers, a rotating few hundred busy,
event time 5 ms a record) to a JSON lines file, then backtests the threshold detector and the burst
window rule over it (`detectorkit.backtest`, one process: files read, records parsed, the stage run
per partition in offset order) and prints records/s and CPU seconds per 1M records for each. The
peer in the same run is the stage alone on the same records already in memory (parsing, the
detector, the state), which is what the backtest adds its reading to.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time

import numpy as np

from detectorkit import Detector, backtest, windows
from detectorkit.backtest.replay import run

THRESHOLD = 1000.0


def threshold(records, config):
    hits = records[records["amount"] > THRESHOLD]
    return hits[["amount"]]


DETECTORS = {
    "threshold (stateless)": Detector(name="threshold", detect=threshold, required_fields=("amount",)),
    "burst window rule (stateful)": windows.detector("burst", windows.Sliding(60, grace_seconds=5), windows.Count(), windows.AtLeast(5)),
}


def write_records(path: pathlib.Path, count: int, seed: int = 42) -> None:
    rng = np.random.default_rng(seed)
    i = np.arange(count)
    hot = rng.random(count) < 0.3
    customer = np.where(hot, (i // 5000) * 500 + rng.integers(0, 500, count), rng.integers(0, 100_000, count)) % 100_000
    amount = np.round(rng.lognormal(5, 1.2, count), 2)
    t0 = 1_795_000_000_000
    with path.open("w") as f:
        for n, c, a in zip(i.tolist(), customer.tolist(), amount.tolist(), strict=True):
            f.write(json.dumps({"id": f"r-{n}", "customer": f"c-{c}", "amount": a, "ts": t0 + 5 * n}) + "\n")


def timed(call) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--kafka", action="store_true", help="from a topic on Apache Kafka: in this process, then as a Spark job (local[2])")
    p.add_argument("--spark-files", action="store_true", help="from a JSON lines file: in this process, then read by Spark (local[2])")
    args = p.parse_args(argv)
    if args.kafka:
        return from_kafka(args.records, args.partitions)
    if args.spark_files:
        return files_on_spark(args.records, args.partitions)
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "records.jsonl"
        write_records(path, args.records)
        print(f"{args.records:,} records, {path.stat().st_size / 2**20:,.0f} MiB of JSON lines, {args.partitions} partitions", flush=True)
        for name, detector in DETECTORS.items():
            found = {}

            def whole(detector=detector, found=found) -> None:
                history = backtest.from_files([str(path)], key_field="customer", time_field="ts", partitions=args.partitions)
                found["result"] = run(detector, history)

            wall, cpu = timed(whole)
            # The peer: the same slices already read, through the stage alone.
            slices = list(backtest.from_files([str(path)], key_field="customer", time_field="ts", partitions=args.partitions).slices)
            history = backtest.History("memory", args.records, iter(slices), {})
            stage_wall, stage_cpu = timed(lambda detector=detector, history=history: run(detector, history))
            result = found["result"]
            print(
                f"{name}: {args.records / wall:,.0f} records/s ({cpu / args.records * 1e6:.1f} s CPU per 1M), "
                f"{len(result.detections):,} detections; the stage alone {args.records / stage_wall:,.0f} records/s "
                f"({stage_cpu / args.records * 1e6:.1f} s CPU per 1M): the backtest at {stage_wall / wall:.2f}x the stage's speed",
                flush=True,
            )
    return 0


def from_kafka(count: int, partitions: int) -> int:
    """The burst window rule over `count` records of a topic: one process, then a Spark batch job
    with a task per partition on local[2] (both cores), then on a standalone cluster of two
    one-core workers (what `detectorkit cluster` starts), in the same run."""
    from detectorkit.devtools.brokers import start_broker
    from detectorkit.kafka import clients
    from detectorkit.runtime.spark import session

    broker = start_broker("kafka")
    try:
        conf = clients.base(broker.bootstrap_servers)
        clients.create_topics(conf, {"history": partitions})
        producer = clients.new_producer(clients.producer(conf, **{"linger.ms": 50, "batch.size": 1_000_000}))
        with tempfile.TemporaryDirectory() as tmp:
            path = pathlib.Path(tmp) / "records.jsonl"
            write_records(path, count)
            with path.open("rb") as f:
                for line in f:
                    record = json.loads(line)
                    producer.produce("history", key=record["customer"].encode(), value=line.rstrip(b"\n"), timestamp=record["ts"])
                    producer.poll(0)
        producer.flush(120)
        detector = DETECTORS["burst window rule (stateful)"]
        print(f"{count:,} records on Apache Kafka, {partitions} partitions", flush=True)
        here = {}
        wall, cpu = timed(lambda: here.setdefault("result", run(detector, backtest.from_kafka(conf, "history"))))
        print(
            f"one process: {count / wall:,.0f} records/s ({cpu / count * 1e6:.1f} s CPU per 1M), {len(here['result'].detections):,} detections",
            flush=True,
        )
        for name, master in (("local[2]", lambda: "local[2]"), ("standalone cluster, 2 workers x 1 core", start_cluster)):
            spark = session(master(), "backtest-bench")
            history = backtest.from_kafka(conf, "history")
            there = {}
            spark_wall, _ = timed(
                lambda spark=spark, history=history, there=there: there.setdefault(
                    "result", backtest.run_on_spark(spark, detector, history, kafka=(conf, "kafka", 60.0))
                )
            )
            compared(f"Spark, {name}", count, spark_wall, there["result"], wall, here["result"])
            spark.stop()
    finally:
        for cluster in CLUSTERS:
            cluster.stop()
        broker.stop()
    return 0


def files_on_spark(count: int, partitions: int) -> int:
    """The burst window rule over a JSON lines file of `count` records: read in one process, then
    read by Spark and run a task per group of partitions on local[2], in the same run."""
    from detectorkit.backtest.spark_files import run_files_on_spark
    from detectorkit.runtime.spark import session

    detector = DETECTORS["burst window rule (stateful)"]
    fields = {"key_field": "customer", "time_field": "ts", "partitions": partitions}
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "records.jsonl"
        write_records(path, count)
        print(f"{count:,} records, {path.stat().st_size / 2**20:,.0f} MiB of JSON lines, {partitions} partitions", flush=True)
        here = {}
        wall, cpu = timed(lambda: here.setdefault("result", run(detector, backtest.from_files([str(path)], **fields))))
        print(
            f"one process: {count / wall:,.0f} records/s ({cpu / count * 1e6:.1f} s CPU per 1M), {len(here['result'].detections):,} detections",
            flush=True,
        )
        spark = session("local[2]", "backtest-bench")
        there = {}
        spark_wall, _ = timed(lambda: there.setdefault("result", run_files_on_spark(spark, detector, [path.as_uri()], **fields)))
        compared("Spark reading the file, local[2]", count, spark_wall, there["result"], wall, here["result"])
        spark.stop()
    return 0


CLUSTERS: list = []


def start_cluster() -> str:
    from detectorkit.devtools.cluster import LocalCluster

    CLUSTERS.append(LocalCluster(workers=2, cores=1, memory="2g").start())
    return CLUSTERS[-1].master_url


def compared(name: str, count: int, wall: float, found, one_wall: float, one_found) -> None:
    """A Spark run's line: its speed, and its detections against the one-process run's."""
    same = sorted(map(_identity, found.detections)) == sorted(map(_identity, one_found.detections))
    print(
        f"{name}: {count / wall:,.0f} records/s, {len(found.detections):,} detections "
        f"({'the same' if same else 'NOT the same'} as one process'): {one_wall / wall:.2f}x one process",
        flush=True,
    )


def _identity(d: dict) -> tuple:
    s = d["source"]
    return (s["partition"], s.get("offset", -1), s.get("key") or "", json.dumps(d["detection"], sort_keys=True, default=str))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
