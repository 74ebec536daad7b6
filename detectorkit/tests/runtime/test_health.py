"""The job's health endpoint: what /ready and /live answer, and why."""

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

import pytest

from detectorkit.metrics.registry import JobMetrics
from detectorkit.runtime.health import HealthServer


@dataclass
class FakeJob:
    failure: str | None = None
    reading: bool = False
    idle: float = 0.0
    waiting: int = 0

    def error(self):
        return self.failure

    def is_reading(self):
        return self.reading

    def seconds_since_progress(self):
        return self.idle

    def records_waiting(self):
        return self.waiting


@pytest.fixture
def served():
    job = FakeJob()
    metrics = JobMetrics(process_tree=False, build={"version": "1.0", "detectorkit": "0.1.0", "pyspark": "4.3.0", "python": "3.11.7"})
    metrics.records_read.inc(42)
    server = HealthServer(job, port=0, host="127.0.0.1", stall_seconds=60, registry=metrics.registry).start()

    def get(path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as response:
                body = response.read()
                return response.status, body.decode() if path == "/metrics" else json.loads(body)
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}") if exc.code == 503 else {}

    yield job, get
    server.stop()


def test_ready_once_the_job_reads_its_partitions(served):
    job, get = served
    assert get("/ready") == (503, {"ok": False, "why": "starting: not reading its partitions yet"})
    job.reading = True
    assert get("/ready") == (200, {"ok": True, "why": "reading"})


def test_not_live_when_no_batch_completes_while_records_wait(served):
    job, get = served
    job.reading, job.idle, job.waiting = True, 600, 0
    assert get("/live")[0] == 200  # idle with nothing to read: healthy
    job.idle, job.waiting = 30, 5_000
    assert get("/live")[0] == 200  # behind, but moving
    job.idle = 61
    status, body = get("/live")
    assert status == 503 and body["why"] == "stalled: no batch completed for 61 s while 5000 records wait"


def test_a_failed_job_is_neither_ready_nor_live(served):
    job, get = served
    job.reading, job.failure = True, "DataLossError: records are gone"
    assert get("/ready")[0] == 503 and get("/live") == (503, {"ok": False, "why": "failed: DataLossError: records are gone"})


def test_unknown_paths_are_404(served):
    _, get = served
    assert get("/stats")[0] == 404


def test_the_instances_own_metrics_are_served_for_a_scrape(served):
    """Per pod, beside the aggregator's sums: what this instance counted, as Prometheus reads it."""
    _, get = served
    status, text = get("/metrics")
    assert status == 200
    assert "detector_records_read_total 42.0" in text
    assert 'detector_build_info{detectorkit="0.1.0",pyspark="4.3.0",python="3.11.7",version="1.0"} 1.0' in text
