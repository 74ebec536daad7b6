"""Kafka clients cached in a Spark Python worker process, and closed when they fall idle.

A worker runs one task after another: creating a consumer or producer per task would cost more than
a small batch. But Spark never tells a worker that a query has stopped, and a worker outlives the
query (a SparkSession runs many). So each cached client is closed once no task has used it for a
while: a stopped job leaves no connections, threads or buffers behind in the workers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class WorkerClients:
    def __init__(self, close: Callable[[Any], None], idle_seconds: float = 60.0):
        self._close = close
        self.idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._idle: dict[str, tuple[Any, float]] = {}  # key -> (client, idle since)
        self._busy: dict[str, Any] = {}
        self._reaper: threading.Thread | None = None

    @contextmanager
    def use(
        self, key: str, create: Callable[[], Any], idle_seconds: float | None = None, valid: Callable[[Any], bool] | None = None
    ) -> Iterator[Any]:
        """The cached client for `key` (created if none, or if `valid` says the cached one is not:
        a transactional producer another process has fenced), held for this task alone."""
        with self._lock:
            if idle_seconds is not None:
                self.idle_seconds = idle_seconds
            entry = self._idle.pop(key, None)
        if entry is not None and valid is not None and not valid(entry[0]):
            self._close_quietly(entry[0])
            entry = None
        client = entry[0] if entry else create()
        with self._lock:
            self._busy[key] = client
        ok = False
        try:
            yield client
            ok = True
        finally:
            with self._lock:
                self._busy.pop(key, None)
                if ok:
                    self._idle[key] = (client, time.monotonic())
            if not ok:
                self._close_quietly(client)  # after a failure its state is unknown (a fenced producer, say)
            self._start_reaper()

    def held(self) -> dict[str, Any]:
        """The clients held, idle or in use, by key."""
        with self._lock:
            return {**{k: client for k, (client, _) in self._idle.items()}, **self._busy}

    def close_idle(self, now: float | None = None) -> int:
        """Close clients idle for longer than `idle_seconds`; returns how many."""
        now = time.monotonic() if now is None else now
        with self._lock:
            stale = [k for k, (_, since) in self._idle.items() if now - since >= self.idle_seconds]
            clients = [self._idle.pop(k)[0] for k in stale]
        for client in clients:
            self._close_quietly(client)
        return len(clients)

    def __len__(self) -> int:
        with self._lock:
            return len(self._idle) + len(self._busy)

    def _close_quietly(self, client: Any) -> None:
        try:
            self._close(client)
        except Exception:  # noqa: BLE001 - closing must never fail a task
            pass

    def _start_reaper(self) -> None:
        with self._lock:
            if self._reaper is not None:
                return
            self._reaper = threading.Thread(target=self._reap, name="detectorkit-idle-clients", daemon=True)
        self._reaper.start()

    def _reap(self) -> None:
        while True:
            time.sleep(max(0.2, min(5.0, self.idle_seconds / 4)))
            self.close_idle()
