"""How a query's failure is told and judged: one line out of Spark's stack, and whether a restart
can mend it (the job restarts a query from the group's committed offsets, with backoff, until the
error persists) or the job must stop at once."""

from __future__ import annotations

import re

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
