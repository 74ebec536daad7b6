"""The driver's JVM, sized and started for a detector rather than for analytics.

A detector's records never enter the JVM (the tasks read, detect and write in Python), so the
driver JVM holds Spark's planning and a few summary rows per batch: 70 MiB of live heap, measured.
Spark's defaults size it for analytics. Measured on this project's service (2 cores, Apache Kafka,
1,000,000 records, see the README's benchmarks):

- G1 with the default initial heap (1/64 of the machine's memory: 384 MiB here) committed 130-390
  MiB of heap and 43 MiB of G1's own tables. The serial collector with a 32 MiB initial heap and a
  16 MiB young generation: the JVM's PSS 431 -> 312 MiB, its collections a few ms each.
- The C2 compiler pays off on long loops over data, which this JVM does not run: C1 alone started
  the session 0.7 s sooner and left throughput unchanged.
- Class data sharing: the session loads ~30,000 classes, most of its 5 s start. A dynamic CDS
  archive of them (`build_archive`, once per machine, or in an image's build) maps them instead:
  SparkSession 5.1 -> 2.2 s, the first job 1.4 -> 0.4 s.
- Where the archive is mapped: Debian's Java 17 maps it at a random address by default
  (`ArchiveRelocationMode=1`, for address-space randomisation) and then rewrites every pointer in
  it, so all of it becomes pages of the process's own. Mapped where it was built, its
  read-only part stays clean pages of the file, which every JVM mapping the same archive shares
  (idle services side by side, or pods of one image on a node), and the JVM starts sooner. The cost
  is that the archived class metadata sits at a known address; an operator who wants it random sets
  `DETECTORKIT_JVM_OPTIONS=-XX:ArchiveRelocationMode=1`.

The archive is used only when it exists and was made by the same Java for the same PySpark (its
name holds both); the JVM checks the rest (the class path) itself and, if it does not match, runs
without it. `-Xlog:cds=off` keeps that check's warnings out of the service's JSON logs.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import resources

import pyspark

# See the module's docstring for what each bought.
DRIVER_MEMORY = "512m"
SMALL_JVM = ("-XX:+UseSerialGC", "-Xms32m", "-Xmn16m", "-XX:TieredStopAtLevel=1")
QUIET_CDS = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")
# The archive mapped where it was built (falling back to relocating it when that address is taken).
SHARED_CDS = ("-XX:+UnlockDiagnosticVMOptions", "-XX:ArchiveRelocationMode=0")
# Options of the operator's, after ours (a larger heap for a detector that needs it, say).
EXTRA_OPTIONS = "DETECTORKIT_JVM_OPTIONS"
# Set for the archive's training run only (see jvm_archive).
_ARCHIVE_TO = "DETECTORKIT_ARCHIVE_CLASSES_TO"


def java_executable() -> str | None:
    """The java Spark's launcher runs: JAVA_HOME's, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("DETECTORKIT_CACHE_DIR") or pathlib.Path.home() / ".cache" / "detectorkit")


def archive_path() -> pathlib.Path | None:
    """Where this machine's archive for this Java and this PySpark is, or would be built."""
    java = java_executable()
    if java is None:
        return None
    real = os.path.realpath(java)
    stat = os.stat(real)
    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    key = hashlib.sha256(f"{real}:{stat.st_size}:{stat.st_mtime_ns}:{jars}".encode()).hexdigest()[:12]
    return cache_dir() / f"spark-{pyspark.__version__}-{key}.jsa"


def driver_options() -> list[str]:
    """The driver JVM's options: small, and mapping the class archive when there is one (or
    writing one, in the archive's training run)."""
    options = [*SMALL_JVM]
    training = os.environ.get(_ARCHIVE_TO)
    if training:
        options.append(f"-XX:ArchiveClassesAtExit={training}")
        return options
    archive = archive_path()
    if archive is not None and archive.is_file():
        options += [f"-XX:SharedArchiveFile={archive}", *SHARED_CDS, *QUIET_CDS]
    # Last, so they win: the JVM takes the last of two settings of an option.
    return options + os.environ.get(EXTRA_OPTIONS, "").split()


def log4j_option() -> str:
    """The runtime's log4j2 configuration, for the driver's and a local executor's JVM."""
    return f"-Dlog4j2.configurationFile=file:{resources.files('detectorkit.runtime').joinpath('log4j2.properties')}"


def java_options() -> str:
    """The driver's extraJavaOptions."""
    return " ".join([log4j_option(), *driver_options()])


def prepare_environment(local: bool) -> None:
    """What the driver's JVM and its Python workers inherit from this process's environment, set
    before the JVM starts."""
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if local:
        # Workers must run this interpreter (the service's venv), not whatever `python3` is on PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        # Everything runs on this machine; this also spares a warning at every start.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # The local workers inherit the driver's environment (see runtime.spark on Arrow's pool).
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")


def build_archive(timeout: float = 300.0) -> tuple[pathlib.Path, float]:
    """Build this machine's class archive: a JVM that starts a session and runs the kinds of jobs
    a detector runs writes the classes it loaded when it exits. Returns its path and the seconds
    it took. Safe to run beside a running service, or twice at once: each run writes a file of its
    own, moved into place whole."""
    target = archive_path()
    if target is None:
        raise RuntimeError("no java found (JAVA_HOME, PATH); Spark needs Java 17 or later")
    target.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        written = pathlib.Path(tmp) / target.name
        done = subprocess.run(
            [sys.executable, "-m", "detectorkit.runtime.jvm_archive"],
            env={**os.environ, _ARCHIVE_TO: str(written)},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0 or not written.is_file():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"the class archive was not written ({last})")
        os.replace(written, target)
    return target, time.monotonic() - began
