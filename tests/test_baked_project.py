"""The baked project's own test suite, run as its developers would run it (hypermodern-python's
practice): install it beside detectorkit, then `pytest` in its folder. Its integration test runs
the service's command on the test broker."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

BIN = pathlib.Path(sys.executable).parent


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


@pytest.mark.parametrize("extra", [{}, {"service_name": "order-bursts", "package_name": "bursts", "input_topic": "orders",
                                       "detector_kind": "burst"}], ids=["threshold", "burst"])
def test_baked_project_test_suite_passes(installed, extra, kafka_bootstrap_servers):
    project = installed(**extra)
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap_servers}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=project, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "7 passed" in run.stdout  # six detector tests and the integration test


def test_console_script_lists_every_setting(installed):
    project = installed(service_name="fraud-velocity")
    script = shutil.which("fraud-velocity", path=str(BIN))
    assert script, "the service's console script was not installed"
    run = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    for flag in ("--kafka-bootstrap-servers", "--input-topic", "--output-topic", "--dlq-topic", "--consumer-group",
                 "--instance-id", "--starting-offsets", "--max-records-per-batch", "--spark-master", "--kafka-option"):
        assert flag in run.stdout
    assert project.name == "fraud-velocity"


def test_console_script_refuses_a_bad_setting_in_one_line(installed):
    installed(service_name="fraud-velocity")
    script = shutil.which("fraud-velocity", path=str(BIN))
    env = {**os.environ, "STARTING_OFFSETS": "yesterday"}
    run = subprocess.run([script], capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "error: invalid setting STARTING_OFFSETS='yesterday': Input should be 'latest', 'earliest' or 'error'"
    ]
