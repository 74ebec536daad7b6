"""What a job applies to each batch of parsed records: a stage. The runtime (Kafka in and out,
offsets, dead letters, metrics, hand-overs) is the same for every role of the diamond; only the
stage differs: a detector, the upstream normaliser, ...

A stage turns the values of one Arrow batch of Kafka records into outputs and rejections. An output names
the record it came from (its position in the batch), the key to write it under (None: the input
record's key) and its value; a rejection goes to the dead-letter topic with its reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import pandas as pd
import pyarrow as pa

from detectorkit import records as rec
from detectorkit.detector import Detector
from detectorkit.records import detections_of
from detectorkit.settings import Settings, SettingsError
from detectorkit.state.declaration import EVENT_TIME, KEY, State
from detectorkit.state.runner import run_stateful
from detectorkit.state.store import PartitionStore


# Neither Source nor Output is frozen: one of each is made per detection, and a frozen dataclass's
# constructor sets each field through object.__setattr__.
@dataclass(slots=True)
class Source:
    """Where an input record was read, for outputs that cite it."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset, "timestamp_ms": self.timestamp_ms, "key": self.key}


class Sources:
    """Where a batch's records were read: `sources(position)` is one record's `Source`,
    `sources.dicts(positions)` many at once as the dicts outputs cite (their keys decoded in one
    pass over the column: a detector may find a fifth of its records)."""

    def __init__(self, topic: str, partitions: np.ndarray, offsets: np.ndarray, stamps_ms: np.ndarray, keys: pa.Array):
        self.topic, self.partitions, self.offsets, self.stamps_ms, self.keys = topic, partitions, offsets, stamps_ms, keys

    def __call__(self, position: int) -> Source:
        key = self.keys[position].as_py()
        return Source(
            self.topic,
            int(self.partitions[position]),
            int(self.offsets[position]),
            int(self.stamps_ms[position]),
            None if key is None else key.decode(errors="replace"),
        )

    def dicts(self, positions: list[int]) -> list[dict[str, Any]]:
        at = np.asarray(positions, dtype=np.int64)
        keys = _texts(self.keys.take(pa.array(at))).tolist() if len(at) else []
        topic = self.topic
        return [
            {"topic": topic, "partition": p, "offset": o, "timestamp_ms": t, "key": k}
            for p, o, t, k in zip(self.partitions[at].tolist(), self.offsets[at].tolist(), self.stamps_ms[at].tolist(), keys, strict=True)
        ]


def source_dicts(source: Callable[[int], Source], positions: list[int]) -> list[dict[str, Any]]:
    """`Source.as_dict` of each position, at once where `source` is a batch's `Sources`."""
    if isinstance(source, Sources):
        return source.dicts(positions)
    return [source(p).as_dict() for p in positions]


@dataclass(slots=True)
class Output:
    position: int  # -1: no input record (a timer's detection); `key` and `partition` say whose
    value: dict[str, Any]
    key: str | None = None  # None: the input record's key
    timestamp_ms: int | None = None  # the output record's Kafka timestamp; None: the time it is written
    partition: int | None = None  # the input partition, when `position` is -1
    # (reason, message, value): not an output but a dead letter that names no input record.
    dead_letter: tuple[str, str, bytes] | None = None
    raw: bytes | None = None  # the value as it is written, instead of `value` as JSON (a record re-keyed)


@dataclass(frozen=True)
class KeyedBatch:
    """One input partition's records of a batch, with the partition's state: what `run_keyed` takes."""

    values: pa.Array  # the records' Kafka values (bytes or null), in offset order
    keys: pa.Array  # their Kafka keys: the state's keys
    stamps_ms: np.ndarray  # their Kafka timestamps (ms): the event time
    source: Callable[[int], Source] | None  # where the record at a position was read (None: no records, a tick)
    store: PartitionStore  # the partition's state
    tag: int  # the batch's end: the input offset the store's changes reflect once written
    topic: str  # the input topic
    idle_ms: int | None = None  # a tick: the event time a quiet partition is taken to have reached


class Relay(Protocol):
    """What a stage runs beside its batches in the job's process (the notifier's deliveries of the
    notifications its batches committed): started before the first batch, stopped after the last."""

    def start(self) -> Relay: ...

    def stop(self, timeout: float = 60.0) -> None: ...


