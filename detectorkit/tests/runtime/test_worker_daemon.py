"""Spark's Python workers import PySpark from its installed package (bytecode cached), not from the
zip Spark puts first on their path."""

import os
import pathlib
import subprocess
import sys
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


def test_the_daemon_loads_and_freezes_what_every_task_imports_before_it_forks():
    """The workers it forks share those pages (and skip ~0.5 s of imports each)."""
    probe = (
        "import gc, sys\n"
        "from detectorkit.runtime.worker_daemon import preload\n"
        "before = {m for m in ('pandas', 'pyarrow', 'confluent_kafka', 'detectorkit.runtime.processing') if m in sys.modules}\n"
        "preload()\n"
        "after = {m for m in ('pandas', 'pyarrow', 'confluent_kafka', 'detectorkit.runtime.processing') if m in sys.modules}\n"
        "print(sorted(before), sorted(after), gc.get_freeze_count() > 10_000)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("] ")[0] + "]" == "[]"
    assert done.stdout.strip().endswith("['confluent_kafka', 'detectorkit.runtime.processing', 'pandas', 'pyarrow'] True")
