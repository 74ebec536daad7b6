"""The driver's JVM: small, and mapping this machine's archive of Spark's classes when there is one;
an archive the JVM cannot use (another Java's, a broken file) never stops a service."""

import json
import os
import pathlib
import subprocess
import sys

import pyspark
import pytest

from detectorkit.runtime import jvm

# A session as a service starts it, in its own process: the JVM's arguments, whether it mapped the
# archive (its memory map names the file), and a job's answer.
PROBE = """
import json, sys
from detectorkit.runtime.spark import session
spark = session("local[1]", "jvm-probe")
pid = spark.sparkContext._gateway.proc.pid
args = list(spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
count = spark.range(3).count()
# Each of the archive's mappings: its permissions, and its pages the JVM wrote (copies of its own,
# not the file's pages that other processes share).
mappings, current = [], None
for line in open(f"/proc/{pid}/smaps"):
    head = line.split()
    if "-" in head[0] and len(head) >= 5:
        current = {"perms": head[1], "written_kb": 0} if head[-1] == sys.argv[1] else None
        if current is not None:
            mappings.append(current)
    elif current is not None and head[0] == "Anonymous:":
        current["written_kb"] = int(head[1])
print(json.dumps({"args": args, "mapped": bool(mappings), "mappings": mappings, "count": count}))
"""


def probe(cache: pathlib.Path, archive: pathlib.Path) -> dict:
    env = {**os.environ, "DETECTORKIT_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-c", PROBE, str(archive)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_options_name_the_archive_only_when_this_machine_has_one(tmp_path, monkeypatch):
    monkeypatch.setenv("DETECTORKIT_CACHE_DIR", str(tmp_path))
    assert jvm.driver_options() == list(jvm.SMALL_JVM)
    archive = jvm.archive_path()
    assert archive.parent == tmp_path
    archive.write_bytes(b"")
    assert jvm.driver_options() == [*jvm.SMALL_JVM, f"-XX:SharedArchiveFile={archive}", *jvm.SHARED_CDS, *jvm.QUIET_CDS]
    monkeypatch.setenv("DETECTORKIT_JVM_OPTIONS", " -Xmn64m  -XX:TieredStopAtLevel=4 ")
    assert jvm.driver_options()[-2:] == ["-Xmn64m", "-XX:TieredStopAtLevel=4"]


def test_an_archive_is_for_one_java_and_one_pyspark(tmp_path, monkeypatch):
    monkeypatch.setenv("DETECTORKIT_CACHE_DIR", str(tmp_path))
    ours = jvm.archive_path()
    monkeypatch.setattr(pyspark, "__version__", "0.0.1")
    assert jvm.archive_path() != ours
    monkeypatch.undo()
    monkeypatch.setenv("DETECTORKIT_CACHE_DIR", str(tmp_path))
    other = tmp_path / "other-java"
    (other / "bin").mkdir(parents=True)
    (other / "bin" / "java").write_text("#!/bin/sh\n")
    monkeypatch.setenv("JAVA_HOME", str(other))
    assert jvm.archive_path() not in (None, ours)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert jvm.archive_path() is None
    assert jvm.driver_options() == list(jvm.SMALL_JVM)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the JVM's memory map from /proc")
def test_a_built_archive_is_mapped_by_a_services_jvm_and_a_broken_one_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("DETECTORKIT_CACHE_DIR", str(tmp_path))
    archive, _ = jvm.build_archive()
    assert archive == jvm.archive_path() and archive.stat().st_size > 10 * 2**20
    assert [p.name for p in tmp_path.iterdir()] == [archive.name]  # the build's own file moved into place, nothing left beside it

    started = probe(tmp_path, archive)
    assert started["count"] == 3
    assert started["mapped"], "the service's JVM did not map the archive"
    # Mapped where it was built, its read-only part is the file's clean pages, shared by every JVM
    # that maps it; relocated, the JVM rewrites all of it into pages of its own.
    read_only = [m for m in started["mappings"] if m["perms"].startswith("r-")]
    assert read_only and all(m["written_kb"] == 0 for m in read_only), started["mappings"]
    for option in (*jvm.SMALL_JVM, f"-Xmx{jvm.DRIVER_MEMORY}", f"-XX:SharedArchiveFile={archive}", *jvm.SHARED_CDS):
        assert option in started["args"], started["args"]

    archive.write_bytes(b"not a class archive" * 1000)
    broken = probe(tmp_path, archive)
    assert broken["count"] == 3
    assert not broken["mapped"]
