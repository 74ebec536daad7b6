"""The baked project's own test suite, run as its developers would run it (hypermodern-python's
practice): install it beside detectorkit, then `pytest` in its folder. Its integration test runs
the service's command on the test broker."""

import functools
import hashlib
import http.server
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading
import tomllib
import xml.etree.ElementTree as ET

import pytest
import yaml

BIN = pathlib.Path(sys.executable).parent
REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def installed(cookies):
    """Bake a service and pip-install it (editable, no dependencies: detectorkit is already here)."""
    installed_names = []

    def install(**extra):
        result = cookies.bake(extra_context=extra)
        assert result.exit_code == 0, result.exception
        project = pathlib.Path(result.project_path)
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", str(project)]
        subprocess.run(pip, check=True)
        installed_names.append(project.name)
        return project

    yield install
    for name in installed_names:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", name], check=False)


# One bake per detector_kind, its whole suite run: the unit tests and the service on the broker.
SUITES = {
    "threshold": {},
    "burst": {"service_name": "order-bursts", "package_name": "bursts", "input_topic": "orders", "detector_kind": "burst"},
    "silence": {"service_name": "quiet-customers", "package_name": "quiet", "detector_kind": "silence"},
    "totals": {"service_name": "hourly-totals", "package_name": "totals", "detector_kind": "totals"},
    "model": {"service_name": "fraud-score", "package_name": "fraud_score", "detector_kind": "model"},
}


@pytest.mark.parametrize("extra", list(SUITES.values()), ids=list(SUITES))
def test_baked_project_test_suite_passes(installed, extra, kafka_bootstrap_servers, tmp_path):
    project = installed(**extra)
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap_servers}
    report = tmp_path / "report.xml"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    outcome = junit(report)
    assert outcome["failed"] == outcome["skipped"] == [], outcome
    # The detector's own tests and the integration test, which ran the service on the broker.
    assert "test_service_writes_detections_and_dead_letters" in outcome["passed"]
    assert len(outcome["passed"]) >= 5, outcome


def junit(report: pathlib.Path) -> dict[str, list[str]]:
    """pytest's outcome per test from its JUnit XML report: passed, failed (or errors), skipped."""
    outcome: dict[str, list[str]] = {"passed": [], "failed": [], "skipped": []}
    for case in ET.parse(report).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        kind = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        outcome[kind].append(case.get("name"))
    return outcome


class TeamIndex(http.server.SimpleHTTPRequestHandler):
    """A team's package index as teams run one (devpi, Artifactory, Nexus): it serves its own uploads
    (detectorkit's wheel, PEP 503 layout, the directory listing as the project page) and proxies every
    other project to the upstream index, here by redirecting to it."""

    upstream = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    requested: list[str] = []

    def do_GET(self):
        self.requested.append(self.path)
        project = re.fullmatch(r"/simple/([^/]+)/?", self.path)
        if project and not (pathlib.Path(self.directory) / "simple" / project[1]).is_dir():
            self.send_response(302)
            self.send_header("Location", f"{self.upstream}/{project[1]}/")
            self.end_headers()
            return
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture
def package_index(tmp_path):
    """The team's index holding detectorkit's wheel, served over HTTP; its `requested` paths say what pip asked."""
    simple = tmp_path / "index" / "simple" / "detectorkit"
    simple.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(simple), str(REPO / "detectorkit")], check=True)
    # The project page as PEP 503 has an index write it, each file's link carrying its hash.
    links = "".join(f'<a href="{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a>' for w in simple.glob("*.whl"))
    (simple / "index.html").write_text(f"<!DOCTYPE html><html><body>{links}</body></html>")
    handler = type("Index", (TeamIndex,), {"requested": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(tmp_path / "index")))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/simple/", handler.requested
    finally:
        server.shutdown()
        server.server_close()


