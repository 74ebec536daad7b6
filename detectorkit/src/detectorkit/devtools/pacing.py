"""Producing at a given rate: the sample feeds of `produce-sample`/`produce-raw` and the diamond."""

from __future__ import annotations

import time


class Pacer:
    """Keeps a loop at `rate` items per second from its start (None or 0: as fast as it goes), by
    sleeping off whatever it is ahead; `restart_at` after a pause, so the pause is not made up."""

    def __init__(self, rate: float | None):
        self.rate = rate
        self.began = time.monotonic()

    def wait(self, done: int) -> None:
        if self.rate:
            ahead = done / self.rate - (time.monotonic() - self.began)
            if ahead > 0.001:  # a shorter sleep only costs a system call
                time.sleep(ahead)

    def restart_at(self, done: int) -> None:
        if self.rate:
            self.began = time.monotonic() - done / self.rate
