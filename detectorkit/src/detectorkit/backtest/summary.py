"""What a backtest found, in a few lines: records read, dead letters by reason, detections by rule,
per hour and by key, and with labels (records or keys known to be anomalous) its precision and recall."""

from __future__ import annotations

import collections
import dataclasses
import pathlib
from dataclasses import dataclass, field

import pandas as pd

from detectorkit.backtest.history import HistoryError
from detectorkit.backtest.replay import Backtest

TOP_KEYS = 10


@dataclass
class Score:
    by: str  # "id" (a record's id field) or "key"
    labelled: int
    flagged: int
    both: int

    @property
    def precision(self) -> float | None:
        return self.both / self.flagged if self.flagged else None

    @property
    def recall(self) -> float | None:
        return self.both / self.labelled if self.labelled else None


@dataclass
class Ranking:
    """How a model's scores rank the labelled above the rest: the ROC AUC over every scored record
    (by id) or key (its highest score), the probability that a labelled one outscores another."""

    by: str
    scored: int
    labelled: int
    auc: float | None

    def line(self, threshold: float) -> str:
        auc = "n/a (needs labelled and unlabelled ones)" if self.auc is None else f"{self.auc:.3f}"
        scored = f"scores by {self.by}: {self.scored:,} scored, {self.labelled:,} of them labelled"
        return f"{scored}: ROC AUC {auc} (the detections, and their precision and recall, are those at the threshold {threshold:g})"


def ranking(scored: list[tuple[str | None, float]], labels: tuple[str, set[str]]) -> Ranking:
    """`scored`: (the record's id, or its key for labels by key; its score) of every scored record."""
    by, labelled = labels
    best: dict[str, float] = {}
    for name, score in scored:
        if name is not None:
            best[name] = max(best.get(name, float("-inf")), score)
    names = list(best)
    positive = pd.Series([n in labelled for n in names], dtype=bool)
    ranks = pd.Series([best[n] for n in names], dtype=float).rank(method="average")
    pos, neg = int(positive.sum()), int((~positive).sum())
    auc = None
    if pos and neg:
        # Mann-Whitney's U over the average ranks (ties count half): no training library needed.
        auc = float((ranks[positive].sum() - pos * (pos + 1) / 2) / (pos * neg))
    return Ranking(by, len(names), pos, auc)


@dataclass
class Summary:
    service: str
    records: int
    detections: int
    dead_letters: dict[str, int]
    by_rule: dict[str, int]
    per_hour: dict[str, int]  # "2026-11-26T10:00Z" -> detections
    top_keys: list[tuple[str, int]]
    pending_timers: int
    score: Score | None = None
    notes: list[str] = field(default_factory=list)
    seconds: float | None = None  # how long the backtest took
    first_error: str | None = None
    late: int = 0
    ranking: Ranking | None = None
    threshold: float | None = None  # a model detector's, with `ranking`

    def lines(self) -> list[str]:
        took = ""
        if self.seconds is not None:
            took = f" in {self.seconds:,.1f} s ({self.records / self.seconds if self.seconds > 0 else 0:,.0f} records/s)"
        out = [
            f"{self.service}: {self.records:,} records read{took}, {self.detections:,} detections, {sum(self.dead_letters.values()):,} dead letters",
        ]
        if self.late:
            out.append(f"late: {self.late:,} records dropped, older than their key's newest by more than the grace or for windows already closed")
        if self.dead_letters:
            out.append("dead letters: " + ", ".join(f"{reason} {n:,}" for reason, n in sorted(self.dead_letters.items())))
        if self.by_rule:
            out.append("by rule: " + ", ".join(f"{rule} {n:,}" for rule, n in sorted(self.by_rule.items())))
        if self.per_hour:
            out.append("per hour: " + ", ".join(f"{hour} {n:,}" for hour, n in self.per_hour.items()))
        if self.top_keys:
            out.append("top keys: " + ", ".join(f"{key} {n:,}" for key, n in self.top_keys))
        if self.score is not None:
            s = self.score
            p = "n/a" if s.precision is None else f"{s.precision:.3f}"
            r = "n/a" if s.recall is None else f"{s.recall:.3f}"
            out.append(f"labels by {s.by}: {s.labelled:,} labelled, {s.flagged:,} flagged, {s.both:,} both: precision {p}, recall {r}")
        if self.ranking is not None:
            out.append(self.ranking.line(self.threshold))
        if self.first_error is not None:
            failed = self.dead_letters.get("detector_error", 0)
            out.append(
                f"the detector raised on {failed:,} record(s) or timer(s) (dead letters, detector_error); the first:\n{self.first_error.rstrip()}"
            )
        return out + self.notes