class Stage(Protocol):
    """What a job applies to each batch, and the points of the job's life it is told of, in the
    order they come (runtime.job calls each; `StageBase` gives the ones a stage has no use for).
    A hand-over needs nothing of a stage: what it keeps per partition is its `state`, which the
    runtime restores wherever the partition goes."""

    name: str
    reasons: tuple[str, ...]  # dead-letter reasons it may give, shown as zeros from the start
    counts_as_detection: bool  # whether its outputs count in detector_detections_written_total
    # Keyed state it keeps per partition (runtime.processing opens the partition's store): such a
    # stage is run through `run_keyed` (as `DetectorStage.run_keyed`), one partition with its store.
    state: State | None
    ticks: bool  # it needs batches with nothing to read now and then (timers of quiet partitions)
    feeds_repartition: bool  # it re-keys another job's input (runtime.repartition): two readers share the session
    model_info: tuple[str, str] | None  # the (name, version) of the model it scores with, for detector_model_info

    def load_config(self) -> Any: ...

    def configured(self, config: Any) -> Stage:
        """0. Once its config is read: the stage to run with it (a window sized by a setting)."""
        ...

    def reading(self, decode: rec.Decode) -> Stage:
        """0'. With RECORD_FORMAT other than json: the stage reading its input's values with `decode`
        (kafka.schema_registry), or SettingsError if it reads JSON only."""
        ...

    def prepare_job(self, config: Any, settings: Any, base_conf: Mapping[str, Any], broker_kind: str) -> None:
        """1. At start, before the group is joined and before any batch: create what it needs
        (its topics) and take its configuration (the notifier: its state's TTL, its delivery)."""

    def run(self, values: pa.Array, config: Any, source: Callable[[int], Source], service: str) -> tuple[list[Output], list[rec.Rejected]]:
        """2. Each batch: `values` are the records' Kafka values (bytes or null); outputs and
        rejections name a record by its position there, and `source(position)` says where it was read."""
        ...

    def run_keyed(self, batch: KeyedBatch, config: Any, service: str) -> tuple[list[Output], list[rec.Rejected]]:
        """2. Each batch, for a stage with `state`: one partition's records with its store. Outputs of
        timers name no record (position -1): their key is the state's, their timestamp the timer's."""
        ...

    def relay(self, config: Any, settings: Any, base_conf: Mapping[str, Any], broker_kind: str, on_dead_letter, on_failure) -> Relay | None:
        """1'. At start, after `prepare_job`: what it runs beside its batches, if anything."""

    def also_reads(self, settings: Any) -> tuple[tuple[str, str], ...]:
        """What its relay reads beside the input, each in a consumer group of its own: (topic,
        group), so that its Kafka user is granted those too (detectorkit.manifests)."""
        ...

    @property
    def repartition_field(self) -> str | None:
        """0. The field its input is re-keyed by first, through a topic of the job's own; None: none."""
        ...

    def take_scores(self) -> tuple[list[int], float] | None:
        """After each call, in the worker: the scores its model gave since last asked (counts in
        SCORE_BUCKETS, their sum), for detector_model_scores; None: it scores with no model."""
        ...

    def warm(self) -> None:
        """In a Python worker, before its first task: what its calls load once (a model's session,
        compiled code), so that its first batch does not pay for it."""
        ...


class StageBase:
    """What a stage without a lifecycle does at each point: nothing."""

    state: State | None = None
    ticks: bool = False
    feeds_repartition: bool = False
    model_info: tuple[str, str] | None = None

    def configured(self, config: Any) -> Stage:
        return self

    def reading(self, decode: rec.Decode) -> Stage:
        raise SettingsError(f"the {self.name} reads JSON records only: unset RECORD_FORMAT (or set it to json)")

    def prepare_job(self, config: Any, settings: Any, base_conf: Mapping[str, Any], broker_kind: str) -> None:
        return None

    def run_keyed(self, batch: KeyedBatch, config: Any, service: str) -> tuple[list[Output], list[rec.Rejected]]:
        raise TypeError(f"stage {self.name!r} keeps no state: it runs through run(), not run_keyed()")

    def relay(self, config: Any, settings: Any, base_conf: Mapping[str, Any], broker_kind: str, on_dead_letter, on_failure) -> Relay | None:
        return None

    def also_reads(self, settings: Any) -> tuple[tuple[str, str], ...]:
        return ()

    @property
    def repartition_field(self) -> str | None:
        """The field the job re-keys its input by before the stage (runtime.repartition); None: none."""
        return None

    def take_scores(self) -> tuple[list[int], float] | None:
        return None

    def warm(self) -> None:
        return None


