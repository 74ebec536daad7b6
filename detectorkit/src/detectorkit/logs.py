"""Structured JSON logs: one object per line, with service, instance and batch in context."""

from __future__ import annotations

import logging
import sys

import structlog

_configured = False


def setup_once(level: str = "INFO", **context: str) -> None:
    """`setup`, unless this process has been set up already: a Spark Python worker's logs go to its
    executor's stderr as the same JSON lines as the driver's, with the job's context; the driver
    (where a stage may run its tasks itself) keeps its own setup."""
    if not _configured:
        setup(level, **context)


def setup(level: str = "INFO", **context: str) -> structlog.stdlib.BoundLogger:
    """Route structlog and the standard library's logging to JSON lines on stderr."""
    global _configured
    _configured = True
    shared = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(),
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # py4j logs every call to the JVM at INFO.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(**context)
    return structlog.get_logger("detectorkit")
