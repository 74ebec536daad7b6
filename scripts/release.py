"""A release of the template and detectorkit, which carry one version (the repository's tag vX.Y.Z).

    make release VERSION=0.2.0    the changelog's section, the version in every file that names it,
                                  the artifacts built and checked, then a commit and its tag
    make release-check            the artifacts of the tag at HEAD built into dist/ and checked
                                  (what the release workflow runs before it publishes)

The checks: `twine check` on the wheel and the sdist, then the template baked with its default
answers against the wheel alone (wheels/), installed in a fresh venv by the bake's own `make`, its
unit tests run there and detectorkit's version read back.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
DIST = REPO / "dist"
SEMVER = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
RELEASE_HEADING = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", re.M)


class ReleaseError(Exception):
    """What stops a release, said in one line with what to do instead."""


def parse(version: str) -> tuple[int, int, int]:
    found = SEMVER.match(version)
    if found is None:
        raise ReleaseError(f"VERSION={version!r} is not MAJOR.MINOR.PATCH: type e.g. VERSION=0.2.0")
    major, minor, patch = found.groups()
    return int(major), int(minor), int(patch)


def last_release(changelog: str) -> str:
    found = RELEASE_HEADING.search(changelog)
    if found is None:
        raise ReleaseError("CHANGELOG.md names no release ('## [X.Y.Z] - YYYY-MM-DD')")
    return found[1]


def requirement(version: str) -> str:
    """What a bake of this version depends on: this release or a later one that semantic versioning
    says is compatible (before 1.0, a minor version may break)."""
    major, minor, _ = parse(version)
    below = f"{major + 1}" if major else f"0.{minor + 1}"
    return f"detectorkit>={version},<{below}"


def with_section(changelog: str, version: str, day: datetime.date) -> str:
    """[Unreleased]'s entries become `version`'s; [Unreleased] starts empty again."""
    head, sep, rest = changelog.partition("## [Unreleased]\n")
    if not sep:
        raise ReleaseError("CHANGELOG.md has no '## [Unreleased]' section")
    entries = rest.split("\n## [", 1)[0]
    if not re.search(r"^- ", entries, re.M):
        raise ReleaseError("CHANGELOG.md's [Unreleased] lists no change: write what this release changes first")
    return f"{head}{sep}\n## [{version}] - {day.isoformat()}\n{rest}"


def section(changelog: str, version: str) -> str:
    """The notes of `version`: its section's entries, for the tag and the hosted release."""
    found = re.search(rf"^## \[{re.escape(version)}\] - [^\n]*\n(.*?)(?=^## \[|\Z)", changelog, re.M | re.S)
    if found is None:
        raise ReleaseError(f"CHANGELOG.md has no section for {version}")
    return found[1].strip() + "\n"


def substitute(path: pathlib.Path, pattern: str, replacement: str) -> None:
    text = path.read_text()
    new, count = re.subn(pattern, replacement, text, count=1, flags=re.M)
    if count != 1:
        raise ReleaseError(f"{path.relative_to(REPO)}: no line matches {pattern!r}")
    path.write_text(new)


def set_version(version: str, day: datetime.date) -> None:
    """Every file that names the version: the changelog, the build's fallback, the bake's requirement
    and the chart (its version and its shared jobs' image tag)."""
    changelog = REPO / "CHANGELOG.md"
    changelog.write_text(with_section(changelog.read_text(), version, day))
    substitute(REPO / "detectorkit" / "pyproject.toml", r'^fallback_version = "[^"]*"$', f'fallback_version = "{version}"')
    answers_path = REPO / "cookiecutter.json"
    answers = json.loads(answers_path.read_text())
    answers["detectorkit_requirement"] = requirement(version)
    answers_path.write_text(json.dumps(answers, indent=2, ensure_ascii=False) + "\n")
    chart = REPO / "deploy" / "helm" / "detectorkit-job" / "Chart.yaml"
    substitute(chart, r"^version: .*$", f"version: {version}")
    substitute(chart, r"^appVersion: .*$", f'appVersion: "{version}"')
    substitute(REPO / "deploy" / "helm" / "values" / "kafka.yaml", r"^  tag: .*$", f"  tag: {version}")
    substitute(REPO / "{{cookiecutter.service_name}}" / "Makefile", r"^CHART_VERSION \?= .*$", f"CHART_VERSION ?= {version}")