@dataclass(frozen=True)
class DetectorStage(StageBase):
    """A data scientist's `Detector` as a stage: the function on the whole batch, each detection
    written as {"service", "detection", "source"} under the input record's key."""

    detector: Detector
    reasons: tuple[str, ...] = rec.REASONS
    counts_as_detection: bool = True
    decode: rec.Decode | None = None  # None: JSON, Arrow's fast path first

    @property
    def name(self) -> str:
        return self.detector.name

    @property
    def repartition_field(self) -> str | None:
        return self.detector.key_field if self.detector.repartition else None

    def load_config(self) -> Any:
        return self.detector.load_config()

    def configured(self, config: Any) -> DetectorStage:
        detector = self.detector.configured(config)
        return self if detector is self.detector else replace(self, detector=detector)

    def reading(self, decode: rec.Decode) -> DetectorStage:
        return replace(self, decode=decode)

    @property
    def state(self) -> State | None:
        return self.detector.state

    @property
    def ticks(self) -> bool:
        return self.detector.on_timer is not None

    @property
    def model_info(self) -> tuple[str, str] | None:
        return self.detector.model_info

    def take_scores(self) -> tuple[list[int], float] | None:
        return None if self.detector.take_scores is None else self.detector.take_scores()

    def warm(self) -> None:
        if self.detector.warm is not None:
            self.detector.warm()

    def run(self, values: pa.Array, config: Any, source: Callable[[int], Source], service: str) -> tuple[list[Output], list[rec.Rejected]]:
        frame, rejected = rec.parse_arrow(values, self.detector.required_fields, self.decode)
        found, failed = detect_isolating(self.detector, config, frame)
        return self._outputs(found, source, service), rejected + failed

    def run_keyed(self, batch: KeyedBatch, config: Any, service: str) -> tuple[list[Output], list[rec.Rejected]]:
        """`run` for a detector with state: one partition's records, in offset order, with their
        Kafka keys and timestamps, and the partition's store. Detections of timers name no record:
        their key is the state's, their timestamp the timer's."""
        values, keys, stamps_ms, store = batch.values, batch.keys, batch.stamps_ms, batch.store
        frame, rejected = rec.parse_arrow(values, self.detector.required_fields, self.decode) if len(values) else (pd.DataFrame(), [])
        if keys.null_count:
            keyless = [int(i) for i in frame.index if not keys[int(i)].is_valid]
            rejected += [rec.Rejected(i, rec.MISSING_FIELD, "a detector with state needs the record's Kafka key (its state's key)") for i in keyless]
            frame = frame.drop(index=keyless)
        if self.detector.key_field is not None and len(frame):
            frame, refused = _keyed_by_field(frame, keys, self.detector.key_field)
            rejected += refused
        field = self.detector.event_time_field
        if field is not None and len(frame):
            # The detector's own clock: its field, in place of the Kafka timestamp, for the state's time too.
            ms, bad = rec.event_times_ms(frame[field])
            refused = frame.index[bad]
            rejected += [
                rec.Rejected(int(i), rec.BAD_EVENT_TIME, f"{field}={frame.at[i, field]!r} is not an event time: epoch milliseconds or ISO 8601")
                for i in refused
            ]
            frame = frame[~bad]
            stamps_ms = np.array(stamps_ms, dtype=np.int64, copy=True)
            stamps_ms[frame.index.to_numpy()] = ms[~bad]
        positions = frame.index.to_numpy()
        if len(positions):
            frame[KEY] = _texts(keys.take(pa.array(positions)))
            frame[EVENT_TIME] = rec.utc_times(stamps_ms[positions])
        stamps = pd.Series(stamps_ms[positions], index=frame.index)
        result = run_stateful(self.detector, config, frame, stamps, store, batch.tag, batch.idle_ms)
        store.late += result.late
        outputs = self._outputs(result.found, batch.source, service)
        for d in result.fired:
            # What the detection is about: the key's timer, in its partition (the notifier's identity of a detection).
            timer = {"topic": batch.topic, "partition": store.partition, "key": d.key, "timer_ms": d.deadline_ms, "timestamp_ms": d.deadline_ms}
            value = {"service": service, "detection": d.fields, "source": timer}
            outputs.append(Output(-1, value, key=d.key, timestamp_ms=d.deadline_ms, partition=store.partition))
        for f in result.failed_timers:
            outputs.append(Output(-1, {}, key=f.key, partition=store.partition, dead_letter=(rec.DETECTOR_ERROR, f.message, f.value)))
        return outputs, rejected + result.rejected

    @staticmethod
    def _outputs(found: list[tuple[int, dict]], source: Callable[[int], Source], service: str) -> list[Output]:
        cited = source_dicts(source, [position for position, _ in found])
        return [
            Output(position, {"service": service, "detection": fields, "source": where})
            for (position, fields), where in zip(found, cited, strict=True)
        ]


