"""What the processes that ran a job's tasks cost, wherever they run.

The driver's process tree (registry.ProcessTreeCollector) holds the executors only in local mode;
on a cluster they run on other machines. So each task reports the CPU and memory of the processes
it ran in: its Python worker and the executor JVM above it. The reports travel to the driver in
the batch's summary rows, and `ExecutorProcesses` keeps the latest figures per (host, pid).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

PREFIX = "detector"

_jvm_pid: int | None = None


def _executor_jvm():
    """The JVM this Python worker serves: the nearest `java` ancestor (worker <- daemon <- JVM);
    None for the driver's own Python (its JVM is its child, not its parent)."""
    import psutil

    global _jvm_pid
    if _jvm_pid is None:
        _jvm_pid = next((p.pid for p in psutil.Process().parents() if p.name().startswith("java")), 0)
    return psutil.Process(_jvm_pid) if _jvm_pid else None


def report() -> list[dict]:
    """This Python worker's and its executor JVM's CPU seconds and resident memory, now."""
    import psutil

    host = socket.gethostname()
    out = []
    for kind, proc in (("python", psutil.Process(os.getpid())), ("jvm", _executor_jvm())):
        if proc is None:
            continue
        try:
            times = proc.cpu_times()
            out.append({"host": host, "pid": proc.pid, "kind": kind, "cpu_seconds": times.user + times.system, "rss_bytes": proc.memory_info().rss})
        except psutil.Error:
            continue
    return out


@dataclass
class _Seen:
    kind: str
    cpu_seconds: float
    rss_bytes: int
    at: float


class ExecutorProcesses(Collector):
    """CPU and memory of the processes that ran the job's tasks, as the tasks reported them.

    CPU is a counter: a process no longer heard from keeps its last figure in the total. Memory
    and the process count cover the processes heard from within `recent_seconds`."""

    def __init__(self, recent_seconds: float = 120.0):
        self.recent_seconds = recent_seconds
        self.seen: dict[tuple[str, int], _Seen] = {}

    def update(self, reports: Iterable[Mapping]) -> None:
        now = time.monotonic()
        for r in reports:
            key = (r["host"], int(r["pid"]))
            before = self.seen.get(key)
            cpu = max(float(r["cpu_seconds"]), before.cpu_seconds if before else 0.0)
            self.seen[key] = _Seen(r["kind"], cpu, int(r["rss_bytes"]), now)

    def processes(self) -> list[dict]:
        """Every process heard from: host, pid, kind, CPU seconds (for the job's stop log)."""
        return [{"host": h, "pid": p, "kind": s.kind, "cpu_seconds": round(s.cpu_seconds, 3)} for (h, p), s in sorted(self.seen.items())]

    def collect(self):
        recent = [s for s in self.seen.values() if time.monotonic() - s.at <= self.recent_seconds]
        yield CounterMetricFamily(
            f"{PREFIX}_executor_cpu_seconds",
            "CPU time of the processes that ran the job's tasks (Python workers and executor JVMs, on any machine).",
            value=sum(s.cpu_seconds for s in self.seen.values()),
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_executor_resident_memory_bytes",
            "Resident memory of the processes that ran the job's tasks recently.",
            value=sum(s.rss_bytes for s in recent),
        )
        yield GaugeMetricFamily(f"{PREFIX}_executor_processes", "Processes that ran the job's tasks recently.", value=len(recent))
