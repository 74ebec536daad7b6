"""Spark's Python workers import PySpark from its installed package (bytecode cached), not from the
zip Spark puts first on their path."""

import os
import pathlib
import zipfile

import pyarrow as pa
import pyspark

from detectorkit.runtime.worker_daemon import shipped_zips


def where_pyspark_comes_from(batches):
    import pyspark as in_worker

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([{"origin": in_worker.__file__}])


def test_a_workers_pyspark_is_the_installed_package_not_its_zip(spark):
    origin = spark.range(1).mapInArrow(where_pyspark_comes_from, "origin string").collect()[0].origin
    assert ".zip" not in origin
    assert pathlib.Path(origin) == pathlib.Path(pyspark.__file__)


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