def at_threshold(result: Backtest, threshold: float) -> tuple[Backtest, list[tuple[str | None, str | None, float]]]:
    """A model detector's backtest run at no threshold (every scored record a detection): the
    detections at `threshold`, and (record id, key, score) of every scored record."""
    scored = [(rid, d["source"].get("key"), float(d["detection"]["score"])) for d, rid in zip(result.detections, result.record_ids, strict=True)]
    kept = [i for i, (_, _, score) in enumerate(scored) if score >= threshold]
    return dataclasses.replace(result, detections=[result.detections[i] for i in kept], record_ids=[result.record_ids[i] for i in kept]), scored


def summarise(result: Backtest, labels: tuple[str, set[str]] | None = None, seconds: float | None = None) -> Summary:
    """The summary of a backtest; `labels`: ("id" or "key", the labelled values): "flagged" counts
    the distinct ids (records' `id` fields; a timer's detection has none) or Kafka keys among the
    detections, "both" those also labelled. `seconds`: how long it took."""
    rules = collections.Counter(str(d["detection"].get("rule", result.service)) for d in result.detections)
    stamps = pd.to_datetime([d["source"]["timestamp_ms"] for d in result.detections], unit="ms", utc=True)
    hours = collections.Counter(t.strftime("%Y-%m-%dT%H:00Z") for t in stamps.floor("h")) if len(stamps) else collections.Counter()
    keys = collections.Counter(str(d["source"].get("key")) for d in result.detections if d["source"].get("key") is not None)
    summary = Summary(
        result.service,
        result.records,
        len(result.detections),
        dict(result.dead_letters),
        dict(rules),
        dict(sorted(hours.items())),
        keys.most_common(TOP_KEYS),
        result.pending_timers,
        seconds=seconds,
        first_error=result.first_error,
        late=result.late,
    )
    if labels is not None:
        by, labelled = labels
        flagged = {
            value
            for value in (rid if by == "id" else d["source"].get("key") for d, rid in zip(result.detections, result.record_ids, strict=True))
            if value is not None
        }
        summary.score = Score(by, len(labelled), len(flagged), len(flagged & labelled))
    if result.pending_timers:
        summary.notes.append(
            f"{result.pending_timers:,} timer(s) were pending when the history ended: live, a quiet partition's event time moves on with "
            "the wall clock (TIMER_IDLE_GRACE_SECONDS) and they would fire; a backtest moves time only with records"
        )
    return summary


def read_labels(path: str) -> tuple[str, set[str]]:
    """A labels file: a header line `id` (records' id fields) or `key` (Kafka keys), then one value a line."""
    try:
        lines = [line.strip() for line in pathlib.Path(path).read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise HistoryError(f"cannot read labels {path}: {exc}") from None
    if not lines or lines[0] not in ("id", "key"):
        raise HistoryError(f"labels {path} must begin with a header line 'id' or 'key', then one value a line")
    wrong = [line for line in lines[1:] if "," in line or "\t" in line]
    if wrong:
        raise HistoryError(f"labels {path} hold one value a line, not {wrong[0]!r}")
    return lines[0], set(lines[1:])