def test_baked_project_installs_detectorkit_from_the_teams_index_with_its_own_makefile(cookies, package_index):
    # As a team's CI does: a fresh checkout, `make test-unit` and `make lint`, every package from the
    # one index PIP_INDEX_URL names (no extra index beside it), detectorkit from the team's own uploads.
    url, requested = package_index
    result = cookies.bake()
    project = pathlib.Path(result.project_path)
    env = {key: value for key, value in os.environ.items() if key != "PIP_EXTRA_INDEX_URL"}
    env.update(PIP_INDEX_URL=url, PYTHON=sys.executable)
    for target in ("test-unit", "lint"):
        run = subprocess.run(["make", target], cwd=project, env=env, capture_output=True, text=True, timeout=900)
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    where = subprocess.run(
        [str(project / ".venv" / "bin" / "python"), "-c", "import detectorkit; print(detectorkit.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(project / ".venv") in where  # installed into the project's own environment
    assert any(path.startswith("/simple/detectorkit/detectorkit-") and path.endswith(".whl") for path in requested), requested
    assert any(path.startswith("/simple/pytest/") for path in requested), "the other packages did not come through the team's index"
    # The first install wrote the lock, every package from the one index, with its hashes; the test
    # tools the environment holds are exactly the locked versions.
    lock = tomllib.loads((project / "uv.lock").read_text())
    packages = {package["name"]: package for package in lock["package"]}
    assert {package["source"].get("registry") for name, package in packages.items() if name != "high-value-orders"} == {url}
    unhashed = [wheel for package in packages.values() for wheel in package.get("wheels", []) if "hash" not in wheel]
    assert not unhashed, f"locked wheels without their hashes: {unhashed}"
    installed = subprocess.run(
        [str(project / ".venv" / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('pytest'), m.version('pyspark'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert installed == [packages["pytest"]["version"], packages["pyspark"]["version"]]
    # A dependency added to pyproject.toml but not locked: CI (UV_LOCKED) refuses, and says how to mend it.
    meta = project / "pyproject.toml"
    meta.write_text(re.sub(r"^dependencies = \[(.*)\]$", r'dependencies = [\1, "tabulate>=0.9"]', meta.read_text(), count=1, flags=re.M))
    stale = subprocess.run(["make", "install"], cwd=project, env={**env, "UV_LOCKED": "1"}, capture_output=True, text=True, timeout=900)
    assert stale.returncode != 0 and "needs to be updated" in stale.stderr, stale.stdout[-2000:] + stale.stderr[-2000:]


def test_console_script_lists_every_setting(installed):
    project = installed(service_name="fraud-velocity")
    script = shutil.which("fraud-velocity", path=str(BIN))
    assert script, "the service's console script was not installed"
    run = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    for flag in (
        "--kafka-bootstrap-servers",
        "--input-topic",
        "--output-topic",
        "--dlq-topic",
        "--consumer-group",
        "--instance-id",
        "--starting-offsets",
        "--max-records-per-batch",
        "--spark-master",
        "--kafka-option",
    ):
        assert flag in run.stdout
    assert project.name == "fraud-velocity"


def test_console_script_refuses_a_bad_setting_in_one_line(installed):
    installed(service_name="fraud-velocity")
    script = shutil.which("fraud-velocity", path=str(BIN))
    env = {**os.environ, "STARTING_OFFSETS": "yesterday"}
    run = subprocess.run([script], capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == ["error: invalid setting STARTING_OFFSETS='yesterday': Input should be 'latest', 'earliest' or 'error'"]


CRUFT = [sys.executable, "-m", "cruft"]


@pytest.fixture
def cruft_service(tmp_path):
    """A copy of the template in a git repository of its own, and a service generated from it with
    cruft, committed, with an edit of the team's own in its detector."""
    template = tmp_path / "template"
    template.mkdir()
    for name in ("cookiecutter.json", "hooks", "{{cookiecutter.service_name}}"):
        source = REPO / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, template / name)
    git(template, "init", "-q", "-b", "main")
    git(template, "add", "-A")
    git(template, "commit", "-q", "-m", "the template")

    out = tmp_path / "services"
    subprocess.run([*CRUFT, "create", "--no-input", "--output-dir", str(out), str(template)], check=True, capture_output=True)
    project = out / "high-value-orders"
    recorded = json.loads((project / ".cruft.json").read_text())
    assert recorded["template"] == str(template) and recorded["context"]["cookiecutter"]["service_name"] == "high-value-orders"
    git(project, "init", "-q", "-b", "main")
    detector = project / "src" / "high_value_orders" / "detector.py"
    detector.write_text(detector.read_text() + "\n# the team's own edit\n")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "generated, then edited")
    return template, project


def improve(template: pathlib.Path) -> None:
    """The template improves: a new line in every service's .gitignore."""
    ignore = template / "{{cookiecutter.service_name}}" / ".gitignore"
    ignore.write_text(ignore.read_text() + "# checkpoints of local runs\n.checkpoints/\n")
    git(template, "commit", "-q", "-am", "ignore local checkpoints")


def test_cruft_update_brings_a_template_change_into_a_baked_project(cruft_service):
    """A service generated with cruft records its template; once the template changes, `cruft
    check` says so and `cruft update` brings the change in, the service's own edits kept."""
    template, project = cruft_service
    detector = project / "src" / "high_value_orders" / "detector.py"
    assert subprocess.run([*CRUFT, "check"], cwd=project, capture_output=True).returncode == 0
    improve(template)
    assert subprocess.run([*CRUFT, "check"], cwd=project, capture_output=True).returncode != 0

    update = subprocess.run([*CRUFT, "update", "--skip-apply-ask", "-y"], cwd=project, capture_output=True, text=True)
    assert update.returncode == 0, update.stdout + update.stderr
    assert ".checkpoints/" in (project / ".gitignore").read_text()
    assert "# the team's own edit" in detector.read_text()
    assert subprocess.run([*CRUFT, "check"], cwd=project, capture_output=True).returncode == 0


def test_the_scheduled_template_update_opens_one_pull_request_with_the_change(cruft_service, tmp_path):
    """The baked template-update.yml's own script, run in the service's checkout: nothing while the
    service is current; once the template moves, the update on its branch, pushed, and a pull request
    opened (then edited, while it stays open) through the gh CLI, here a stand-in that records calls."""
    template, project = cruft_service
    workflow = yaml.safe_load((project / ".github" / "workflows" / "template-update.yml").read_text())
    (step,) = [step for step in workflow["jobs"]["update"]["steps"] if "run" in step]
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(remote))
    git(project, "remote", "add", "origin", str(remote))
    git(project, "push", "-q", "origin", "main")
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "gh-calls"
    pr_state = tmp_path / "pr-state"
    (fake / "gh").write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\n'
        f'if [ "$1 $2" = "pr view" ]; then [ -f {pr_state} ] && cat {pr_state} && exit 0; exit 1; fi\n'
        f'if [ "$1 $2" = "pr create" ]; then echo OPEN > {pr_state}; fi\n'
    )
    (fake / "gh").chmod(0o755)
    env = {
        **os.environ,
        **step["env"],
        "GH_TOKEN": "not-a-token",
        "PATH": os.pathsep.join([str(fake), str(pathlib.Path(sys.executable).parent), os.environ["PATH"]]),
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }

    def scheduled_run():
        ran = subprocess.run(["bash", "-c", step["run"]], cwd=project, env=env, capture_output=True, text=True, timeout=300)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        git(project, "switch", "-q", "main")

    def branch_file(name: str) -> str:
        return subprocess.run(["git", "show", f"template-update:{name}"], cwd=remote, capture_output=True, text=True, check=True).stdout

    scheduled_run()
    assert not calls.exists(), "a pull request for a service that is current"
    assert subprocess.run(["git", "rev-parse", "--verify", "-q", "template-update"], cwd=remote, capture_output=True).returncode != 0

    improve(template)
    scheduled_run()
    assert ".checkpoints/" in branch_file(".gitignore")
    assert "# the team's own edit" in branch_file("src/high_value_orders/detector.py")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=template, capture_output=True, text=True, check=True).stdout.strip()
    assert json.loads(branch_file(".cruft.json"))["commit"] == head
    created = [line for line in calls.read_text().splitlines() if line.startswith("pr create")]
    assert len(created) == 1 and "--head template-update" in created[0] and head in created[0], created

    # The next week, the pull request still open and the template moved again: the same one, edited.
    ignore = template / "{{cookiecutter.service_name}}" / ".gitignore"
    ignore.write_text(ignore.read_text() + "# profiles\n*.prof\n")
    git(template, "commit", "-q", "-am", "ignore profiles")
    scheduled_run()
    assert "*.prof" in branch_file(".gitignore")
    lines = calls.read_text().splitlines()
    assert [line.split()[:2] for line in lines if line.startswith("pr ") and not line.startswith("pr view")] == [["pr", "create"], ["pr", "edit"]]


def git(where: pathlib.Path, *args: str) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    subprocess.run(["git", *args], cwd=where, env=env, check=True)
