"""PySpark's worker daemon, importing PySpark from its installed package rather than from the
copy zipped beside it.

Spark puts `<pyspark>/python/lib/pyspark.zip` (and py4j's zip) first on its Python workers' path.
A zip holds no compiled bytecode, so every Python process Spark starts compiles what it imports of
PySpark from source: the daemon, and each worker it forks (a worker imports its module, such as the
data source reader's, after the fork), about 0.4 s of CPU each (py-spy: a tenth of a short job's
CPU went to `zipimport._compile_source`). The installed package is the same code, byte for byte
(the zips are built from it and shipped inside it), with its bytecode cached.

The daemon also imports what the job's tasks import before it forks a worker (`PRELOAD`).

Only zips that sit inside the installed PySpark package are dropped: a cluster's own Spark
installation (another SPARK_HOME) keeps its PySpark. Used in local mode (runtime.spark), where
the workers run the driver's interpreter, so this module is there.
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys
from importlib.machinery import PathFinder


def shipped_zips(path: list[str]) -> list[str]:
    """The entries of `path` that are zips inside the PySpark package the rest of `path` holds."""
    unzipped = [p for p in path if not p.endswith(".zip")]
    spec = PathFinder.find_spec("pyspark", unzipped)
    if spec is None or not spec.submodule_search_locations:
        return []
    inside = os.path.join(os.path.realpath(list(spec.submodule_search_locations)[0]), "python", "lib") + os.sep
    found = [p for p in path if p.endswith(".zip") and os.path.realpath(p).startswith(inside)]
    # py4j's zip goes only if py4j is installed too.
    if PathFinder.find_spec("py4j", unzipped) is None:
        found = [p for p in found if "py4j" not in os.path.basename(p)]
    return found


# What every task of the job imports: loaded once here, before the daemon forks its workers, the
# pages are shared (copy on write) instead of each worker's own, and a worker starts without
# importing them (the CHANGELOG has the memory this saves).
PRELOAD = ("pyspark.worker", "pyspark.sql.pandas.serializers", "detectorkit.runtime.processing", "detectorkit.runtime.slices")


def preload(modules: tuple[str, ...] = PRELOAD) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112 - only an optimisation: the worker imports it and says what fails
            continue


def main() -> None:
    dropped = set(shipped_zips(sys.path))
    sys.path[:] = [p for p in sys.path if p not in dropped]
    preload()
    # As `python -m pyspark.daemon <worker module>`: the daemon reads the worker module from argv.
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
