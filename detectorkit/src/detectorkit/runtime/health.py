"""A job's health over HTTP, for orchestrators (Kubernetes probes, Docker's HEALTHCHECK).

GET /ready: 200 once the job has joined its group and reads what it was given (its Spark query
runs, or the group gave it nothing to read); 503 before, and once it has failed.
GET /live: 200 unless the job has failed, or no batch has completed for HEALTH_STALL_SECONDS
while records wait (a hung batch, a broker it cannot write to): restarting it is then the cure.
Both answer a JSON object saying why.
GET /metrics: this instance's own metrics in Prometheus' text format (a PodMonitor's scrape), beside
the sums across instances that the metrics-aggregator serves.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class Watched(Protocol):
    def error(self) -> str | None: ...
    def is_reading(self) -> bool: ...
    def seconds_since_progress(self) -> float: ...
    def records_waiting(self) -> int: ...


@dataclass
class Verdict:
    ok: bool
    why: str


def readiness(job: Watched) -> Verdict:
    if job.error() is not None:
        return Verdict(False, f"failed: {job.error()}")
    if not job.is_reading():
        return Verdict(False, "starting: not reading its partitions yet")
    return Verdict(True, "reading")


def liveness(job: Watched, stall_seconds: float) -> Verdict:
    if job.error() is not None:
        return Verdict(False, f"failed: {job.error()}")
    idle, waiting = job.seconds_since_progress(), job.records_waiting()
    if waiting > 0 and idle > stall_seconds:
        return Verdict(False, f"stalled: no batch completed for {idle:.0f} s while {waiting} records wait")
    return Verdict(True, f"last progress {idle:.0f} s ago, {waiting} records waiting")


class HealthServer:
    def __init__(self, job: Watched, port: int, host: str = "0.0.0.0", stall_seconds: float = 300.0, registry: CollectorRegistry | None = None):
        checks = {"/ready": lambda: readiness(job), "/live": lambda: liveness(job, stall_seconds)}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (the standard library's name)
                path = self.path.split("?")[0]
                if path == "/metrics" and registry is not None:
                    body = generate_latest(registry)
                    self.send_response(200)
                    self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                check = checks.get(path)
                if check is None:
                    self.send_error(404, "try /ready, /live or /metrics")
                    return
                verdict = check()
                body = json.dumps({"ok": verdict.ok, "why": verdict.why}).encode()
                self.send_response(200 if verdict.ok else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # probes every few seconds would flood the job's log
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="health", daemon=True)

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Progress:
    """When the job last moved: a batch completed, or a query (re)started."""

    def __init__(self):
        self._at = time.monotonic()

    def mark(self) -> None:
        self._at = time.monotonic()

    def seconds(self) -> float:
        return time.monotonic() - self._at