def _keyed_by_field(frame: pd.DataFrame, keys: pa.Array, field: str) -> tuple[pd.DataFrame, list[rec.Rejected]]:
    """The records whose `field` is their Kafka key; the others refused. A partition's state lives
    with the task that reads it, and the Kafka key chose the partition: state keyed by anything else
    would be split across partitions and instances. Key the topic upstream instead."""
    given = _texts(keys.take(pa.array(frame.index.to_numpy())))
    named = frame[field].astype(str).to_numpy()
    wrong = named != given
    refused = [
        rec.Rejected(
            int(i),
            rec.KEY_MISMATCH,
            f"{field}={frame.at[i, field]!r} is not the record's Kafka key {k!r}: state is kept per Kafka key; key the topic by {field} upstream",
        )
        for i, k in zip(frame.index[wrong], given[wrong], strict=True)
    ]
    return frame[~wrong], refused


def _texts(keys: pa.Array) -> np.ndarray:
    """Kafka keys (bytes) as the strings a detector sees: UTF-8, a byte that is not replaced."""
    try:
        return keys.cast(pa.string()).to_numpy(zero_copy_only=False)
    except pa.ArrowInvalid:
        return np.array([None if k is None else k.decode(errors="replace") for k in keys.to_pylist()], dtype=object)


def as_stage(job: Detector | Stage) -> Stage:
    return DetectorStage(job) if isinstance(job, Detector) else job


def input_decoder(settings: Settings) -> rec.Decode | None:
    """RECORD_FORMAT's reader of the input's values, with the registry's schemas; None for JSON,
    which a stage reads itself."""
    if settings.record_format == "json":
        return None
    from detectorkit.kafka import schema_registry

    return schema_registry.decoder(settings.record_format, settings.registry_conf())


def prepared(job: Detector | Stage, settings: Settings, config: Any = None) -> tuple[Stage, Settings, Any]:
    """What a job runs, read once: its stage, configured and reading its input as RECORD_FORMAT
    says; the settings made its service's; its config (from DETECTOR_*, unless given). Raises
    SettingsError."""
    stage = as_stage(job)
    # Settings a caller specialised already (the command line, a shadow's) are kept as they are.
    settings = settings if settings.consumer_group and settings.dlq_topic else settings.for_service(stage.name)
    config = stage.load_config() if config is None else config
    return reading_input(stage.configured(config), settings), settings, config


def reading_input(stage: Stage, settings: Settings) -> Stage:
    """The stage reading its input as RECORD_FORMAT says; SettingsError for a stage that reads JSON only."""
    decode = input_decoder(settings)
    return stage if decode is None else stage.reading(decode)


def detect_isolating(detector: Detector, config: Any, frame: pd.DataFrame) -> tuple[list[tuple[int, dict]], list[rec.Rejected]]:
    """Detections as (record position, fields); records on which the detector raises are rejected.

    The detector runs on the whole batch; if it raises, the batch is split in halves and each half
    retried, down to single records, so only the records that make it fail go to the dead-letter
    topic. Splitting finds k bad records among n in about k*log2(n) calls instead of n.
    """
    if frame.empty:
        return [], []
    try:
        return detections_of(detector.detect(frame, config), frame.index, single=len(frame) == 1), []
    except Exception as exc:  # noqa: BLE001 - any failure of user code is a dead letter, not a crash
        if len(frame) == 1:
            return [], [rec.detector_error(int(frame.index[0]), exc)]
    middle = len(frame) // 2
    found_a, failed_a = detect_isolating(detector, config, frame.iloc[:middle])
    found_b, failed_b = detect_isolating(detector, config, frame.iloc[middle:])
    return found_a + found_b, failed_a + failed_b
