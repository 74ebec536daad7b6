"""What `scripts/scale-demo.sh` prints: a service's progress through its input, and at the end each
instance's share of the work (records read, and records per second with one and with two
instances), the metrics-aggregator's `records read` against the records produced, detections
written twice and each hand-over's time.

    python -m detectorkit.devtools.scale_report produce BOOTSTRAP COUNT SEED [RATE]
    python -m detectorkit.devtools.scale_report progress BOOTSTRAP SERVICE
    python -m detectorkit.devtools.scale_report wait BOOTSTRAP SERVICE RECORDS [PHASES NAME START PHASE_RECORDS]
    python -m detectorkit.devtools.scale_report split BOOTSTRAP SERVICE INSTANCES INSTANCE_LOG...
    python -m detectorkit.devtools.scale_report result BOOTSTRAP SERVICE RECORDS AGGREGATOR_LOG PHASES INSTANCE_LOG...

The shares come from the metrics topic: every instance publishes a snapshot of its counters every
METRICS_INTERVAL_SECONDS and a last one when it stops, so an instance's records read between two
moments is the difference of its snapshots. PHASES is a file of lines `NAME START END RECORDS`
(epoch seconds): the demo's phases, each a batch of records produced and read to the end; the
instances are idle between phases, so a snapshot taken then counts the phase exactly.
"""

from __future__ import annotations

import bisect
import collections
import json
import os
import pathlib
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from detectorkit.kafka import clients
from detectorkit.kafka.end_offsets import ListOffsetsEnds
from detectorkit.kafka.offset_store import OffsetStore
from detectorkit.kafka.topic_reader import read_messages, read_topic
from detectorkit.metrics import snapshot as snap

INPUT = "records.normalized"
METRICS = "metrics"
RECORDS_READ = "detector_records_read_total"
ASSIGNED = "detector_assigned_partitions"


# ---- the metrics topic: what each instance reported, when ------------------------------------------


@dataclass(frozen=True)
class Reading:
    """One snapshot's figures of one instance."""

    instance: str
    timestamp: float
    records_read: float
    assigned: float


def readings(values: Iterable[bytes | None], service: str) -> list[Reading]:
    """The service's snapshots on the metrics topic, oldest first; malformed ones are skipped."""
    found = []
    for value in values:
        try:
            s = snap.parse(value)
        except snap.MalformedSnapshot:
            continue
        if s.service != service:
            continue
        samples = [sample for family in s.families for sample in family.samples]
        found.append(
            Reading(
                s.instance,
                s.timestamp,
                sum(v for name, _, v in samples if name == RECORDS_READ),
                sum(v for name, _, v in samples if name == ASSIGNED),
            )
        )
    return sorted(found, key=lambda r: r.timestamp)


def read_readings(bootstrap: str, service: str) -> list[Reading]:
    return readings((m.value() for m in read_messages(clients.base(bootstrap), METRICS, timeout=30)), service)


def records_at(found: list[Reading], instance: str, moment: float) -> float:
    """The instance's records read as of its last snapshot at or before `moment` (0 before its first)."""
    mine = [r for r in found if r.instance == instance]
    at = bisect.bisect_right([r.timestamp for r in mine], moment)
    return mine[at - 1].records_read if at else 0.0


# ---- the demo's phases: who read what ------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    name: str
    start: float  # epoch s: its records start to be produced
    end: float  # epoch s: the service has committed them all
    records: int


@dataclass(frozen=True)
class Share:
    phase: Phase
    seconds: float
    read: dict[str, float]  # instance name -> records read in the phase

    @property
    def records_per_second(self) -> float:
        return sum(self.read.values()) / self.seconds if self.seconds > 0 else float("nan")


def read_phases(path: str | pathlib.Path) -> list[Phase]:
    phases = []
    for line in pathlib.Path(path).read_text().splitlines():
        if line.strip():
            name, start, end, records = line.split()
            phases.append(Phase(name, float(start), float(end), int(records)))
    return phases


def shares(found: list[Reading], phases: list[Phase], names: Mapping[str, str]) -> list[Share]:
    """Records read per instance in each phase: counted from the phase's start to the next one's
    (the instances are idle in between; an instance stopped in a phase counts to its last snapshot).
    `names`: instance id -> the name shown."""
    result = []
    for i, phase in enumerate(phases):
        until = phases[i + 1].start if i + 1 < len(phases) else float("inf")
        read = {
            names.get(instance, instance): records_at(found, instance, until) - records_at(found, instance, phase.start)
            for instance in sorted({r.instance for r in found}, key=lambda x: names.get(x, x))
        }
        result.append(Share(phase, phase.end - phase.start, read))
    return result


