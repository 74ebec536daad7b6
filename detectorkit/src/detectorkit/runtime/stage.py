"""What a job applies to each batch of parsed records: a stage. The runtime (Kafka in and out,
offsets, dead letters, metrics, hand-overs) is the same for every role of the diamond; only the
stage differs: a detector, the upstream normaliser, ...

A stage turns the values of one Arrow batch of Kafka records into outputs and rejections. An output names
the record it came from (its position in the batch), the key to write it under (None: the input
record's key) and its value; a rejection goes to the dead-letter topic with its reason.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pandas as pd
import pyarrow as pa

from detectorkit.detector import Detector
from detectorkit.runtime import records as rec


@dataclass(frozen=True)
class Source:
    """Where an input record was read, for outputs that cite it."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: str | None = None


@dataclass(frozen=True)
class Output:
    position: int
    value: dict[str, Any]
    key: str | None = None  # None: the input record's key
    timestamp_ms: int | None = None  # the output record's Kafka timestamp; None: the time it is written


class Stage(Protocol):
    name: str
    reasons: tuple[str, ...]  # dead-letter reasons it may give, shown as zeros from the start
    counts_as_detection: bool  # whether its outputs count in detector_detections_written_total

    def load_config(self) -> Any: ...

    def run(self, values: pa.Array, config: Any, source: Callable[[int], Source], service: str) -> tuple[list[Output], list[rec.Rejected]]:
        """`values` are the records' Kafka values (bytes or null); outputs and rejections name a
        record by its position there, and `source(position)` says where it was read."""
        ...


@dataclass(frozen=True)
class DetectorStage:
    """A data scientist's `Detector` as a stage: the function on the whole batch, each detection
    written as {"service", "detection", "source"} under the input record's key."""

    detector: Detector
    reasons: tuple[str, ...] = rec.REASONS
    counts_as_detection: bool = True

    @property
    def name(self) -> str:
        return self.detector.name

    def load_config(self) -> Any:
        return self.detector.load_config()

    def run(self, values: pa.Array, config: Any, source: Callable[[int], Source], service: str) -> tuple[list[Output], list[rec.Rejected]]:
        frame, rejected = rec.parse_arrow(values, self.detector.required_fields)
        found, failed = run_detector(self.detector, config, frame)
        outputs = [Output(position, {"service": service, "detection": fields, "source": source(position).__dict__}) for position, fields in found]
        return outputs, rejected + failed


def as_stage(job: Detector | Stage) -> Stage:
    return DetectorStage(job) if isinstance(job, Detector) else job


def run_detector(detector: Detector, config: Any, frame: pd.DataFrame) -> tuple[list[tuple[int, dict]], list[rec.Rejected]]:
    """Detections as (record position, fields); records on which the detector raises are rejected.

    The detector runs on the whole batch; if it raises, the batch is split in halves and each half
    retried, down to single records, so only the records that make it fail go to the dead-letter
    topic. Splitting finds k bad records among n in about k*log2(n) calls instead of n.
    """
    if frame.empty:
        return [], []
    try:
        return _detections(detector.detect(frame, config), frame.index, single=len(frame) == 1), []
    except Exception as exc:  # noqa: BLE001 - any failure of user code is a dead letter, not a crash
        if len(frame) == 1:
            message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            return [], [rec.Rejected(int(frame.index[0]), rec.DETECTOR_ERROR, message[:2000])]
    middle = len(frame) // 2
    found_a, failed_a = run_detector(detector, config, frame.iloc[:middle])
    found_b, failed_b = run_detector(detector, config, frame.iloc[middle:])
    return found_a + found_b, failed_a + failed_b


def _detections(out: Any, index: pd.Index, single: bool = False) -> list[tuple[int, dict]]:
    if not isinstance(out, pd.DataFrame):
        raise TypeError(f"detect() must return a pandas DataFrame, not {type(out).__name__}")
    if out.empty:
        return []
    if not single and not out.index.isin(index).all():
        raise ValueError("detect() returned rows whose index is not the index of an input record")
    positions = [int(index[0])] * len(out) if single else [int(i) for i in out.index]
    return list(zip(positions, out.to_dict(orient="records"), strict=True))
