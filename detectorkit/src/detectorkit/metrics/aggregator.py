"""The metrics-aggregator: the metrics topic read as a table, summed per service, for Prometheus.

Rules (the unit tests state them one by one):
- Table: the latest snapshot per instance wins. Replaying a snapshot already applied changes
  nothing, so the table can be restored from its changelog and the topic resumed where it was read
  (see `aggregator_service`): a restart costs time in proportion to the instances, not the topic's history.
- Counters (and histogram buckets, sums and counts) are summed over all instances of a service and
  never go down: an instance that stops keeps its last value in the sum, and an instance that
  restarts (same id, new start time) adds its new counts to what its earlier runs counted.
- An instance silent for longer than the retirement horizon is folded into its service's total of
  retired instances and leaves the table, so the table stays small under churn; late snapshots of a
  retired run are ignored (their counts are in the retired total).
- Gauges are combined over live instances only, summed or maxed as the job declares per family
  (snapshot "aggregation"); an instance silent for longer than the TTL leaves them and the `up` count.
- A malformed snapshot is counted and skipped.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from prometheus_client import Metric
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from detectorkit.metrics import snapshot as snap
from detectorkit.metrics.registry import PREFIX

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]  # sample name, sorted labels

# Retired runs remembered, to ignore their late snapshots; older ones are forgotten.
RETIRED_RUNS_KEPT = 10_000


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
    aggregation: str = "sum"


class Aggregator:
    def __init__(self, ttl_seconds: float = 30.0, retire_after_seconds: float = 7 * 24 * 3600.0):
        self.ttl = ttl_seconds
        self.retire_after = retire_after_seconds
        self.instances: dict[str, InstanceState] = {}
        self.families: dict[str, dict[str, FamilyInfo]] = defaultdict(dict)  # service -> family name -> info
        self._sample_family: dict[str, str] = {}  # sample name -> family name
        # service -> series -> what retired instances counted
        self.retired: dict[str, dict[SeriesKey, float]] = defaultdict(dict)
        self._retired_runs: OrderedDict[tuple[str, float], None] = OrderedDict()
        # What changed since the last `changes()`: instance ids (None value: removed) and services.
        self._dirty_instances: set[str] = set()
        self._dirty_services: set[str] = set()
        self.stream_time = 0.0  # the newest snapshot's timestamp
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
        self.stream_time = max(self.stream_time, s.timestamp)
        if (s.instance, s.started_at) in self._retired_runs:
            return  # its counts are in the retired total already
        counters: dict[SeriesKey, float] = {}
        gauges: dict[SeriesKey, float] = {}
        for family in s.families:
            info = FamilyInfo(family.type, family.help, family.aggregation)
            if self.families[s.service].get(family.name) != info:
                self.families[s.service][family.name] = info
                self._dirty_services.add(s.service)
            for name, labels, value in family.samples:
                self._sample_family[name] = family.name
                (gauges if family.type == "gauge" else counters)[_key(name, labels)] = value
        state = self.instances.get(s.instance)
        if state is not None and s.started_at == state.started_at and s.timestamp <= state.last_seen:
            return  # applied already (a replay) or overtaken
        self._dirty_instances.add(s.instance)
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

    def retire(self, now: float | None = None) -> list[str]:
        """Fold the instances silent for longer than the horizon into their service's retired total.

        Silent as the topic tells it (default `now`: the newest snapshot's time), not by the wall
        clock: an aggregator replaying an old history must not retire an instance whose later
        snapshots are still to come."""
        now = self.stream_time if now is None else now
        gone = [i for i, state in self.instances.items() if now - state.last_seen > self.retire_after]
        for instance in gone:
            state = self.instances.pop(instance)
            retired = self.retired[state.service]
            for key in state.counters.keys() | state.earlier_runs.keys():
                retired[key] = retired.get(key, 0.0) + state.counters.get(key, 0.0) + state.earlier_runs.get(key, 0.0)
            self._remember_retired(instance, state.started_at)
            self._dirty_instances.add(instance)
            self._dirty_services.add(state.service)
        return gone

    def _remember_retired(self, instance: str, started_at: float) -> None:
        self._retired_runs[(instance, started_at)] = None
        while len(self._retired_runs) > RETIRED_RUNS_KEPT:
            self._retired_runs.popitem(last=False)

    # ---- the table as a changelog: key -> state, None for a removed instance ---------------------

    def changes(self) -> dict[str, bytes | None]:
        """What changed since the last call, as changelog records (a compacted topic keeps the last
        record per key: together they are the whole table)."""
        out: dict[str, bytes | None] = {}
        for instance in self._dirty_instances:
            state = self.instances.get(instance)
            out[f"instance:{instance}"] = None if state is None else json.dumps(_state_to_json(state)).encode()
        for service in self._dirty_services:
            out[f"service:{service}"] = json.dumps(
                {
                    "families": {name: asdict(info) for name, info in self.families[service].items()},
                    "retired": [[name, dict(labels), v] for (name, labels), v in self.retired[service].items()],
                    "retired_runs": [[i, t] for (i, t) in self._retired_runs if self.instances.get(i) is None],
                }
            ).encode()
        self._dirty_instances.clear()
        self._dirty_services.clear()
        return out

    def restore(self, key: str, value: bytes | None) -> None:
        """Take one changelog record (the last one per key wins, as in a compacted topic)."""
        kind, _, name = key.partition(":")
        if kind == "instance":
            if value is None:
                self.instances.pop(name, None)
            else:
                self.instances[name] = _state_from_json(json.loads(value))
        elif kind == "service" and value is not None:
            data = json.loads(value)
            self.families[name] = {f: FamilyInfo(**info) for f, info in data["families"].items()}
            for family in self.families[name]:
                self._sample_family.setdefault(family, family)
            self.retired[name] = {_key(n, labels): v for n, labels, v in data["retired"]}
            for instance, started_at in data["retired_runs"]:
                self._remember_retired(instance, started_at)

    def totals(self, now: float | None = None) -> dict[str, dict[SeriesKey, float]]:
        """service -> series -> aggregated value (including `<prefix>_instances_up`)."""
        now = time.time() if now is None else now
        out: dict[str, dict[SeriesKey, float]] = defaultdict(dict)
        gauge_values: dict[str, dict[SeriesKey, list[float]]] = defaultdict(lambda: defaultdict(list))
        for service, retired in self.retired.items():
            series = out[service]
            for key, value in retired.items():
                series[key] = series.get(key, 0.0) + value
            series.setdefault(_key(f"{PREFIX}_instances_up", {}), 0.0)
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
                info = self.families[service].get(self._sample_family.get(key[0], key[0]))
                out[service][key] = max(vs) if info is not None and info.aggregation == "max" else sum(vs)
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
        yield CounterMetricFamily(
            f"{PREFIX}_aggregator_malformed_snapshots", "Records of the metrics topic that were skipped.", value=self.aggregator.malformed
        )
        yield CounterMetricFamily(f"{PREFIX}_aggregator_snapshots", "Snapshots applied.", value=self.aggregator.applied)
        yield GaugeMetricFamily(f"{PREFIX}_aggregator_instances", "Instances in the table, live or not.", value=len(self.aggregator.instances))


def _state_to_json(state: InstanceState) -> dict:
    def series(values: dict[SeriesKey, float]) -> list:
        return [[name, dict(labels), v] for (name, labels), v in values.items()]

    return {
        "service": state.service,
        "started_at": state.started_at,
        "last_seen": state.last_seen,
        "counters": series(state.counters),
        "earlier_runs": series(state.earlier_runs),
        "gauges": series(state.gauges),
    }


def _state_from_json(data: dict) -> InstanceState:
    def series(values: list) -> dict[SeriesKey, float]:
        return {_key(name, labels): v for name, labels, v in values}

    return InstanceState(
        data["service"], data["started_at"], data["last_seen"], series(data["counters"]), series(data["earlier_runs"]), series(data["gauges"])
    )


def to_json(aggregator: Aggregator, now: float | None = None) -> dict[str, bytes]:
    """The aggregated view per service, for the aggregated topic (key = service)."""
    now = time.time() if now is None else now
    out = {}
    for service, series in aggregator.totals(now).items():
        samples = [[name, dict(labels), value] for (name, labels), value in sorted(series.items())]
        out[service] = json.dumps({"service": service, "timestamp": now, "samples": samples}).encode()
    return out
