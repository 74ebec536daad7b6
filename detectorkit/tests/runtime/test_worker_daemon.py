"""Spark's Python workers import PySpark from its installed package (bytecode cached), not from the
zip Spark puts first on their path."""

import os
import pathlib
import zipfile

import pyarrow as pa
import pyspark

from detectorkit.runtime.processing import warm_workers
from detectorkit.runtime.worker_daemon import shipped_zips

from .test_processing import ctx


def where_pyspark_comes_from(batches):
    import pyspark as in_worker

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([{"origin": in_worker.__file__}])


def test_a_workers_pyspark_is_the_installed_package_not_its_zip(spark):
    origin = spark.range(1).mapInArrow(where_pyspark_comes_from, "origin string").collect()[0].origin
    assert ".zip" not in origin
    assert pathlib.Path(origin) == pathlib.Path(pyspark.__file__)


def what_the_daemon_has_loaded(batches):
    for _ in batches:
        pass
    maps = pathlib.Path(f"/proc/{os.getppid()}/maps").read_text()
    yield pa.RecordBatch.from_pylist([{"arrow": "libarrow" in maps, "pandas": "pandas/_libs" in maps}])


def test_the_daemon_loads_what_tasks_import_before_it_forks_their_workers(spark):
    """Shared pages rather than each worker's own: the worker's parent has Arrow and pandas mapped."""
    row = spark.range(1).mapInArrow(what_the_daemon_has_loaded, "arrow boolean, pandas boolean").collect()[0]
    assert row.arrow and row.pandas


def forked_by(batches):
    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([{"daemon": os.getppid()}])


def test_the_workers_warmed_at_start_are_the_ones_the_slices_use(spark):
    """The warm-up is an RDD job and a slice a SQL one: Spark shares workers between the two only
    while it hands both the same environment. Otherwise a second daemon starts at the first slice
    and imports everything again, on the way to the first detection."""
    warmed = warm_workers(spark, ctx())
    used = {row.daemon for row in spark.range(0, 2, 1, 2).mapInArrow(forked_by, "daemon long").collect()}
    assert used <= set(warmed)


def test_a_module_that_fails_to_load_is_left_to_the_worker():
    from detectorkit.runtime.worker_daemon import preload

    preload(("detectorkit.no_such_module", "json"))


def test_only_the_zips_inside_the_installed_pyspark_are_dropped(tmp_path):
    installed = pathlib.Path(pyspark.__file__).parent
    shipped = [str(installed / "python" / "lib" / name) for name in os.listdir(installed / "python" / "lib") if name.endswith(".zip")]
    assert any("pyspark.zip" in z for z in shipped)
    elsewhere = tmp_path / "spark-home" / "python" / "lib" / "pyspark.zip"  # a cluster's own Spark
    elsewhere.parent.mkdir(parents=True)
    zipfile.ZipFile(elsewhere, "w").close()
    site = str(installed.parent)
    assert sorted(shipped_zips([*shipped, str(elsewhere), site])) == sorted(shipped)
    assert shipped_zips([str(elsewhere), site]) == []
    assert shipped_zips([*shipped]) == []  # no installed package beside them: nothing to drop
