"""The cost of the processes that ran a job's tasks, as the tasks report it."""

import os

from prometheus_client import CollectorRegistry

from detectorkit.metrics import executors
from detectorkit.metrics.executors import ExecutorProcesses


def values(collector):
    registry = CollectorRegistry()
    registry.register(collector)
    return {s.name: s.value for family in registry.collect() for s in family.samples}


def report(pid, cpu, rss=100, kind="python", host="a"):
    return {"host": host, "pid": pid, "kind": kind, "cpu_seconds": cpu, "rss_bytes": rss}


def test_cpu_adds_up_across_processes_and_hosts_and_never_goes_down():
    c = ExecutorProcesses()
    c.update([report(1, 2.0), report(1, 3.0, kind="jvm", host="b")])
    c.update([report(1, 1.5)])  # a late report of the same process
    v = values(c)
    assert v["detector_executor_cpu_seconds_total"] == 5.0
    assert v["detector_executor_resident_memory_bytes"] == 200
    assert v["detector_executor_processes"] == 2


def test_a_process_no_longer_heard_from_keeps_its_cpu_but_not_its_memory(monkeypatch):
    c = ExecutorProcesses(recent_seconds=60)
    c.update([report(1, 4.0, rss=500)])
    later = executors.time.monotonic() + 61
    monkeypatch.setattr(executors.time, "monotonic", lambda: later)
    c.update([report(2, 1.0, rss=50)])
    v = values(c)
    assert v["detector_executor_cpu_seconds_total"] == 5.0
    assert v["detector_executor_resident_memory_bytes"] == 50
    assert v["detector_executor_processes"] == 1


def test_a_report_names_this_python_process_and_no_jvm_outside_spark():
    (mine,) = executors.report()
    assert mine["pid"] == os.getpid() and mine["kind"] == "python"
    assert mine["cpu_seconds"] > 0 and mine["rss_bytes"] > 0
