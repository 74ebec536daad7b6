"""Every Python block of the README and the docs runs as written (with the imports a detector's file
has), so none drifts from the API: a renamed window, aggregate or argument fails here."""

import argparse
import json
import pathlib
import re
import runpy
import shlex
import textwrap
from unittest import mock

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# What a detector's file imports, and the Config a snippet's `config` stands for.
PREAMBLE = """
from dataclasses import dataclass, field
import numpy as np
import pandas as pd
from detectorkit import Detector, State, models, patterns, windows

@dataclass(frozen=True)
class Config:
    threshold: float = 1000.0
    min_amount: float = 1000.0
"""


def python_blocks():
    for page in PAGES:
        text = page.read_text()
        for block in re.finditer(r"^([ \t]*)```python\n(.*?)^[ \t]*```", text, re.S | re.M):
            line = text[: block.start()].count("\n") + 1
            yield pytest.param(textwrap.dedent(block.group(2)), id=f"{page.relative_to(ROOT)}:{line}")


BLOCKS = list(python_blocks())


def test_the_docs_have_python_blocks():
    assert len(BLOCKS) >= 6


@pytest.mark.parametrize("code", BLOCKS)
def test_each_python_block_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # what a block saves (a model, an MLflow store) stays the test's
    namespace = {}
    exec(compile(PREAMBLE, "preamble", "exec"), namespace)
    exec(compile(code, "block", "exec"), namespace)


def test_the_changelog_keeps_a_changelogs_shape():
    """Keep a Changelog: a section per version (Unreleased first), its changes under the six kinds,
    and since the last release a line per change (the why is in git)."""
    text = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## (.*)$", text, re.M)
    assert versions[0] == "[Unreleased]" and all(re.fullmatch(r"\[\d+\.\d+\.\d+\] - \d{4}-\d{2}-\d{2}", v) for v in versions[1:]), versions
    kinds = set(re.findall(r"^### (.*)$", text, re.M))
    assert kinds <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, kinds
    unreleased = text.split("\n## ", 2)[1]
    entries = [line for line in unreleased.splitlines() if line and not line.startswith(("[Unreleased]", "### "))]
    # Empty just after a release (scripts/release.py moves its entries under the version).
    assert all(line.startswith("- ") for line in entries), [line for line in entries if not line.startswith("- ")]


# ---- shell blocks ---------------------------------------------------------------------------------
# The tutorial's run in order (test_tutorial.py). The others start brokers, clusters or benchmarks of
# minutes each; each of their commands is resolved instead: a make target must exist, a script be
# there, and the project's own commands parse their arguments with their real parsers.
EXTERNAL = {"cd", "git", "prometheus", "kubectl", "kafka-console-consumer.sh", "spark-submit"}
MAKEFILES = [ROOT / "Makefile", ROOT / "{{cookiecutter.service_name}}" / "Makefile"]
# The services the pages run, as baked commands (`python -m` their packages).
SERVICES = {"high-value-orders": "card_velocity.py", "quiet-customers": "customer_silence.py", "fraud-score": None}


def shell_blocks():
    for page in PAGES:
        if page.name == "tutorial.md":
            continue
        text = page.read_text()
        for block in re.finditer(r"^([ \t]*)```bash\n(.*?)^[ \t]*```", text, re.S | re.M):
            line = text[: block.start()].count("\n") + 1
            yield pytest.param(textwrap.dedent(block.group(2)), id=f"{page.relative_to(ROOT)}:{line}")


def commands(block: str):
    """Each command of a block as words: continuation lines joined, comments and variables dropped."""
    for line in block.replace("\\\n", " ").splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        for command in filter(None, (c.strip() for c in line.split("&&"))):
            words = shlex.split(command)
            while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                words.pop(0)
            if words:
                yield words


class Parsed(Exception):
    """Raised where the command would start its work: its arguments parsed."""


def parses(call, argv: list[str]) -> None:
    """`call(argv)` up to its last parser: SystemExit there is a wrong flag or value."""
    original = argparse.ArgumentParser.parse_known_args

    def parse_known_args(self, args=None, namespace=None):
        parsed, rest = original(self, args, namespace)
        if not rest:
            raise Parsed
        return parsed, rest

    with mock.patch.object(argparse.ArgumentParser, "parse_known_args", parse_known_args), pytest.raises(Parsed):
        call(argv)


def check(words: list[str]) -> None:
    program, args = words[0].removeprefix(".venv/bin/"), words[1:]
    if program in EXTERNAL:
        return
    if program == "make":
        targets = [w for w in args if not w.startswith("-") and "=" not in w]
        known = {t for m in MAKEFILES for t in re.findall(r"^([\w-]+):", m.read_text(), re.M)}
        assert targets and set(targets) <= known, f"make {' '.join(args)}: no such target in {[str(m) for m in MAKEFILES]}"
    elif program == "cookiecutter":
        answers = json.loads((ROOT / "cookiecutter.json").read_text())
        for key, value in (a.split("=", 1) for a in args if "=" in a):
            assert key in answers and (not isinstance(answers[key], list) or value in answers[key]), f"cookiecutter answer {key}={value}"
    elif program == "detectorkit":
        from detectorkit.cli.main import main

        parses(main, args)
    elif program in SERVICES:
        from detectorkit.cli.run import run_detector

        # The cookbook's rule stands in for the bake's: a service's command line is the same for all.
        # A model detector's (its flags are a model's) scores three fields.
        if SERVICES[program] is None:
            from detectorkit import models

            detector = models.detector(name=program, features=("amount", "items", "hour"))
        else:
            detector = runpy.run_path(str(ROOT / "examples" / SERVICES[program]))["DETECTOR"]
        parses(lambda argv: run_detector(detector, argv), args)
    elif program == "python" and args[0] == "-m":
        module = args[1].replace("_", "-")
        assert module in SERVICES, f"python -m {args[1]}: not a service the pages name"
    elif program in ("python", "bash") or program.startswith("scripts/"):
        script = args[0] if program in ("python", "bash") else program
        assert (ROOT / script).is_file(), f"{script}: not in the repository"
        if script == "bench/handover.py":
            names = runpy.run_path(str(ROOT / script), run_name="docs")["SCENARIOS"]
            assert {a for a in args[1:] if not a.startswith("-") and a not in ("kafka", "tansu")} <= set(names), args
    elif program == "pytest":
        assert all((ROOT / a).exists() for a in args if not a.startswith("-")), args
    else:
        raise AssertionError(f"{' '.join(words)}: a command this test does not know how to check (add it to check())")


SHELL = list(shell_blocks())


def test_the_docs_have_shell_blocks():
    assert len(SHELL) >= 10


@pytest.mark.parametrize("block", SHELL)
def test_each_shell_command_resolves(block):
    for words in commands(block):
        check(words)


def test_the_readme_is_a_front_door_whose_links_all_lead_somewhere():
    """At most 10 KB (the docs hold the rest), and each of its links to a file of this repository
    is there: the README is not part of the site, whose build checks its own links."""
    readme = ROOT / "README.md"
    assert readme.stat().st_size <= 10_000, f"README.md is {readme.stat().st_size} bytes: move the detail into docs/"
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme.read_text())
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert local and not [link for link in local if not (ROOT / link).exists()]
