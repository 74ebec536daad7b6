"""The metrics-aggregator: the metrics topic read as a table, summed per service, for Prometheus.

Rules (the unit tests state them one by one):
- Table: the latest snapshot per instance wins; the topic is read from the beginning at start, so a
  restarted aggregator rebuilds the same totals. (It needs the topic's history: do not compact it.)
- Counters (and histogram buckets, sums and counts) are summed over all instances of a service and
  never go down: an instance that stops keeps its last value in the sum, and an instance that
  restarts (same id, new start time) adds its new counts to what its earlier runs counted.
- Gauges are summed over live instances only, or their maximum taken where that is the meaning
  (lag, offsets); an instance silent for longer than the TTL leaves them and the `up` count.
- A malformed snapshot is counted and skipped.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client import Metric
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from . import snapshot as snap
from .metrics import PREFIX

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]  # sample name, sorted labels

# Gauges whose meaning across instances is a maximum, not a sum.
MAX_GAUGE_WORDS = ("lag", "offset")


def _key(name: str, labels: dict[str, str]) -> SeriesKey:
    return name, tuple(sorted(labels.items()))


@dataclass
class InstanceState:
    service: str
    started_at: float
    last_seen: float
    counters: dict[SeriesKey, float] = field(default_factory=dict)
    # What earlier runs of this instance counted, carried into the sum after a restart.
    earlier_runs: dict[SeriesKey, float] = field(default_factory=dict)
    gauges: dict[SeriesKey, float] = field(default_factory=dict)


@dataclass
class FamilyInfo:
    type: str
    help: str


class Aggregator:
    def __init__(self, ttl_seconds: float = 30.0):
        self.ttl = ttl_seconds
        self.instances: dict[str, InstanceState] = {}
        self.families: dict[str, dict[str, FamilyInfo]] = defaultdict(dict)  # service -> family name -> info
        self._sample_family: dict[str, str] = {}  # sample name -> family name
        self.malformed = 0
        self.applied = 0

    def apply(self, key: bytes | None, value: bytes | None) -> bool:
        """Take one record of the metrics topic; False (and counted) if it is malformed."""
        try:
            s = snap.parse(value)
            if key is not None and key.decode(errors="replace") != s.instance:
                raise snap.MalformedSnapshot("key and instance differ")
        except snap.MalformedSnapshot:
            self.malformed += 1
            return False
        self._apply(s)
        self.applied += 1
        return True

    def _apply(self, s: snap.Snapshot) -> None:
        counters: dict[SeriesKey, float] = {}
        gauges: dict[SeriesKey, float] = {}
        for family in s.families:
            self.families[s.service][family.name] = FamilyInfo(family.type, family.help)
            for name, labels, value in family.samples:
                self._sample_family[name] = family.name
                (gauges if family.type == "gauge" else counters)[_key(name, labels)] = value
        state = self.instances.get(s.instance)
        if state is None or state.service != s.service:
            state = self.instances[s.instance] = InstanceState(s.service, s.started_at, s.timestamp)
        elif s.started_at < state.started_at:
            return  # a late snapshot of an earlier run: that run's total is already carried
        elif s.started_at > state.started_at:
            for series, value in state.counters.items():
                state.earlier_runs[series] = state.earlier_runs.get(series, 0.0) + value
            state.started_at = s.started_at
        state.counters = counters
        state.gauges = gauges
        state.last_seen = max(state.last_seen, s.timestamp)

    def live(self, state: InstanceState, now: float) -> bool:
        return now - state.last_seen <= self.ttl

    def totals(self, now: float | None = None) -> dict[str, dict[SeriesKey, float]]:
        """service -> series -> aggregated value (including `<prefix>_instances_up`)."""
        now = time.time() if now is None else now
        out: dict[str, dict[SeriesKey, float]] = defaultdict(dict)
        gauge_values: dict[str, dict[SeriesKey, list[float]]] = defaultdict(lambda: defaultdict(list))
        for state in self.instances.values():
            series = out[state.service]
            for key in state.counters.keys() | state.earlier_runs.keys():
                series[key] = series.get(key, 0.0) + state.counters.get(key, 0.0) + state.earlier_runs.get(key, 0.0)
            up_key = _key(f"{PREFIX}_instances_up", {})
            series.setdefault(up_key, 0.0)
            if self.live(state, now):
                series[up_key] += 1
                for key, value in state.gauges.items():
                    gauge_values[state.service][key].append(value)
        for service, values in gauge_values.items():
            for key, vs in values.items():
                out[service][key] = max(vs) if any(w in key[0] for w in MAX_GAUGE_WORDS) else sum(vs)
        return out

    def collect_families(self, now: float | None = None) -> list[Metric]:
        """The aggregated view as Prometheus metric families, every series labelled with its service."""
        by_family: dict[str, Metric] = {}
        for service, series in sorted(self.totals(now).items()):
            for (name, labels), value in sorted(series.items()):
                if name == f"{PREFIX}_instances_up":
                    family_name, info = name, FamilyInfo("gauge", "Instances of the service that reported within the TTL.")
                else:
                    family_name = self._sample_family.get(name, name)
                    info = self.families[service].get(family_name, FamilyInfo("untyped", ""))
                metric = by_family.get(family_name)
                if metric is None:
                    metric = by_family[family_name] = Metric(family_name, info.help, info.type)
                metric.add_sample(name, {"service": service, **dict(labels)}, value)
        return list(by_family.values())


class AggregateCollector(Collector):
    """Serves the aggregator's view to prometheus-client's HTTP exposition."""

    def __init__(self, aggregator: Aggregator):
        self.aggregator = aggregator

    def collect(self) -> Iterable[Metric]:
        yield from self.aggregator.collect_families()
        yield CounterMetricFamily(f"{PREFIX}_aggregator_malformed_snapshots", "Records of the metrics topic that were skipped.",
                                  value=self.aggregator.malformed)
        yield CounterMetricFamily(f"{PREFIX}_aggregator_snapshots", "Snapshots applied.", value=self.aggregator.applied)
        yield GaugeMetricFamily(f"{PREFIX}_aggregator_instances", "Instances in the table, live or not.",
                                value=len(self.aggregator.instances))


def to_json(aggregator: Aggregator, now: float | None = None) -> dict[str, bytes]:
    """The aggregated view per service, for the aggregated topic (key = service)."""
    now = time.time() if now is None else now
    out = {}
    for service, series in aggregator.totals(now).items():
        samples = [[name, dict(labels), value] for (name, labels), value in sorted(series.items())]
        out[service] = json.dumps({"service": service, "timestamp": now, "samples": samples}).encode()
    return out
