"""The metrics reporter: a snapshot of the job's registry to the metrics topic every interval and
once more at a graceful stop. A metrics topic that cannot be reached never stops the job: the
reporter says so in the log and in `detector_metrics_report_errors_total`."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import structlog

from detectorkit.kafka import clients
from detectorkit.metrics import snapshot
from detectorkit.metrics.registry import JobMetrics

log = structlog.get_logger("detectorkit.reporter")


class MetricsReporter:
    def __init__(
        self, metrics: JobMetrics, base_conf: Mapping[str, Any], topic: str, service: str, instance: str, interval: float = 10.0, before_report=None
    ):
        self.metrics, self.topic, self.service, self.instance, self.interval = metrics, topic, service, instance, interval
        self.started_at = time.time()
        self.before_report = before_report
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        self._producer = clients.new_producer(
            {
                **base_conf,
                "acks": "all",
                "linger.ms": 50,
                # A snapshot older than a few intervals is worthless: give up on it instead of piling up.
                "message.timeout.ms": int(max(3 * interval, 5) * 1000),
                "on_delivery": self._on_delivery,
            }
        )

    def _on_delivery(self, error, _message) -> None:
        if error is not None:
            self._failed(error.str())
        elif self._failing:
            log.info("metrics topic reachable again", topic=self.topic)
            self._failing = False

    def _failed(self, reason: str) -> None:
        self.metrics.report_errors.inc()
        if not self._failing:  # one warning per outage, not one per interval
            log.warning("metrics snapshot not delivered; the job goes on", topic=self.topic, error=reason)
        self._failing = True

    def report(self) -> None:
        if self.before_report is not None:
            self.before_report()
        snap = snapshot.from_registry(self.metrics.registry, self.service, self.instance, self.started_at, time.time(), self.metrics.aggregations)
        try:
            self._producer.produce(self.topic, key=self.instance.encode(), value=snap.to_json())
        except BufferError:
            self._failed("the producer's local queue is full")
        self._producer.poll(0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.report()
            except Exception:  # noqa: BLE001 - reporting must never take the job down
                log.exception("metrics report failed")

    def start(self) -> MetricsReporter:
        self._thread = threading.Thread(target=self._run, name="metrics-reporter", daemon=True)
        self._thread.start()
        return self

    def stop(self, flush_timeout: float = 5.0) -> None:
        """Stop the timer, send a last snapshot, and wait a little for it to be delivered."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.report()
        if self._producer.flush(flush_timeout):
            self.metrics.report_errors.inc()
            log.warning("last metrics snapshot not delivered", topic=self.topic)
