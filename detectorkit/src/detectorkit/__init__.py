"""detectorkit: the runtime of detector services, PySpark Structured Streaming jobs on Kafka."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from detectorkit.detector import Detector, NoConfig
    from detectorkit.state import State

__all__ = ["Detector", "NoConfig", "State"]
__version__ = "0.1.0"

# Loaded on first use (PEP 562): Spark's planner processes unpickle the Kafka source, which imports
# this package, and importing pandas there for a name they never use cost each of them ~50 MiB and
# ~0.3 s at every query start.
_LAZY = {"Detector": "detectorkit.detector", "NoConfig": "detectorkit.detector", "State": "detectorkit.state"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'detectorkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
