"""detectorkit: the runtime of detector services, PySpark Structured Streaming jobs on Kafka."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from detectorkit.detector import Detector, NoConfig
    from detectorkit.state import State

__all__ = ["Detector", "NoConfig", "State"]

# Loaded on first use (PEP 562): what imports the package for something else (the command line's
# broker and tail, a worker's first import) does not pay for pandas.
_LAZY = {"Detector": "detectorkit.detector", "NoConfig": "detectorkit.detector", "State": "detectorkit.state"}


def __getattr__(name: str):
    if name == "__version__":
        # The installed distribution's, which the repository's git tags set (no copy to keep in step).
        from importlib import metadata

        return metadata.version("detectorkit")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'detectorkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
