"""The job's Python code, shipped to the executors of a cluster with the job itself.

In local mode the executors are this machine's processes and import what this environment has. On
a cluster they run in the workers' environment, which has the third-party packages (PySpark,
confluent-kafka, pyarrow...) but need not have detectorkit or the service: a service is deployed by
deploying its driver, never by installing it on every worker. So at start the job zips the top-level
packages its stage is made of (detectorkit and the service's own) and adds them with `addPyFile`;
Spark puts them on every executor's Python path.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
import tempfile
import zipfile
from collections.abc import Iterable

_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


def stage_packages(stage: object) -> list[str]:
    """The top-level packages a stage's code comes from: its class, and a detector's function and
    configuration class. Pickled functions refer to these by module name."""
    objects = [type(stage)]
    detector = getattr(stage, "detector", None)
    if detector is not None:
        objects += [getattr(detector, "detect", None), getattr(detector, "config", None)]
    roots = {"detectorkit"}
    for obj in objects:
        module = getattr(obj, "__module__", None)
        if module and module != "__main__":
            roots.add(module.partition(".")[0])
    provided = _workers_have()
    return sorted(r for r in roots if r not in sys.stdlib_module_names and r not in provided)


def runtime_requirements(dist: str) -> list[str]:
    """The names of the distributions `dist` needs at run time (its extras left out), as
    installed metadata lists them; [] when it is not installed."""
    import re
    from importlib import metadata

    try:
        requires = metadata.requires(dist) or []
    except metadata.PackageNotFoundError:
        return []
    return [re.match(r"[A-Za-z0-9_.-]+", r).group(0) for r in requires if "extra ==" not in r]


def _workers_have() -> set[str]:
    """Top-level packages of detectorkit's dependencies, and theirs: the workers' environment has
    them (shipping PySpark or pandas would shadow its own)."""
    from importlib import metadata

    def canonical(name: str) -> str:
        return name.lower().replace("_", "-")

    wanted, seen = ["detectorkit"], set()
    while wanted:
        dist = wanted.pop()
        if dist in seen:
            continue
        seen.add(dist)
        wanted += [canonical(name) for name in runtime_requirements(dist)]
    seen.discard("detectorkit")
    return {root for root, dists in metadata.packages_distributions().items() if any(canonical(d) in seen for d in dists)}


def _location(package: str) -> pathlib.Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return pathlib.Path(next(iter(spec.submodule_search_locations)))
    return pathlib.Path(spec.origin) if spec.origin else None


def package_zip(package: str, into: pathlib.Path) -> pathlib.Path:
    """A zip of a top-level package (its modules and data files) that Python can import from."""
    location = _location(package)
    if location is None:
        raise LookupError(f"cannot find the package {package!r} to ship to the executors")
    target = into / f"{package}.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        if location.is_file():  # a single-module package
            archive.write(location, location.name)
            return target
        for path in sorted(location.rglob("*")):
            if path.is_file() and not _SKIP_DIRS.intersection(path.relative_to(location).parts) and path.suffix != ".pyc":
                archive.write(path, pathlib.PurePosixPath(package, *path.relative_to(location).parts))
    return target


def zip_packages(packages: Iterable[str]) -> list[pathlib.Path]:
    """Zip `packages` and put the zips on PYTHONPATH, before the session starts: the JVM passes its
    PYTHONPATH to the Python processes it starts on this machine, and the streaming source's
    planner is one of them. Spark does not give it the job's py-files (they land in a directory of
    the session's own that holds none of them)."""
    into = pathlib.Path(tempfile.mkdtemp(prefix="detectorkit-ship-"))
    zips = [package_zip(p, into) for p in packages]
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([*(str(z) for z in zips), *([path] if path else [])])
    return zips


def ship(spark, zips: Iterable[pathlib.Path]) -> None:
    """Add the zips to the job, so its executors import them from there."""
    for path in zips:
        spark.sparkContext.addPyFile(str(path))
