"""A detector over a history, as the live service runs it: each partition's records in offset order
through the same stage (parsing, dead letters, the detector, its state and event-time timers), with
a state store per partition that starts empty and is thrown away at the end. Nothing is written to
Kafka and no offset is committed."""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from detectorkit import records as rec
from detectorkit.backtest.history import Chunk, History, kafka_chunks
from detectorkit.detector import Detector
from detectorkit.runtime.stage import DetectorStage, KeyedBatch, Output, Source
from detectorkit.state.store import PartitionStore


@dataclass
class Backtest:
    """What a backtest found: each detection as the live output topic's value would hold it, the dead
    letters by reason, and what one pass over history cannot settle."""

    service: str
    records: int = 0
    detections: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: collections.Counter = field(default_factory=collections.Counter)
    # The `id` field of the records detections came from (None: a timer's, or a record without one).
    record_ids: list[str | None] = field(default_factory=list)
    # Keys whose timers were still pending when history ended: live, a quiet partition's event time
    # moves on with the wall clock (TIMER_IDLE_GRACE_SECONDS) and they would fire; here they do not.
    pending_timers: int = 0
    # The first exception the detector raised, with its traceback: the dead letters say only its line.
    first_error: str | None = None
    late: int = 0  # records a rule dropped as late

    def frame(self) -> pd.DataFrame:
        """The detections as a table: the source's fields as columns, the detection as JSON."""
        rows = [
            {
                "service": d["service"],
                "key": d["source"].get("key"),
                "partition": d["source"]["partition"],
                "offset": d["source"].get("offset", -1),
                "timestamp_ms": d["source"]["timestamp_ms"],
                "timer_ms": d["source"].get("timer_ms"),
                "record_id": rid,
                "detection": json.dumps(d["detection"], sort_keys=True, default=str),
            }
            for d, rid in zip(self.detections, self.record_ids, strict=True)
        ]
        columns = ["service", "key", "partition", "offset", "timestamp_ms", "timer_ms", "record_id", "detection"]
        return pd.DataFrame(rows, columns=columns)


def run(
    detector: Detector,
    history: History,
    config: Any = None,
    service: str | None = None,
    progress: Callable[[int], None] | None = None,
    decode: rec.Decode | None = None,
) -> Backtest:
    """Runs `detector` (with `config`, else its config from DETECTOR_*) over `history`, whose values
    `decode` reads where they are not JSON (kafka.schema_registry's decoder, as RECORD_FORMAT says)."""
    config = detector.load_config() if config is None else config
    stage = DetectorStage(detector.configured(config), decode=decode)
    service = service or stage.name
    result = Backtest(service)
    stores: dict[int, PartitionStore] = {}
    for part in history.chunks:
        result.records += len(part)
        if stage.state is None:
            outputs, rejected = stage.run(part.values, config, _source(part), service)
        else:
            store = stores.setdefault(part.partition, PartitionStore(stage.state, part.partition, f"backtest {part.topic}-{part.partition}"))
            tag = int(part.offsets[-1]) + 1
            batch = KeyedBatch(part.values, part.keys, part.stamps_ms, _source(part), store, tag, part.topic)
            outputs, rejected = stage.run_keyed(batch, config, service)
            store.expire(tag)
            store.drop_changes()  # what live writes to the changelog: nothing to keep here
        _collect(result, part, outputs, rejected, decode)
        if progress is not None:
            progress(result.records)
    result.pending_timers = sum(store.pending_timers() for store in stores.values())
    result.late = sum(store.late for store in stores.values())
    return result


def _source(part: Chunk) -> Callable[[int], Source]:
    keys = part.keys

    def source(position: int) -> Source:
        key = keys[position].as_py()
        text = None if key is None else key.decode(errors="replace")
        return Source(part.topic, part.partition, int(part.offsets[position]), int(part.stamps_ms[position]), text)

    return source


def _collect(result: Backtest, part: Chunk, outputs: list[Output], rejected: list, decode: rec.Decode | None) -> None:
    for r in rejected:
        result.dead_letters[r.reason] += 1
        if result.first_error is None and r.detail is not None:
            result.first_error = r.detail
    for out in outputs:
        if out.dead_letter is not None:
            result.dead_letters[out.dead_letter[0]] += 1
            if result.first_error is None and out.dead_letter[0] == rec.DETECTOR_ERROR:
                result.first_error = f"on_timer of key {out.key!r}: {out.dead_letter[1]}"
            continue
        value = dict(out.value)
        if out.position >= 0:
            result.record_ids.append(_record_id(part.values[out.position].as_py(), decode))
        else:
            result.record_ids.append(None)
        result.detections.append(value)


def _record_id(value: bytes | None, decode: rec.Decode | None) -> str | None:
    try:
        found = None if value is None else json.loads(value) if decode is None else decode(value)
    except ValueError:  # rec.Refused is one
        return None
    return None if not isinstance(found, dict) or found.get("id") is None else str(found["id"])


def run_on_spark(
    spark: Any,
    detector: Detector,
    history: History,
    config: Any = None,
    service: str | None = None,
    kafka: tuple[Mapping[str, Any], str, float] | None = None,
    decode: rec.Decode | None = None,
) -> Backtest:
    """`run`, as a Spark batch job: one task per partition of a Kafka history (`kafka`: the client
    settings, the broker kind and the timeout), which reads its range and runs the stage in a
    Python worker, as `run` does in this process; the tasks' results are merged here. Partitions
    are independent (state and event time are per partition), so the answers are `run`'s."""
    if kafka is None:
        raise ValueError("a backtest on Spark reads a Kafka history: its tasks read their own partitions")
    config = detector.load_config() if config is None else config
    conf, kind, timeout = dict(kafka[0]), history.broker_kind or kafka[1], kafka[2]
    topic, name = history.topic, service or detector.name
    ranges = [(p, s, e) for p, (s, e) in sorted(history.ranges.items()) if e > s]

    def task(items):
        for p, s, e in items:
            history = History(topic, e - s, kafka_chunks(conf, topic, kind, {p: (s, e)}, timeout), {p: (s, e)})
            yield run(detector, history, config, name, decode=decode)

    if not ranges:
        return Backtest(name)
    return merged(name, spark.sparkContext.parallelize(ranges, len(ranges)).mapPartitions(task).collect())


def merged(service: str, parts: list[Backtest]) -> Backtest:
    """One backtest of the partitions' own: theirs are independent, so their sums are the answer."""
    done = Backtest(service)
    for part in parts:
        done.records += part.records
        done.detections += part.detections
        done.record_ids += part.record_ids
        done.dead_letters.update(part.dead_letters)
        done.pending_timers += part.pending_timers
    return done
