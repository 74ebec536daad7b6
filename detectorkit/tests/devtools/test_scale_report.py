"""The scale demo's report (`scripts/scale-demo.sh`): each instance's share of the work per phase,
from the instances' metric snapshots as they are on the metrics topic."""

import json
import pathlib

from detectorkit.devtools import scale_report
from detectorkit.devtools.scale_report import Phase
from detectorkit.metrics.snapshot import Family, Snapshot

SERVICE = "high-value-orders"
HERE = pathlib.Path(__file__).parent


def snapshot(instance, at, records, assigned, service=SERVICE):
    families = [
        Family("detector_records_read", "counter", "Input records processed.", [("detector_records_read_total", {}, records)]),
        Family("detector_assigned_partitions", "gauge", "Partitions owned.", [("detector_assigned_partitions", {}, assigned)]),
    ]
    return Snapshot(service, instance, 0.0, at, families).to_json()


def the_demo(instance_2_reads):
    """Snapshots every second of the demo's three phases: instance 1 alone reads 400 records in
    phase 1 (t 10-14); instance 2 joins; in phase 2 (t 40-43) instance 2 reads `instance_2_reads`
    of 400; in phase 3 (t 50-60) instance 2 reads 30 and stops at t 55, instance 1 reads the rest."""
    values = [snapshot("other-service-1", 12, 999, 4, service="another")]
    one = 0
    for t in range(0, 62):
        if 10 < t <= 14:
            one += 100
        if 40 < t <= 43:
            one += (400 - instance_2_reads) / 3
        if 50 < t <= 60:
            one += 17 if t > 55 else 4
        values.append(snapshot("host-101", t + 0.5, one, 4 if t < 30 or t > 55 else 2))
    two = 0
    for t in range(30, 56):
        if 40 < t <= 43:
            two += instance_2_reads / 3
        if 50 < t <= 55:
            two += 6
        values.append(snapshot("host-202", t + 0.7, two, 2))
    values.append(b"not a snapshot")
    phases = [Phase("one-instance", 10.0, 14.2, 400), Phase("two-instances", 40.0, 43.1, 400), Phase("scale-in", 50.0, 60.3, 135)]
    return values, phases


NAMES = {"host-101": "instance-1", "host-202": "instance-2"}


def test_each_phase_counts_each_instances_records_and_the_throughput():
    values, phases = the_demo(instance_2_reads=210)
    found = scale_report.readings(values, SERVICE)
    shares = scale_report.shares(found, phases, NAMES)
    assert [(s.phase.name, {k: round(v) for k, v in s.read.items()}) for s in shares] == [
        ("one-instance", {"instance-1": 400, "instance-2": 0}),
        ("two-instances", {"instance-1": 190, "instance-2": 210}),
        ("scale-in", {"instance-1": 105, "instance-2": 30}),
    ]
    assert round(shares[0].records_per_second) == round(400 / 4.2)
    assert round(shares[1].records_per_second) == round(400 / 3.1)
    assert scale_report.idle_instances(found, phases, NAMES) == []


def test_the_table_shows_every_instances_share_and_total():
    values, phases = the_demo(instance_2_reads=210)
    found = scale_report.readings(values, SERVICE)
    table = scale_report.render_shares(found, scale_report.shares(found, phases, NAMES), NAMES)
    lines = table.splitlines()
    assert "instance-1" in lines[0] and "instance-2" in lines[0]
    one = next(line for line in lines if line.strip().startswith("one-instance"))
    assert "400 (100%, 95/s)" in one and one.endswith("not started")
    two = next(line for line in lines if line.strip().startswith("two-instances"))
    assert "190 (48%, 61/s)" in two and "210 (52%, 68/s)" in two and " 129 " in two
    assert lines[-1].split()[-2:] == ["695", "240"]


def test_an_instance_that_read_nothing_in_a_phase_it_ran_through_is_named():
    """The first version of the demo: instance 2 joined, owned two partitions, read 0 records."""
    values, phases = the_demo(instance_2_reads=0)
    found = scale_report.readings(values, SERVICE)
    assert scale_report.idle_instances(found, phases, NAMES) == ["instance-2"]


def test_the_instances_are_named_after_their_log_files(tmp_path):
    for name, instance in (("instance-1", "host-101"), ("instance-2", "host-202")):
        (tmp_path / f"{name}.log").write_text("Picked up JAVA_TOOL_OPTIONS\n" + json.dumps({"event": "settings", "instance": instance}) + "\n")
    assert scale_report.instance_names(sorted(str(p) for p in tmp_path.glob("*.log"))) == NAMES


def test_the_phases_file_is_read_back(tmp_path):
    path = tmp_path / "phases"
    path.write_text("one-instance 10.5 14.25 400\n\ntwo-instances 40 43.1 400\n")
    assert scale_report.read_phases(path) == [Phase("one-instance", 10.5, 14.25, 400), Phase("two-instances", 40.0, 43.1, 400)]


def test_the_end_of_a_phase_waits_for_the_running_instances_snapshots_only():
    """Instance 2 stopped 5 s before the phase's end (scale-in): its last snapshot is all there will
    be. Instance 1 runs on: its next snapshot is awaited until it comes."""
    values, _ = the_demo(instance_2_reads=210)
    found = scale_report.readings(values, SERVICE)
    until_end = [r for r in found if r.timestamp <= 60.3]
    assert scale_report.unreported(until_end, since=60.3, interval=1) == {"host-101"}
    assert scale_report.unreported(found, since=60.3, interval=1) == set()
