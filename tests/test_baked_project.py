"""The baked project's own test suite, run as its developers would run it (hypermodern-python's
practice): install it beside detectorkit, then `pytest` in its folder. Its integration test runs
the service's command on the test broker."""

import functools
import http.server
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET

import pytest

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


def test_cruft_update_brings_a_template_change_into_a_baked_project(tmp_path):
    """A service generated with cruft records its template; once the template changes, `cruft
    check` says so and `cruft update` brings the change in, the service's own edits kept."""
    template = tmp_path / "template"
    template.mkdir()
    for name in ("cookiecutter.json", "hooks", "{{cookiecutter.service_name}}"):
        source = REPO / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, template / name)
    git(template, "init", "-q", "-b", "main")
    git(template, "add", "-A")
    git(template, "commit", "-q", "-m", "the template")

    cruft = [sys.executable, "-m", "cruft"]
    out = tmp_path / "services"
    subprocess.run([*cruft, "create", "--no-input", "--output-dir", str(out), str(template)], check=True, capture_output=True)
    project = out / "high-value-orders"
    recorded = json.loads((project / ".cruft.json").read_text())
    assert recorded["template"] == str(template) and recorded["context"]["cookiecutter"]["service_name"] == "high-value-orders"
    git(project, "init", "-q", "-b", "main")
    detector = project / "src" / "high_value_orders" / "detector.py"
    detector.write_text(detector.read_text() + "\n# the team's own edit\n")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "generated, then edited")
    assert subprocess.run([*cruft, "check"], cwd=project, capture_output=True).returncode == 0

    # The template improves: a new line in every service's .gitignore.
    ignore = template / "{{cookiecutter.service_name}}" / ".gitignore"
    ignore.write_text(ignore.read_text() + "# checkpoints of local runs\n.checkpoints/\n")
    git(template, "commit", "-q", "-am", "ignore local checkpoints")
    assert subprocess.run([*cruft, "check"], cwd=project, capture_output=True).returncode != 0  # CI turns red

    update = subprocess.run([*cruft, "update", "--skip-apply-ask", "-y"], cwd=project, capture_output=True, text=True)
    assert update.returncode == 0, update.stdout + update.stderr
    assert ".checkpoints/" in (project / ".gitignore").read_text()
    assert "# the team's own edit" in detector.read_text()
    assert subprocess.run([*cruft, "check"], cwd=project, capture_output=True).returncode == 0


def git(where: pathlib.Path, *args: str) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    subprocess.run(["git", *args], cwd=where, env=env, check=True)
