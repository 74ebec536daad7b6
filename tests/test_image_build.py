"""The default bake's image, built by a real image builder and then run.

Buildah (Debian's package) builds the baked Dockerfile as root without a daemon. Docker Hub may be out of
reach, so the base image is a stand-in built here from Debian's own packages: `python:3.13-slim-trixie`
is Debian trixie with CPython 3.13, and trixie's python3 is 3.13. The stand-in is tagged with the
Dockerfile's own FROM so the build resolves it locally and never pulls. The bake is locked as a team
without its own index locks it (`make lock DETECTORKIT=...`: detectorkit's wheel in wheels/, the rest
from PyPI), after adding a dependency of its own, and the image installs exactly that lock.

Buildah's storage (vfs: no overlay mounts needed) lives in ${XDG_CACHE_HOME:-~/.cache}/detectorkit/image-build,
with the stand-in it keeps (250 MB), so a second run skips debootstrap; the build's uv cache is a cache
mount buildah keeps. The built image and its container are removed after the test."""

import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
from dockerfile_parse import DockerfileParser

REPO = pathlib.Path(__file__).resolve().parents[1]
CACHE = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "detectorkit" / "image-build"
# Debian's packages that make its minimal base into the official slim Python image, as far as the
# Dockerfile uses it: python, pip, and the CA certificates pip's and apt's HTTPS need.
STAND_IN_PACKAGES = "python3,python3-pip,python3-venv,python-is-python3,ca-certificates"
DEBIAN_MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SERVICE = "high-value-orders"
PACKAGE = "high_value_orders"
SPARK_JOB = "from pyspark.sql import SparkSession; s = SparkSession.builder.master('local[1]').getOrCreate(); print(s.range(3).count()); s.stop()"

buildah_exe = shutil.which("buildah")
debootstrap_exe = shutil.which("debootstrap") or next((p for p in ("/usr/sbin/debootstrap",) if os.access(p, os.X_OK)), None)
missing = [
    reason
    for reason, absent in (
        ("buildah is not installed (apt-get install buildah)", buildah_exe is None),
        ("debootstrap is not installed (apt-get install debootstrap): it builds the stand-in base image", debootstrap_exe is None),
        ("not root: buildah builds here as root, without a daemon or user namespaces", os.geteuid() != 0),
    )
    if absent
]
pytestmark = pytest.mark.skipif(bool(missing), reason="; ".join(missing))


