"""A detector over a sequence of batches without Kafka or Spark: what its tests need.

    run = DetectorHarness(DETECTOR, Config(min_records=3))
    first = run.batch(records_a)       # detections, indexed like records_a
    run.restart()                      # as after a redeploy: state read back from the changelog
    second = run.batch(records_b)
    run.advance("2026-11-23T15:00Z")   # event time moves on without records (a quiet partition)
    silent = run.take_fired()          # what timers detected, indexed by key, with their `deadline`

It uses the runtime's own store, changelog encoding and restore, so what passes here passes in the
job: state goes through JSON as it does through Kafka, a restart reads it back as a new instance
would, TTL follows event time. Records of a stateful detector need the `key` and `event_time`
columns the runtime adds (any time `pandas.to_datetime` reads); with `partitions` > 1 the keys are
spread over partitions by a stable hash, each with its own store, as the input topic's would be.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from detectorkit.records import detections_of, event_times_ms
from detectorkit.state.declaration import DEADLINE, EVENT_TIME, KEY
from detectorkit.state.runner import run_stateful
from detectorkit.state.store import PartitionStore

if TYPE_CHECKING:
    from detectorkit.detector import Detector  # a field's type: the harness only calls what a detector holds


class DetectorError(AssertionError):
    """The detector raised on some records: in the job they would go to the dead-letter topic."""


@dataclass
class DetectorHarness:
    detector: Detector
    config: Any = None
    partitions: int = 1
    stores: dict[int, PartitionStore] = field(default_factory=dict)
    # Per partition, the changelog as the job would have written it: (key, value or None, tag).
    changelog: dict[int, list[tuple[str, bytes | None, int]]] = field(default_factory=dict)
    offsets: dict[int, int] = field(default_factory=dict)
    fired: list[dict] = field(default_factory=list)
    late: int = 0  # records a rule dropped as late (in the job: detector_late_records_total)

    def __post_init__(self) -> None:
        if self.config is None:
            self.config = self.detector.config()
        self.detector = self.detector.configured(self.config)
        if self.partitions < 1:
            raise ValueError("partitions must be at least 1")

    def partition_of(self, key: str) -> int:
        return zlib.crc32(str(key).encode()) % self.partitions

    def batch(self, records: pd.DataFrame) -> pd.DataFrame:
        """The detections of one batch, indexed by the records they came from."""
        if self.detector.state is None:
            found = detections_of(self.detector.detect(records, self.config), records.index, single=len(records) == 1)
            return _frame(found, records.index.dtype)
        field = self.detector.event_time_field
        if field is not None:
            ms, bad = event_times_ms(records[field])
            if bad.any():
                raise DetectorError(f"{int(bad.sum())} record(s) with no event time in {field!r}: in the job, dead letters (bad_event_time)")
            records = records.assign(**{EVENT_TIME: pd.to_datetime(ms, unit="ms", utc=True)})
        if self.detector.key_field is not None and KEY not in records.columns:
            records = records.assign(**{KEY: records[self.detector.key_field].astype(str)})  # keyed upstream by it
        missing = [c for c in (KEY, EVENT_TIME) if c not in records.columns]
        if missing:
            raise ValueError(f"records of a stateful detector need the {' and '.join(missing)} column(s) the runtime adds")
        records = records.assign(**{KEY: records[KEY].astype(str), EVENT_TIME: event_times(records[EVENT_TIME])})
        stamps = records[EVENT_TIME].astype("int64") // 1_000_000
        found: list[tuple[Any, dict]] = []
        results = []
        parts = records[KEY].map(self.partition_of)
        for p in sorted(parts.unique()):
            mask = (parts == p).to_numpy()
            store = self.stores.setdefault(p, PartitionStore(self.detector.state, p))
            tag = self.offsets.get(p, 0) + int(mask.sum())
            # Positions, as in the job: the runner names records by their place in the batch.
            frame = records[mask].reset_index(drop=True)
            result = run_stateful(self.detector, self.config, frame, stamps[mask].reset_index(drop=True), store, tag)
            # Positions back to the records' own index, for the detections and the dead letters.
            index = records.index[mask]
            found.extend((index[position], fields) for position, fields in result.found)
            result.rejected = [dataclasses.replace(r, position=index[r.position]) for r in result.rejected]
            results.append(self._settle(p, store, tag, result))
        detections = _frame(found, records.index.dtype)
        _raise_failures(results, detections)
        return detections

    def advance(self, event_time) -> None:
        """Event time reaches `event_time` on every partition without a record: what the job does
        for a partition that has been quiet for TIMER_IDLE_GRACE_SECONDS. Timers due fire."""
        ms = int(event_times([event_time]).astype("int64")[0] // 1_000_000)
        results = []
        for p in range(self.partitions):
            store = self.stores.setdefault(p, PartitionStore(self.detector.state, p))
            tag = self.offsets.get(p, 0)
            result = run_stateful(self.detector, self.config, pd.DataFrame(), pd.Series(dtype="int64"), store, tag, idle_ms=ms)
            results.append(self._settle(p, store, tag, result))
        _raise_failures(results)

    def take_fired(self) -> pd.DataFrame:
        """What timers detected since the last call, indexed by key, with each timer's `deadline`."""
        fired, self.fired = self.fired, []
        if not fired:
            return pd.DataFrame(index=pd.Index([], dtype=object, name=KEY))
        return pd.DataFrame(fired).set_index(KEY)

    def _settle(self, p: int, store: PartitionStore, tag: int, result):
        """What the job does after a partition's records: expire, write the changelog, report."""
        store.expire(tag)
        self.changelog.setdefault(p, []).extend((k, v, tag) for k, v in store.take_changes())
        self.offsets[p] = tag
        self.late += result.late
        for d in result.fired:
            self.fired.append({KEY: d.key, **d.fields, DEADLINE: pd.Timestamp(d.deadline_ms, unit="ms", tz="UTC")})
        return result

    def run(self, batches) -> pd.DataFrame:
        """The detections of every batch, in order."""
        frames = [self.batch(b) for b in batches]
        return pd.concat(frames) if frames else pd.DataFrame()

    def restart(self) -> None:
        """Forget every store and read them back from the changelog, as a new instance would."""
        self.stores = {}
        for p, records in self.changelog.items():
            store = self.stores[p] = PartitionStore(self.detector.state, p)
            store.restore(((key, value, tag, offset) for offset, (key, value, tag) in enumerate(records)), self.offsets[p])
            store.position = self.offsets[p]

    def state(self) -> dict[str, dict]:
        """Every key's state, across partitions."""
        return {k: v for store in self.stores.values() for k, v in store.snapshot().items()}


def _raise_failures(results, detections: pd.DataFrame | None = None) -> None:
    """The job writes these to the dead-letter topic and goes on; a test wants to hear of them,
    once every partition has run (with the batch's `detections`, which the job writes too)."""
    rejected = [r for result in results for r in result.rejected]
    failed_timers = [f for result in results for f in result.failed_timers]
    failures = [r.message for r in rejected] + [f.message for f in failed_timers]
    if failures:
        error = DetectorError(f"the detector raised {len(failures)} time(s); first: {failures[0]}")
        error.rejected, error.failed_timers = rejected, failed_timers  # what the dead letters would say
        error.detections = detections
        raise error


def event_times(values) -> pd.Series:
    """Times as the runtime gives them to a detector: UTC, nanosecond resolution."""
    return pd.to_datetime(values, utc=True).astype("datetime64[ns, UTC]")


def _frame(found: list[tuple[Any, dict]], dtype) -> pd.DataFrame:
    if not found:
        return pd.DataFrame(index=pd.Index([], dtype=dtype))
    return pd.DataFrame([f for _, f in found], index=pd.Index([i for i, _ in found], dtype=dtype))
