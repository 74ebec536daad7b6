"""How a query's failure is told and judged: one line out of Spark's stack, and whether a restart
can mend it (the job restarts a query from the group's committed offsets, with backoff, until the
error persists) or the job must stop at once (`Supervisor`)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

import structlog

log = structlog.get_logger("detectorkit.job")

# Errors no restart mends: the job stops with them at once. Anything else that kills the query (a
# Python worker that did not connect back in time on a busy machine, a broker that went away) is
# retried from the group's committed offsets, with backoff, until it persists.
PERMANENT_ERRORS = ("DataLossError", "NoCommittedOffsetsError", "TopicAccessError", "SettingsError", "StateSchemaError")

_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+\.)?(\w*(?:Error|Exception)): (.+)$", re.MULTILINE)
_OUR_ERRORS = (
    "DataLossError",
    "NoCommittedOffsetsError",
    "StateSchemaError",
    "DeliveryError",
    "TransactionError",
    "TimeoutError",
    "KafkaException",
    "LookupError",
)


def describe(exc: BaseException) -> str:
    """One line for an error raised in the driver: Spark's own reduced to what went wrong."""
    return explain(exc) if "pyspark" in type(exc).__module__ else f"{type(exc).__name__}: {exc}"


# Refusals by the broker are settings to fix, whatever error class carries them.
_REFUSED = re.compile(r"authori[sz]ation failed|authentication failed|SASL authentication error", re.IGNORECASE)


def is_permanent(reason: str) -> bool:
    return reason.split(":", 1)[0] in PERMANENT_ERRORS or _REFUSED.search(reason) is not None


def explain(exc: BaseException) -> str:
    """The one line of a failed query's error that says what went wrong, not Spark's stack."""
    text = str(exc)
    found = _ERROR_LINE.findall(text)
    for name, message in found:
        if name in _OUR_ERRORS:
            return f"{name}: {message.strip()}"
    python = [f"{n}: {m.strip()}" for n, m in found if n not in ("PythonException", "StreamingQueryException", "Py4JJavaError")]
    if python:
        return python[-1]
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


RESTART_BACKOFF_CAP_SECONDS = 30.0


class Supervisor:
    """Whether a job goes on after its query fails, and how it ended: a failure is restarted after
    a backoff that doubles with each failure in a row, until the error is permanent or persists."""

    def __init__(self, attempts: int, backoff_seconds: float, restarts, leaving: threading.Event):
        self.attempts, self.backoff_seconds = attempts, backoff_seconds
        self._restarts = restarts  # the counter of restarts, labelled by error
        self._leaving = leaving
        self.failures = 0  # query failures in a row: since the last batch that processed records
        self.failure: str | None = None
        self.ended = threading.Event()
        self.ready = threading.Event()  # the first assignment is applied (or the job failed)

    def fail(self, reason: str) -> None:
        log.error("job failed", error=reason)
        self.failure = self.failure or reason
        self.ended.set()
        self.ready.set()

    def restart_after(self, reason: str, before_wait: Callable[[], None]) -> bool:
        """The query died, or could not start: `before_wait` (stop what is left of it), then True
        once the backoff has passed (or the job is leaving); False once the job has failed instead."""
        self.failures += 1
        if is_permanent(reason):
            self.fail(reason)
            return False
        if self.failures > self.attempts:
            self.fail(f"{reason} (the query failed {self.failures} times in a row; QUERY_RESTART_ATTEMPTS={self.attempts})")
            return False
        delay = min(RESTART_BACKOFF_CAP_SECONDS, self.backoff_seconds * 2 ** (self.failures - 1))
        self._restarts.labels(error=reason.split(":", 1)[0]).inc()
        log.warning(
            "query failed; restarting it from the group's committed offsets",
            error=reason,
            attempt=self.failures,
            attempts=self.attempts,
            retry_in_seconds=delay,
        )
        before_wait()
        self._leaving.wait(delay)
        return True

    def progressed(self) -> None:
        """A batch processed records: the failures before it are no longer in a row."""
        self.failures = 0
