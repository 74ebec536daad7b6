"""What an instance runs: the service's version and those of detectorkit, PySpark and Python, as
the labels of `detector_build_info` (1 per instance; summed across a fleet, how many instances
run each combination)."""

from __future__ import annotations

import platform
from importlib import metadata


def versions(package: str | None) -> dict[str, str]:
    """The labels: `version` is the installed distribution that provides `package` (the service's
    top-level package), "unknown" when none does (code run from a checkout)."""
    return {
        "version": _providing(package) if package else "unknown",
        "detectorkit": _version("detectorkit"),
        "pyspark": _version("pyspark"),
        "python": platform.python_version(),
    }


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def _providing(package: str) -> str:
    dists = metadata.packages_distributions().get(package, [])
    return _version(dists[0]) if dists else "unknown"


def package_of(stage: object) -> str | None:
    """The top-level package a stage's code comes from: a detector's function's, else the stage's
    own class's (a role's: detectorkit)."""
    detector = getattr(stage, "detector", None)
    code = getattr(detector, "detect", None) if detector is not None else None
    root = getattr(code if code is not None else type(stage), "__module__", "").partition(".")[0]
    return None if root in ("", "__main__") else root