def render_shares(found: list[Reading], table: list[Share], names: Mapping[str, str]) -> str:
    instances = sorted({names.get(r.instance, r.instance) for r in found})
    totals = {names.get(i, i): max((r.records_read for r in found if r.instance == i), default=0.0) for i in {r.instance for r in found}}
    first_seen = {names.get(i, i): min(r.timestamp for r in found if r.instance == i) for i in {r.instance for r in found}}
    width = max([24, *map(len, instances)])
    lines = [f"   {'phase':<26}{'records':>11}{'seconds':>9}{'records/s':>11}   " + "   ".join(f"{n:>{width}}" for n in instances)]
    for share in table:
        cells = []
        for name in instances:
            n = share.read.get(name, 0.0)
            part = n / sum(share.read.values()) if sum(share.read.values()) else 0.0
            shown = "not started" if first_seen[name] > share.phase.end else f"{n:,.0f} ({part:.0%}, {n / share.seconds:,.0f}/s)"
            cells.append(f"{shown:>{width}}")
        lines.append(
            f"   {share.phase.name:<26}{share.phase.records:>11,}{share.seconds:>9.1f}{share.records_per_second:>11,.0f}   " + "   ".join(cells)
        )
    lines.append(f"   {'records read in all':<26}{'':>31}   " + "   ".join(f"{f'{totals[n]:,.0f}':>{width}}" for n in instances))
    return "\n".join(lines)


def idle_instances(found: list[Reading], phases: list[Phase], names: Mapping[str, str]) -> list[str]:
    """Instances that read nothing at all, or nothing in a phase they ran through from its start to its end."""
    idle = [names.get(i, i) for i in sorted({r.instance for r in found}) if max(r.records_read for r in found if r.instance == i) == 0]
    for share in shares(found, phases, names):
        for instance in {r.instance for r in found}:
            seen = [r.timestamp for r in found if r.instance == instance]
            name = names.get(instance, instance)
            if min(seen) < share.phase.start and max(seen) > share.phase.end and share.read.get(name, 0.0) == 0 and name not in idle:
                idle.append(name)
    return idle


def instance_names(instance_logs: Iterable[str]) -> dict[str, str]:
    """Instance id (as in the snapshots) -> the name the demo gave it (its log file's stem)."""
    names = {}
    for log in instance_logs:
        for line in pathlib.Path(log).read_text(errors="replace").splitlines():
            if line.startswith("{") and '"instance"' in line:
                names[json.loads(line)["instance"]] = pathlib.Path(log).stem
                break
    return names


# ---- the commands ---------------------------------------------------------------------------------


def positions(bootstrap: str, service: str) -> tuple[int, int]:
    """The service's committed position and the input's end, summed over partitions."""
    base = clients.base(bootstrap)
    ends = ListOffsetsEnds(base, INPUT, 10)
    store = OffsetStore(clients.consumer(base, service), INPUT, 10)
    try:
        partitions = ends.topic_partitions()
        return sum(o or 0 for o in store.committed(partitions).values()), sum(ends.end_offsets(partitions).values())
    finally:
        store.close()
        ends.close()


def progress(bootstrap: str, service: str) -> None:
    done, end = positions(bootstrap, service)
    print(f"   committed {done:,} of {end:,} records produced so far (lag {end - done:,})", flush=True)


def unreported(found: list[Reading], since: float, interval: float) -> set[str]:
    """The running instances with no snapshot after `since` yet. Running instances report every
    `interval`; one that stopped before has reported for the last time and is not waited for."""
    running = {r.instance for r in found if r.timestamp > since - 3 * interval}
    return {i for i in running if not any(r.instance == i and r.timestamp > since for r in found)}


def wait(bootstrap: str, service: str, records: int, phase: tuple[str, str, float, int] | None = None, timeout: float = 1800) -> None:
    """Until the service has committed `records` in all, and every instance heard from lately has
    published a snapshot since (so the phase's counts are in the metrics topic). `phase`: (file,
    name, start, records) of the phase that ends here, appended to the phases file."""
    deadline = time.monotonic() + timeout
    shown = 0.0
    while positions(bootstrap, service)[0] < records:
        if time.monotonic() > deadline:
            raise SystemExit(f"the service did not commit {records} records within {timeout} s")
        if time.monotonic() - shown > 10:
            progress(bootstrap, service)
            shown = time.monotonic()
        time.sleep(0.2)
    reached = time.time()
    progress(bootstrap, service)
    if phase is not None:
        path, name, start, count = phase
        with open(path, "a") as phases:
            phases.write(f"{name} {start} {reached} {count}\n")
    interval = float(os.environ.get("METRICS_INTERVAL_SECONDS", "10"))
    until = time.monotonic() + 3 * interval + 10
    while time.monotonic() < until:
        if not unreported(read_readings(bootstrap, service), reached, interval):
            return
        time.sleep(0.5)
    print(f"   (some instance published no metrics snapshot within {3 * interval + 10:.0f} s: its share may be short)", flush=True)


