"""Two detection sets compared: what only A flagged, what only B flagged, what both did, per hour.

A set is a backtest's output file (.jsonl: the output topic's values; .parquet: its table) or a
detections topic read over a time range (live against shadow). Two detections of windows (or
episodes: a detection with window_start_ms and window_end_ms) are the same when they are of the same
key and their windows overlap, each matched once, earliest first: a burst found one record sooner
by a lower threshold is the same burst. Other detections are the same when they come from the same
source: the same input record (partition and offset), or the same key's timer at the same time.
What each says may differ between versions and is not compared.
"""

from __future__ import annotations

import collections
import json
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from detectorkit.backtest.history import HistoryError, from_kafka

WINDOW = ("window_start_ms", "window_end_ms")


def window_of(detection: Mapping[str, Any]) -> tuple[str, int, int] | None:
    """(key, start, end) of a window's (or an episode's) detection; None for another."""
    fields = detection.get("detection") or {}
    if not all(isinstance(fields.get(f), int | float) for f in WINDOW):
        return None
    key = fields.get("key", detection["source"].get("key"))
    return str(key), int(fields[WINDOW[0]]), int(fields[WINDOW[1]])


def identity(detection: Mapping[str, Any]) -> tuple:
    """What a detection that is not of a window comes from: its input record, or its key's timer."""
    source = detection["source"]
    if source.get("timer_ms") is not None:
        return (source["partition"], "timer", source.get("key"), source["timer_ms"])
    return (source["partition"], "record", source["offset"])


def _hour(detection: Mapping[str, Any]) -> str:
    return pd.Timestamp(detection["source"]["timestamp_ms"], unit="ms", tz="UTC").strftime("%Y-%m-%dT%H:00Z")


@dataclass
class Diff:
    a: str
    b: str
    hours: dict[str, dict[str, int]] = field(default_factory=dict)  # hour -> {"only_a", "only_b", "both"}
    by_window: int = 0  # detections matched by key and overlapping window
    by_source: int = 0  # detections matched by their source record or timer

    def totals(self) -> dict[str, int]:
        out = collections.Counter()
        for counts in self.hours.values():
            out.update(counts)
        return {k: out[k] for k in ("only_a", "only_b", "both")}

    def lines(self) -> list[str]:
        t = self.totals()
        width = max([len("hour"), *(len(h) for h in self.hours)])
        rows = [f"A: {self.a}", f"B: {self.b}", f"{'hour':<{width}}  {'only A':>8}  {'only B':>8}  {'both':>8}"]
        rows += [f"{h:<{width}}  {c['only_a']:>8,}  {c['only_b']:>8,}  {c['both']:>8,}" for h, c in self.hours.items()]
        rows.append(f"{'total':<{width}}  {t['only_a']:>8,}  {t['only_b']:>8,}  {t['both']:>8,}")
        how = []
        if self.by_window:
            how.append(f"{self.by_window:,} by key and overlapping window")
        if self.by_source:
            how.append(f"{self.by_source:,} by source record or timer")
        return rows + ([f"compared: {', '.join(how)}"] if how else [])

    def chart(self, path: str | pathlib.Path) -> None:
        """A PNG: per hour, the detections in both, only in A and only in B, stacked."""
        try:
            import matplotlib
        except ImportError:
            raise HistoryError("a chart needs matplotlib: pip install 'detectorkit[dev]'") from None
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        hours = list(self.hours)
        both = [self.hours[h]["both"] for h in hours]
        only_a = [self.hours[h]["only_a"] for h in hours]
        only_b = [self.hours[h]["only_b"] for h in hours]
        fig, ax = plt.subplots(figsize=(max(6, len(hours) * 0.4), 4))
        ax.bar(hours, both, label="both", color="#9e9e9e")
        ax.bar(hours, only_a, bottom=both, label=f"only A ({self.a})", color="#1f77b4")
        ax.bar(hours, only_b, bottom=[x + y for x, y in zip(both, only_a, strict=True)], label=f"only B ({self.b})", color="#ff7f0e")
        ax.set_ylabel("detections")
        ax.set_title("detections per hour (UTC)")
        ax.tick_params(axis="x", rotation=90)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, format="png")
        plt.close(fig)


