"""How a command ends: its exit codes, and a one-line error on stderr."""

from __future__ import annotations

import sys

EXIT_FAILED = 1
EXIT_CONFIG = 2


def fail(message: str, code: int = EXIT_CONFIG) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code
