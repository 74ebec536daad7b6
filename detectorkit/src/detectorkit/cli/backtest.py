"""`<service> backtest` and `detectorkit backtest`: the detector over history, its detections to a file
and a summary to stdout. Settings and DETECTOR_* config are read exactly as the live service reads
them; the history is a range of the input topic or files."""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

from detectorkit import settings as settings_mod
from detectorkit.cli.exits import EXIT_FAILED, fail
from detectorkit.cli.progress import bar, shown
from detectorkit.detector import Detector
from detectorkit.kafka import clients
from detectorkit.records import detection_json
from detectorkit.settings import SettingsError

EXAMPLES = """
examples:
  backtest --from 2026-11-19T00:00Z --to 2026-11-26T00:00Z --out week.parquet
  backtest --from 0=1000,1=1000 --to 0=5000,1=5000 --out range.jsonl --labels known.txt
  backtest --files records.jsonl --key-field customer --time-field timestamp --out found.jsonl
  backtest --spark --files 's3a://history/2026-11/*.parquet' --key-field customer --partitions 8 --out found.parquet
"""


def parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Run the detector over history as the live service would: a range of the input topic (never committing, in no "
        "group of the service's) or files. Writes the detections, prints a summary.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--from", dest="start", default=None, help="ISO 8601 time, epoch ms, or offsets P=OFFSET,... (default: the earliest record)")
    p.add_argument("--to", dest="end", default=None, help="as --from, exclusive (default: the topic's end now)")
    p.add_argument(
        "--files",
        nargs="+",
        default=None,
        help="JSON lines (a record's value a line) or Parquet files, instead of the topic: paths or URIs (with --spark, any filesystem Spark reads, "
        "and directories or globs)",
    )
    p.add_argument("--key-field", default=None, help="files: the field that is the record's Kafka key (default: the detector's key_field)")
    p.add_argument(
        "--time-field",
        default=None,
        help="files: the field that is the record's Kafka timestamp, epoch ms or ISO 8601 (default: the detector's event_time_field)",
    )
    p.add_argument("--partitions", type=int, default=1, help="files: spread the keys over this many partitions (default 1)")
    p.add_argument("--out", required=True, help="where the detections go: .parquet or .jsonl (the output topic's values)")
    p.add_argument("--labels", default=None, help="a file: a header line 'id' or 'key', then the anomalous ones, one a line")
    p.add_argument(
        "--model-uri",
        default=None,
        help="a model detector: score with this model instead of DETECTOR_MODEL_URI's (a candidate); with --labels, the ROC AUC of its scores",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress on stderr: a bar on a terminal, else a line every 10 s (default: on)",
    )
    p.add_argument(
        "--spark", action="store_true", help="run as a Spark batch job on SPARK_MASTER (Kafka: a task per partition; files: Spark reads them)"
    )
    return p


def backtest_main(detector: Detector, argv: Sequence[str], defaults: Mapping[str, Any] | None = None) -> int:
    from detectorkit import backtest
    from detectorkit.runtime.repartition import topic_of as repartition_topic
    from detectorkit.runtime.stage import input_decoder

    args, rest = parser(f"{detector.name} backtest").parse_known_args(argv)
    # A file's records keyed and timed as the detector reads them, unless told otherwise.
    args.key_field = args.key_field or detector.key_field
    args.time_field = args.time_field or detector.event_time_field
    job = argparse.ArgumentParser(prog=f"{detector.name} backtest")
    settings_mod.add_arguments(job)
    try:
        settings = settings_mod.load(job.parse_args(rest), defaults=defaults).for_service(detector.name)
        config = detector.load_config()
        scoring = detector.score_every is not None and hasattr(config, "threshold")
        if args.model_uri is not None:
            if not scoring:
                raise SettingsError(f"--model-uri is for a model detector (detectorkit.models); {detector.name} scores with none")
            config = dataclasses.replace(config, model_uri=args.model_uri)
        out = pathlib.Path(args.out)
        if out.suffix not in (".parquet", ".jsonl"):
            raise SettingsError(f"--out must end in .parquet or .jsonl, not {out.name!r}")
        labels = backtest.read_labels(args.labels) if args.labels else None
        if args.files and args.spark:
            history = None  # Spark reads the files, on its executors
        elif args.files:
            history = backtest.from_files(args.files, args.key_field, args.time_field, args.partitions)
        else:
            if not settings.kafka_bootstrap_servers:
                raise SettingsError("a backtest over the input topic needs KAFKA_BOOTSTRAP_SERVERS (or --files)")
            if detector.repartition and settings.input_topic != repartition_topic(settings.consumer_group):
                raise SettingsError(
                    f"{detector.name} is keyed by {detector.key_field!r} through its repartition topic: backtest over files (--files), or "
                    f"over that topic, INPUT_TOPIC={repartition_topic(settings.consumer_group)}"
                )
            conf = clients.base(settings.kafka_bootstrap_servers, settings.kafka_options)
            history = backtest.from_kafka(
                conf,
                settings.input_topic,
                _bound(args.start, "--from"),
                _bound(args.end, "--to"),
                settings.kafka_broker_kind,
                settings.connect_timeout_seconds,
            )
        # The topic's values as the live job reads them; files are read by their own format.
        decode = input_decoder(settings) if not args.files else None
    except (SettingsError, backtest.HistoryError) as exc:
        return fail(str(exc))
    # With labels, every scored record's score, for the ROC AUC; the detections are those at the threshold.
    threshold = config.threshold if scoring and labels is not None else None
    try:
        # A model that cannot be loaded: one line, before any record is read.
        detector = detector.configured(config) if threshold is None else detector.score_every(config)
    except SettingsError as exc:
        return fail(str(exc))
    started = time.monotonic()
    if args.spark:
        from detectorkit.backtest.spark_files import run_files_on_spark
        from detectorkit.runtime.shipping import stage_packages
        from detectorkit.runtime.spark import session
        from detectorkit.runtime.stage import as_stage

        spark = session(settings.spark_master, f"{detector.name}-backtest", ship=stage_packages(as_stage(detector)))
        try:
            if history is None:
                result = run_files_on_spark(spark, detector, args.files, args.key_field, args.time_field, args.partitions, config, detector.name)
            else:
                kafka = (conf, settings.kafka_broker_kind, settings.connect_timeout_seconds)
                result = backtest.run_on_spark(spark, detector, history, config, detector.name, kafka=kafka, decode=decode)
        except backtest.HistoryError as exc:
            return fail(str(exc))
    else:
        with bar(history.records, "backtest", shown(args.progress)) as advance:
            try:
                result = backtest.run(detector, history, config, detector.name, progress=advance, decode=decode)
            except backtest.HistoryError as exc:
                return fail(str(exc), EXIT_FAILED)
    seconds = time.monotonic() - started
    scored = None
    if threshold is not None:
        result, scored = backtest.at_threshold(result, threshold)
    _write(result, out)
    summary = backtest.summarise(result, labels, seconds)
    if scored is not None:
        by = labels[0]
        summary.ranking = backtest.ranking([(rid if by == "id" else key, score) for rid, key, score in scored], labels)
        summary.threshold = threshold
    print("\n".join([*summary.lines(), f"detections written to {out}"]), flush=True)
    return 0


