"""`make release` (scripts/release.py) in a clone of this checkout: the version written wherever it is
named, the artifacts built and checked against a default bake, a commit and its tag; and the version a
clone without tags builds, which the bake's default requirement must admit (CI's checkout has none)."""

import datetime
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "release.py"


def release_module():
    spec = importlib.util.spec_from_file_location("release", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def git(cwd: pathlib.Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def clone(dest: pathlib.Path) -> pathlib.Path:
    """This checkout as it is on disk, committed in a clone without tags (as CI's)."""
    git(REPO.parent, "clone", "-q", "--no-tags", str(REPO), str(dest))
    changed = git(REPO, "diff", "-z", "--name-only", "HEAD").split("\0") + git(REPO, "ls-files", "-z", "--others", "--exclude-standard").split("\0")
    for name in filter(None, changed):
        source, target = REPO / name, dest / name
        if source.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        else:
            target.unlink(missing_ok=True)
    git(dest, "add", "-A")
    git(dest, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "the checkout as it is")
    return dest


def built_version(project: pathlib.Path) -> str:
    """The version detectorkit builds with here, as setuptools-scm derives it from the tags."""
    run = subprocess.run([sys.executable, "-m", "setuptools_scm"], cwd=project / "detectorkit", capture_output=True, text=True, check=True)
    return run.stdout.strip()


def admitted(requirement: str, version: str) -> bool:
    return Requirement(requirement).specifier.contains(version, prereleases=True)


def release(project: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "PYTEST_"))}
    env["PATH"] = f"{pathlib.Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return subprocess.run([sys.executable, "scripts/release.py", "release", *args], cwd=project, env=env, capture_output=True, text=True, timeout=900)


def test_a_release_names_its_version_everywhere_checks_its_artifacts_then_commits_and_tags_them(tmp_path):
    project = clone(tmp_path / "repo")
    answers = lambda: json.loads((project / "cookiecutter.json").read_text())  # noqa: E731
    before = built_version(project)
    # A clone without tags builds past the last release, inside what a bake requires.
    assert re.fullmatch(r"0\.1\.1\.dev\d+\+g[0-9a-f]+", before), before
    assert admitted(answers()["detectorkit_requirement"], before)

    run = release(project, "0.2.0")
    assert run.returncode == 0, run.stdout + run.stderr
    assert git(project, "tag", "--points-at", "HEAD").split() == ["v0.2.0"]
    assert git(project, "status", "--porcelain") == ""
    assert built_version(project) == "0.2.0"
    changelog = (project / "CHANGELOG.md").read_text()
    assert f"## [Unreleased]\n\n## [0.2.0] - {datetime.date.today().isoformat()}\n\n### Added\n" in changelog
    assert answers()["detectorkit_requirement"] == "detectorkit>=0.2.0,<0.3"
    chart = (project / "deploy" / "helm" / "detectorkit-job" / "Chart.yaml").read_text()
    assert re.search(r"^version: 0\.2\.0$", chart, re.M) and re.search(r'^appVersion: "0\.2\.0"$', chart, re.M)
    assert "CHART_VERSION ?= 0.2.0" in (project / "{{cookiecutter.service_name}}" / "Makefile").read_text()
    built = sorted(p.name for p in (project / "dist").iterdir())
    assert built == ["RELEASE_NOTES.md", "detectorkit-0.2.0-py3-none-any.whl", "detectorkit-0.2.0.tar.gz"]
    notes = (project / "dist" / "RELEASE_NOTES.md").read_text()
    assert notes.startswith("### Added\n") and "## [" not in notes
    assert notes.strip() in git(project, "tag", "-l", "--format=%(contents)", "v0.2.0")

    # Past the tag in a clone that lost it: the new release is the base.
    git(project, "tag", "-d", "v0.2.0")
    after = built_version(project)
    assert after.startswith("0.2.1.dev") and admitted(answers()["detectorkit_requirement"], after)


def test_a_release_is_refused_in_one_line_with_what_to_do(tmp_path):
    project = clone(tmp_path / "repo")
    last = release_module().last_release((project / "CHANGELOG.md").read_text())
    refusals = {
        ("0.2",): "is not MAJOR.MINOR.PATCH: type e.g. VERSION=0.2.0",
        (last,): f"is not after the last release, {last}",
    }
    for args, message in refusals.items():
        run = release(project, *args, "--no-check")
        assert run.returncode == 1 and run.stderr.strip().endswith(message), run.stderr
    (project / "README.md").write_text("changed\n")
    run = release(project, "9.0.0", "--no-check")
    assert run.returncode == 1 and "commit or stash them first" in run.stderr
    assert git(project, "tag") == ""


@pytest.mark.parametrize(
    ("version", "requirement"),
    [("0.2.0", "detectorkit>=0.2.0,<0.3"), ("0.2.3", "detectorkit>=0.2.3,<0.3"), ("1.4.0", "detectorkit>=1.4.0,<2")],
)
def test_a_bake_requires_its_release_or_a_compatible_one(version, requirement):
    assert release_module().requirement(version) == requirement


def test_an_empty_unreleased_section_is_no_release():
    module = release_module()
    with pytest.raises(module.ReleaseError, match="lists no change"):
        module.with_section("# Changelog\n\n## [Unreleased]\n\n## [0.1.0] - 2026-11-23\n\n- First.\n", "0.2.0", datetime.date(2026, 12, 1))