def split(bootstrap: str, service: str, instances: int, instance_logs: list[str], timeout: float = 180) -> None:
    """Until `instances` instances own input partitions (their last snapshots say so); prints who owns how many."""
    names = instance_names(instance_logs)
    deadline = time.monotonic() + timeout
    while True:
        latest = {r.instance: r for r in read_readings(bootstrap, service)}
        owning = {names.get(i, i): r.assigned for i, r in latest.items() if r.assigned > 0 and r.timestamp > time.time() - 10}
        if len(owning) >= instances:
            print("   the group's split: " + ", ".join(f"{i} owns {n:.0f} partitions" for i, n in sorted(owning.items())), flush=True)
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"{instances} instances did not own partitions within {timeout} s (owning: {owning})")
        time.sleep(0.5)


def aggregated(endpoint: str, service: str, name: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(endpoint, timeout=5) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("service") == service:
                return sample.value
    return None


def result(bootstrap: str, service: str, records: int, aggregator_log: str, phases_file: str, instance_logs: list[str]) -> int:
    endpoint = next(json.loads(line)["endpoint"] for line in pathlib.Path(aggregator_log).read_text().splitlines() if '"aggregator started"' in line)
    # The stopped instances' last snapshots reach the aggregator within its polling.
    read, deadline = None, time.monotonic() + 30
    while time.monotonic() < deadline:
        read = aggregated(endpoint, service, RECORDS_READ)
        if read == records:
            break
        time.sleep(1)
    read = read or 0.0
    found = collections.Counter(
        (m["value"] and json.loads(m["value"])["source"]["partition"], m["value"] and json.loads(m["value"])["source"]["offset"])
        for m in read_topic(clients.base(bootstrap), "detections")
    )
    twice = sum(n - 1 for n in found.values() if n > 1)
    names = instance_names(instance_logs)
    metrics, phases = read_readings(bootstrap, service), read_phases(phases_file)
    print("each instance's share (records read; share of the phase; records per second of the phase):")
    print(render_shares(metrics, shares(metrics, phases, names), names))
    idle = idle_instances(metrics, phases, names)
    print(f"records produced:                    {records:,}")
    print(f"aggregated records read:             {read:,.0f}")
    print(f"records read minus records produced: {read - records:,.0f}   (the talk's 'processed twice'; ours must be 0)")
    print(f"detections written:                  {sum(found.values()):,} ({twice} of them twice)")
    if idle:
        print(f"instances that read nothing where they should have shared the work: {', '.join(idle)}")
    print("hand-overs (from a rebalance's start to the partitions released or read again):")
    for log in instance_logs:
        name = pathlib.Path(log).stem
        for line in pathlib.Path(log).read_text().splitlines():
            if line.startswith("{") and ('"partitions assigned"' in line or '"partitions released"' in line):
                entry = json.loads(line)
                print(f"   {name:<24} {entry['event']:<20} {str(entry['partitions']):<14} {entry['handover_seconds']:6.2f} s")
    return 0 if read == records and twice == 0 and not idle else 1


def produce(bootstrap: str, count: int, seed: int, rate: float | None = None) -> None:
    """`count` sample records to the input, as fast as the producer goes (or at `rate`): values
    cycle through a pool made once, so making them does not set the pace (samples() makes ~115k
    a second here, slower than an instance reads)."""
    from detectorkit.devtools.pacing import Pacer
    from detectorkit.samples import samples

    pool = [(s.key, s.value) for s in samples(min(count, 20_000), seed=seed, bad_every=1000)]
    producer = clients.new_producer(clients.producer(clients.base(bootstrap)))
    pacer = Pacer(rate)
    for i in range(count):
        key, value = pool[i % len(pool)]
        while True:
            try:
                producer.produce(INPUT, key=key, value=value)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)
        if i % 1000 == 999:
            producer.poll(0)
            pacer.wait(i + 1)
    if producer.flush(60):
        raise SystemExit("not every record was delivered within 60 s")


def main(argv: list[str]) -> int:
    command, bootstrap, service, *rest = argv
    if command == "produce":  # produce BOOTSTRAP COUNT SEED [RATE]
        produce(bootstrap, int(service), int(rest[0]), float(rest[1]) if len(rest) > 1 else None)
    elif command == "progress":
        progress(bootstrap, service)
    elif command == "wait":
        wait(bootstrap, service, int(rest[0]), (rest[1], rest[2], float(rest[3]), int(rest[4])) if len(rest) > 1 else None)
    elif command == "split":
        split(bootstrap, service, int(rest[0]), rest[1:])
    elif command == "result":
        return result(bootstrap, service, int(rest[0]), rest[1], rest[2], rest[3:])
    else:
        raise SystemExit(f"unknown command {command!r}: produce, progress, wait, split or result")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
