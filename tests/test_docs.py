"""Every Python block of the README and the docs runs as written (with the imports a detector's file
has), so none drifts from the API: a renamed window, aggregate or argument fails here."""

import pathlib
import re
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# What a detector's file imports, and the Config a snippet's `config` stands for.
PREAMBLE = """
from dataclasses import dataclass, field
import numpy as np
import pandas as pd
from detectorkit import Detector, State, patterns, windows

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
def test_each_python_block_runs(code):
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
    assert entries and all(line.startswith("- ") for line in entries), [line for line in entries if not line.startswith("- ")]