def compare(a: list[dict], b: list[dict], name_a: str = "A", name_b: str = "B") -> Diff:
    """Two detection sets side by side (a shadow and its live service, two backtests): per hour, how
    many both found and how many only one did, a window matched to an overlapping one of its key;
    `detectorkit diff` prints it."""
    hours: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    windowed_a = [d for d in a if window_of(d) is not None]
    windowed_b = [d for d in b if window_of(d) is not None]
    matched, unmatched_b = _matched_windows(windowed_a, windowed_b)
    for d, hit in matched:
        hours[_hour(d)]["both" if hit else "only_a"] += 1
    for d in unmatched_b:
        hours[_hour(d)]["only_b"] += 1
    ids_a = {identity(d): d for d in a if window_of(d) is None}
    ids_b = {identity(d): d for d in b if window_of(d) is None}
    for key, d in ids_a.items():
        hours[_hour(d)]["both" if key in ids_b else "only_a"] += 1
    for key, d in ids_b.items():
        if key not in ids_a:
            hours[_hour(d)]["only_b"] += 1
    counts = {h: {k: hours[h][k] for k in ("only_a", "only_b", "both")} for h in sorted(hours)}
    return Diff(name_a, name_b, counts, len(windowed_a) + len(windowed_b), len(ids_a) + len(ids_b))


def _matched_windows(a: list[dict], b: list[dict]) -> tuple[list[tuple[dict, bool]], list[dict]]:
    """Each of `a` and whether a window of `b` matches it (of its key, overlapping it, each matched
    once, in order of start), and the windows of `b` none matched."""
    theirs: dict[str, list[tuple[int, int, int]]] = collections.defaultdict(list)
    for n, d in enumerate(b):
        key, start, end = window_of(d)
        theirs[key].append((start, end, n))
    for spans in theirs.values():
        spans.sort()
    out = []
    for d in sorted(a, key=lambda d: window_of(d)[1:]):
        key, start, end = window_of(d)
        spans = theirs.get(key, [])
        hit = next((i for i, (s, e, _) in enumerate(spans) if s <= end and start <= e), None)
        if hit is not None:
            spans.pop(hit)
        out.append((d, hit is not None))
    return out, [b[n] for spans in theirs.values() for _, _, n in spans]


def load(where: str, base_conf: Mapping[str, Any] | None = None, start_ms: int | None = None, end_ms: int | None = None) -> list[dict]:
    """Detections from a file (.jsonl or .parquet) or from `topic:NAME` over [start_ms, end_ms)."""
    if where.startswith("topic:"):
        if base_conf is None:
            raise HistoryError(f"{where}: reading a topic needs KAFKA_BOOTSTRAP_SERVERS")
        history = from_kafka(base_conf, where.removeprefix("topic:"), start_ms, end_ms)
        return [json.loads(v) for part in history.chunks for v in part.values.to_pylist() if v is not None]
    path = pathlib.Path(where)
    try:
        if path.suffix == ".parquet":
            table = pd.read_parquet(path)
            return [_from_row(row) for row in table.to_dict(orient="records")]
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError, KeyError) as exc:
        raise HistoryError(f"cannot read detections from {where}: {exc}".splitlines()[0]) from None


def _from_row(row: Mapping[str, Any]) -> dict:
    timer = row.get("timer_ms")
    source = {"partition": int(row["partition"]), "offset": int(row["offset"]), "timestamp_ms": int(row["timestamp_ms"]), "key": row.get("key")}
    if timer is not None and not pd.isna(timer):
        source["timer_ms"] = int(timer)
    return {"service": row.get("service"), "detection": json.loads(row["detection"]), "source": source}