def unavailable(reason: str):
    """A dependency out of reach (offline): CI must build the image, elsewhere the test is skipped."""
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def buildah(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    store = ["--root", str(CACHE / "storage"), "--runroot", str(CACHE / "run"), "--storage-driver", "vfs"]
    return subprocess.run([buildah_exe, *store, *args], capture_output=True, text=True, timeout=timeout)


def ok(result: subprocess.CompletedProcess, what: str) -> str:
    # The error first: a build's stdout is mostly apt's and pip's progress.
    assert result.returncode == 0, f"{what} failed ({result.returncode}):\n{result.stderr[-3000:]}\n--- its output's end:\n{result.stdout[-1500:]}"
    return result.stdout.strip()


@contextlib.contextmanager
def cache_lock():
    """One run at a time builds the stand-in or touches the storage's images."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def official_python(base: str) -> tuple[str, str]:
    """The Python version and Debian suite of an official `python:X.Y-slim-SUITE` image."""
    match = re.fullmatch(r"(?:docker\.io/)?(?:library/)?python:(3\.\d+)-slim-(\w+)", base)
    assert match, f"the Dockerfile's base {base!r} is not an official slim Python image, which the stand-in imitates"
    return match[1], match[2]


# Certificate authorities this machine adds to Debian's (a TLS-inspecting proxy's): the stand-in
# trusts them too, so the build reaches PyPI as this machine does.
LOCAL_CAS = sorted(pathlib.Path("/usr/local/share/ca-certificates").glob("**/*.crt"))
CAS_LABEL = "org.detectorkit.stand-in.local-cas"


def stand_in(base: str) -> str:
    """Build (once, then cached) a stand-in for the official `python:X.Y-slim-SUITE` image, named as
    the Dockerfile names it, from Debian SUITE's own packages."""
    python, suite = official_python(base)
    name = f"docker.io/library/python:{python}-slim-{suite}"
    cas = hashlib.sha256(b"".join(ca.read_bytes() for ca in LOCAL_CAS)).hexdigest()[:16]
    found = buildah("inspect", "--type", "image", name)
    if found.returncode == 0:
        if (json.loads(found.stdout)["OCIv1"]["config"].get("Labels") or {}).get(CAS_LABEL) == cas:
            return name
        buildah("rmi", "--force", name)  # built before this machine's CAs were added, or with others
    container = ok(buildah("from", "scratch"), "buildah from scratch")
    try:
        root = ok(buildah("mount", container), "buildah mount")
        # debootstrap straight into the container's root: no copy of the tree.
        bootstrap = subprocess.run(
            [debootstrap_exe, "--variant=minbase", f"--include={STAND_IN_PACKAGES}", suite, root, DEBIAN_MIRROR],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if bootstrap.returncode != 0:
            unavailable(f"debootstrap {suite} from {DEBIAN_MIRROR} failed (offline?): {bootstrap.stdout[-1500:]}{bootstrap.stderr[-1500:]}")
        shutil.rmtree(pathlib.Path(root, "var/cache/apt/archives"), ignore_errors=True)
        pathlib.Path(root, "var/cache/apt/archives/partial").mkdir(parents=True)
        local = pathlib.Path(root, "usr/local/share/ca-certificates")
        local.mkdir(parents=True, exist_ok=True)
        for ca in LOCAL_CAS:
            shutil.copy(ca, local / ca.name)
        ok(buildah("umount", container), "buildah umount")
        ok(buildah("run", "--isolation", "chroot", container, "--", "update-ca-certificates"), "update-ca-certificates in the stand-in")
        version = ok(
            buildah("run", "--isolation", "chroot", container, "--", "python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"),
            "python3 in the stand-in",
        )
        if version != python:
            pytest.skip(f"Debian {suite}'s python3 is {version}, not the image's {python}: no stand-in for {base} from Debian's packages")
        # The official image's pip installs into its own Python; Debian's refuses (PEP 668) unless told.
        config = ["--env", f"PATH={PATH}", "--env", "LANG=C.UTF-8", "--env", "PIP_BREAK_SYSTEM_PACKAGES=1", "--cmd", "python3"]
        # uv trusts its own roots unless told to read the system's, which hold the local CAs.
        config += ["--env", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt", "--label", f"{CAS_LABEL}={cas}"]
        ok(buildah("config", *config, container), "buildah config")
        ok(buildah("commit", "--rm", container, name), "buildah commit of the stand-in")
    except BaseException:
        buildah("rm", container)
        raise
    return name


@pytest.fixture
def default_bake(cookies):
    result = cookies.bake(extra_context={})
    assert result.exit_code == 0, result.exception
    project = pathlib.Path(result.project_path)
    assert project.name == SERVICE
    return project


def lock(project: pathlib.Path) -> None:
    """What a team without its own index does (the bake's README): `make lock DETECTORKIT=...` puts
    detectorkit's wheel in wheels/ and locks every dependency, detectorkit from there, the rest from
    PyPI."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("UV_", "PIP_INDEX_URL", "MAKE"))}
    locked = subprocess.run(
        ["make", "lock", f"DETECTORKIT={REPO / 'detectorkit'}", f"PYTHON={sys.executable}"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if locked.returncode != 0:
        unavailable(f"make lock failed (offline? the dependencies come from PyPI): {locked.stdout[-1500:]}{locked.stderr[-1500:]}")


def test_the_default_bakes_image_builds_and_runs_its_service_as_user_10001(default_bake):
    project = default_bake
    base = DockerfileParser(path=str(project / "Dockerfile")).baseimage
    image = f"localhost/{SERVICE}:image-test"
    # A team adds a dependency of its own (a plain pyproject.toml edit, then `make lock`).
    meta = project / "pyproject.toml"
    meta.write_text(re.sub(r"^dependencies = \[(.*)\]$", r'dependencies = [\1, "tabulate>=0.9"]', meta.read_text(), count=1, flags=re.M))
    lock(project)
    with cache_lock():
        stand_in(base)
        # Leftovers of an interrupted run (the storage is this test's alone): gigabytes each with vfs.
        buildah("rm", "--all")
        buildah("rmi", "--force", image)
        container = None
        try:
            # The build context as a builder gets it (.dockerignore applies), no pip-index-url secret:
            # the Dockerfile falls back to wheels/ alone. --pull=never: the stand-in or nothing.
            ok(
                buildah("bud", "--isolation", "chroot", "--format", "docker", "--pull=never", "--layers=false", "-t", image, str(project)),
                "buildah bud of the default bake",
            )
            config = json.loads(ok(buildah("inspect", "--type", "image", image), "buildah inspect"))["OCIv1"]["config"]
            assert config.get("User") == "10001", f"the image runs as {config.get('User')!r}, not the unprivileged 10001"
            # tini as PID 1 reaps the JVM's and the workers' orphans; SIGTERM goes to the service alone.
            assert config.get("Entrypoint") == ["/usr/bin/tini", "--", SERVICE], config.get("Entrypoint")
            labels = config.get("Labels") or {}
            assert labels.get("org.opencontainers.image.title") == SERVICE and labels.get("org.opencontainers.image.revision"), labels
            container = ok(buildah("from", "--pull=never", image), "buildah from the built image")

            def run(*command: str) -> subprocess.CompletedProcess:
                # buildah run runs as the image's USER, in its WORKDIR, with its ENV. Its chroot isolation
                # names the host after the container but leaves that name out of /etc/hosts, which Docker and
                # Kubernetes always resolve (Spark looks its own host up): a name /etc/hosts has instead.
                return buildah("run", "--isolation", "chroot", "--hostname", "localhost", container, "--", *command)

            assert ok(run("id", "-u"), "id -u in the image") == "10001"
            imported = ok(
                run("python", "-c", f"import {PACKAGE}.detector as d, detectorkit as k, tabulate as t; print(d.__file__, k.__file__, t.__file__)"),
                "importing the service's detector in the image",
            )
            # Installed (site-packages), not the copied source in /app/src; the team's own dependency with them.
            assert all(re.search(r"/site-packages/", path) for path in imported.split()), f"not installed in the image: {imported}"
            helped = ok(run(*config["Entrypoint"], "--help"), f"{SERVICE} --help (the entrypoint) in the image")
            assert f"usage: {SERVICE}" in helped and "--input-topic" in helped, helped
            # Started without a broker, the service reads its baked settings and refuses clearly: the image
            # has no embedded broker (detectorkit's dev extra) to fall back on.
            started = run(*config["Entrypoint"])
            assert started.returncode == 2, started
            assert '"input_topic": "records.normalized"' in started.stderr, started.stderr
            assert "KAFKA_BOOTSTRAP_SERVERS is not set" in started.stderr, started.stderr
            # Spark's JVM (the Dockerfile's JAVA_HOME) starts and runs a job, as the image's unprivileged user.
            counted = ok(run("python", "-c", SPARK_JOB), "a local Spark job in the image")
            assert counted.splitlines()[-1] == "3", counted
            # The image's build archived Spark's classes where its JVM looks for them (runtime.jvm).
            options = ok(run("python", "-c", "from detectorkit.runtime import jvm; print(jvm.driver_options())"), "the JVM's options in the image")
            assert "-XX:SharedArchiveFile=/opt/detectorkit/spark-" in options, options
        finally:
            if container:
                buildah("rm", container)
            buildah("rmi", "--force", image)