def _bound(text: str | None, flag: str) -> dict[int, int] | int | None:
    """--from/--to: None, per-partition offsets `P=OFFSET,...`, epoch ms, or an ISO 8601 time."""
    if text is None:
        return None
    if "=" in text:
        try:
            return {int(p): int(o) for p, o in (pair.split("=", 1) for pair in text.split(","))}
        except ValueError:
            raise SettingsError(f"{flag} {text!r}: offsets are P=OFFSET,P=OFFSET (e.g. 0=100,1=250)") from None
    if text.isdigit():
        return int(text)
    import pandas as pd

    try:
        stamp = pd.Timestamp(text)
    except ValueError:
        raise SettingsError(f"{flag} {text!r} is neither a time (ISO 8601, epoch ms) nor offsets P=OFFSET,...") from None
    stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp
    return int(stamp.value // 1_000_000)


def _write(result, out: pathlib.Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".jsonl":
        with out.open("wb") as f:
            for d in result.detections:
                f.write(detection_json(d) + b"\n")
    else:
        result.frame().to_parquet(out, index=False)


def diff_main(argv: Sequence[str]) -> int:
    """`detectorkit diff A B`: two detection sets (backtest files, or `topic:NAME` over a time range)."""
    import os

    from detectorkit import backtest
    from detectorkit.backtest import diff

    p = argparse.ArgumentParser(
        prog="detectorkit diff",
        description="Compare two detection sets: backtest outputs (.jsonl, .parquet) or topics (topic:NAME, e.g. live against shadow).",
    )
    p.add_argument("a", help="a backtest's output file, or topic:NAME")
    p.add_argument("b", help="as A")
    p.add_argument("--from", dest="start", default=None, help="topics: from this time (ISO 8601 or epoch ms)")
    p.add_argument("--to", dest="end", default=None, help="topics: to this time, exclusive (default: their end now)")
    p.add_argument("--png", default=None, help="also draw the detections per hour to this PNG file")
    p.add_argument("--service", default=None, help="only this service's detections (and its shadow's, <service>-shadow): a shared topic holds many")
    p.add_argument(
        "--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"), help="topics: the brokers (default: KAFKA_BOOTSTRAP_SERVERS)"
    )
    args = p.parse_args(argv)
    try:
        start, end = _bound(args.start, "--from"), _bound(args.end, "--to")
        if isinstance(start, dict) or isinstance(end, dict):
            raise SettingsError("diff takes times for --from and --to: two topics' offsets do not line up")
        conf = clients.base(args.bootstrap_servers) if args.bootstrap_servers else None
        sets = [diff.load(where, conf, start, end) for where in (args.a, args.b)]
        if args.service:
            wanted = {args.service, f"{args.service}-shadow"}
            sets = [[d for d in found if d.get("service") in wanted] for found in sets]
        found = diff.compare(*sets, args.a, args.b)
        if args.png:
            found.chart(args.png)
    except (SettingsError, backtest.HistoryError) as exc:
        return fail(str(exc))
    print("\n".join(found.lines() + ([f"chart: {args.png}"] if args.png else [])), flush=True)
    return 0
