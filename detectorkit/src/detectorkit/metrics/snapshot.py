"""The snapshot a job publishes to the metrics topic: every sample of its registry, with who sent it.

key   = instance id
value = {"version": 1, "service", "instance", "started_at" (epoch s of the instance's start),
         "timestamp" (epoch s), "families": [{"name", "type", "help",
         "aggregation" (gauges: "sum" or "max" across instances, as the job declares; default "sum"),
         "samples": [[sample name, {labels}, value], ...]}, ...]}
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

VERSION = 1
TYPES = ("counter", "gauge", "histogram")
AGGREGATIONS = ("sum", "max")


class MalformedSnapshot(ValueError):
    """A value on the metrics topic that is not a snapshot this version understands."""


@dataclass(frozen=True)
class Family:
    name: str
    type: str
    help: str
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)
    aggregation: str = "sum"


@dataclass(frozen=True)
class Snapshot:
    service: str
    instance: str
    started_at: float
    timestamp: float
    families: list[Family]

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "version": VERSION,
                "service": self.service,
                "instance": self.instance,
                "started_at": self.started_at,
                "timestamp": self.timestamp,
                "families": [
                    {"name": f.name, "type": f.type, "help": f.help, "aggregation": f.aggregation, "samples": [list(s) for s in f.samples]}
                    for f in self.families
                ],
            }
        ).encode()


def from_registry(
    registry: CollectorRegistry, service: str, instance: str, started_at: float, timestamp: float, aggregations: dict[str, str] | None = None
) -> Snapshot:
    """`aggregations`: family name -> how its gauges combine across instances (default "sum")."""
    families = []
    for metric in registry.collect():
        if metric.type not in TYPES:
            continue
        samples = [(s.name, dict(s.labels), float(s.value)) for s in metric.samples if not s.name.endswith("_created")]
        families.append(Family(metric.name, metric.type, metric.documentation, samples, (aggregations or {}).get(metric.name, "sum")))
    return Snapshot(service, instance, started_at, timestamp, families)


def parse(value: bytes | None) -> Snapshot:
    """The snapshot in `value`, or MalformedSnapshot saying what is wrong with it."""
    try:
        data: Any = json.loads(value) if value is not None else None
    except ValueError as exc:
        raise MalformedSnapshot(f"not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise MalformedSnapshot(f"not a version-{VERSION} snapshot object")
    try:
        families = []
        for f in data["families"]:
            if f["type"] not in TYPES:
                raise MalformedSnapshot(f"unknown metric type {f['type']!r}")
            samples = []
            for name, labels, number in f["samples"]:
                number = float(number)
                if not isinstance(name, str) or not isinstance(labels, dict) or math.isnan(number):
                    raise MalformedSnapshot(f"bad sample in {f['name']!r}")
                samples.append((name, {str(k): str(v) for k, v in labels.items()}, number))
            aggregation = f.get("aggregation", "sum")
            if aggregation not in AGGREGATIONS:
                raise MalformedSnapshot(f"unknown aggregation {aggregation!r} of {f['name']!r}")
            families.append(Family(str(f["name"]), f["type"], str(f.get("help", "")), samples, aggregation))
        snapshot = Snapshot(str(data["service"]), str(data["instance"]), float(data["started_at"]), float(data["timestamp"]), families)
    except MalformedSnapshot:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise MalformedSnapshot(f"missing or wrong field: {exc!r}") from None
    if not snapshot.service or not snapshot.instance:
        raise MalformedSnapshot("service and instance must not be empty")
    return snapshot