def run(*args: str | os.PathLike, cwd: pathlib.Path = REPO, env: dict | None = None) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise ReleaseError(f"{' '.join(map(str, args))} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def build(version: str) -> list[pathlib.Path]:
    """The wheel and the sdist of `version` into dist/, checked by twine."""
    shutil.rmtree(DIST, ignore_errors=True)
    # Before its commit exists the tag cannot say the version; the build is told it instead.
    env = {**os.environ, "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_DETECTORKIT": version}
    run(sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", DIST, REPO / "detectorkit", env=env)
    artifacts = sorted(DIST.glob(f"detectorkit-{version}*"))
    if len(artifacts) != 2:
        raise ReleaseError(f"expected a wheel and an sdist of {version} in dist/, found {[a.name for a in DIST.iterdir()]}")
    run(sys.executable, "-m", "twine", "check", "--strict", *artifacts)
    return artifacts


def bake_against(version: str, workdir: pathlib.Path) -> None:
    """The template's default bake, locked and installed with the wheel alone as detectorkit (a
    fresh venv, by the bake's Makefile), its unit tests run, the version read back."""
    from cookiecutter.main import cookiecutter

    project = pathlib.Path(cookiecutter(str(REPO), no_input=True, output_dir=str(workdir)))
    for wheel in DIST.glob(f"detectorkit-{version}-*.whl"):
        shutil.copy(wheel, project / "wheels")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_", "PIP_", "KAFKA_", "PYTEST_"))}
    run("make", "lock", cwd=project, env=env)
    run("make", "test-unit", cwd=project, env=env)
    found = run(project / ".venv" / "bin" / "python", "-c", "import detectorkit; print(detectorkit.__version__)", cwd=project).strip()
    if found != version:
        raise ReleaseError(f"the bake installed detectorkit {found}, not {version}")


def check(version: str) -> None:
    build(version)
    with tempfile.TemporaryDirectory(prefix="release-check-") as workdir:
        bake_against(version, pathlib.Path(workdir))
    changelog = (REPO / "CHANGELOG.md").read_text()
    (DIST / "RELEASE_NOTES.md").write_text(section(changelog, version))
    print(f"dist/: detectorkit {version}'s wheel and sdist, checked; a default bake installs and tests them")


def release(version: str, day: datetime.date, checked: bool = True) -> None:
    parse(version)
    if run("git", "status", "--porcelain").strip():
        raise ReleaseError("the working tree has changes: commit or stash them first")
    if run("git", "tag", "--list", f"v{version}").strip():
        raise ReleaseError(f"tag v{version} exists: choose the next version")
    last = last_release((REPO / "CHANGELOG.md").read_text())
    if parse(version) <= parse(last):
        raise ReleaseError(f"VERSION={version} is not after the last release, {last}")
    set_version(version, day)
    try:
        if checked:
            check(version)
    except BaseException:
        run("git", "checkout", "--", ".")  # the files as they were: nothing half-released
        raise
    run("git", "commit", "-q", "-am", f"Release {version}")
    notes = section((REPO / "CHANGELOG.md").read_text(), version)
    run("git", "tag", "-a", "--cleanup=verbatim", f"v{version}", "-m", f"detectorkit and the template {version}\n\n{notes}")
    print(f"v{version} tagged. Publish it: git push origin HEAD v{version} (the release workflow uploads dist/)")


def tagged_version() -> str:
    """The version of the tag at HEAD, which the release workflow builds."""
    tags = [t for t in run("git", "tag", "--points-at", "HEAD").split() if SEMVER.match(t.removeprefix("v")) and t.startswith("v")]
    if not tags:
        raise ReleaseError("no vX.Y.Z tag at HEAD: `make release VERSION=X.Y.Z` makes one")
    return tags[0].removeprefix("v")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("release", help="write the release, check it, commit and tag it")
    make.add_argument("version")
    make.add_argument("--no-check", action="store_true", help="skip building and checking the artifacts")
    sub.add_parser("check", help="build dist/ from the tag at HEAD and check it")
    args = parser.parse_args(argv)
    try:
        if args.command == "release":
            release(args.version, datetime.date.today(), checked=not args.no_check)
        else:
            check(tagged_version())
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
