"""`detectorkit produce`: records from files onto a topic, each keyed and timed by its own fields, as
an upstream job would have written them (a history to backtest a service against, or to replay)."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence

from detectorkit.cli.exits import EXIT_FAILED, fail
from detectorkit.cli.progress import bar, shown
from detectorkit.kafka import clients


def produce_main(argv: Sequence[str]) -> int:
    from detectorkit.backtest import HistoryError
    from detectorkit.backtest.history import read_files
    from detectorkit.records import event_times_ms

    p = argparse.ArgumentParser(
        prog="detectorkit produce",
        description="Put the records of JSON lines (a record's value a line) or Parquet files on a topic, keyed and timed by their fields.",
    )
    p.add_argument("--file", "--files", dest="files", nargs="+", required=True, help="paths or URIs (file://, s3://, gs://, hdfs://)")
    p.add_argument("--topic", required=True)
    p.add_argument("--key-field", default=None, help="the field whose value is each record's Kafka key (default: no key)")
    p.add_argument("--time-field", default=None, help="the field that is each record's Kafka timestamp, epoch ms or ISO 8601 (default: now)")
    p.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"), help="default: KAFKA_BOOTSTRAP_SERVERS")
    p.add_argument("--create", action="store_true", help="create the topic if missing")
    p.add_argument("--partitions", type=int, default=8, help="the created topic's partitions")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="progress on stderr (default: on)")
    args = p.parse_args(argv)
    if not args.bootstrap_servers:
        return fail("detectorkit produce needs --bootstrap-servers or KAFKA_BOOTSTRAP_SERVERS")
    try:
        values = read_files(args.files)
    except HistoryError as exc:
        return fail(str(exc))
    import pandas as pd

    records = [json.loads(v) for v in values]
    keys = [None if args.key_field is None else _text(r.get(args.key_field)) for r in records]
    if args.key_field is not None and None in keys:
        return fail(
            f"{keys.count(None):,} record(s) have no {args.key_field!r}, the first at record {keys.index(None) + 1}: every record needs its key"
        )
    stamps = None
    if args.time_field is not None:
        stamps, bad = event_times_ms(pd.Series([r.get(args.time_field) for r in records], dtype=object))
        if bad.any():
            first = int(bad.argmax())
            return fail(f"{int(bad.sum()):,} record(s) have no time in {args.time_field!r} (epoch ms or ISO 8601), the first at record {first + 1}")
    base = clients.base(args.bootstrap_servers)
    if args.create:
        clients.create_topics(base, {args.topic: args.partitions})
    producer = clients.new_producer(clients.producer(base))
    errors: list[str] = []

    def delivered(error, message) -> None:
        if error is not None:
            errors.append(error.str())

    with bar(len(values), f"producing to {args.topic}", shown(args.progress)) as advance:
        for i, value in enumerate(values):
            stamp = {} if stamps is None else {"timestamp": int(stamps[i])}
            while True:
                try:
                    producer.produce(args.topic, key=keys[i], value=value, on_delivery=delivered, **stamp)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
            if i % 1000 == 999 or i == len(values) - 1:
                advance(i + 1)
        remaining = producer.flush(60)
    if remaining or errors:
        return fail(f"{remaining + len(errors):,} record(s) were not delivered: {errors[:1] or 'flush timed out'}", EXIT_FAILED)
    print(json.dumps({"topic": args.topic, "produced": len(values), "files": args.files}), flush=True)
    return 0


def _text(value) -> bytes | None:
    return None if value is None else str(value).encode()
