"""The baked README's rules run and detect what it says they do: its code, executed."""

import pathlib
import re

import pandas as pd
import pytest

from detectorkit.testing import DetectorHarness


def rules_of(readme: str) -> dict:
    """What the README's "Rules first" code block defines, executed."""
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "CARD_VELOCITY" in b]
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - the README's own example, as a reader would run it
    return namespace


def records(rows):
    """rows: (seconds after noon, fields...)"""
    noon = pd.Timestamp("2026-11-02T12:00:00Z")
    return pd.DataFrame([{"ts": (noon + pd.Timedelta(seconds=s)).isoformat(), **fields} for s, fields in rows])


@pytest.mark.parametrize("kind", ["threshold", "burst"])
def test_the_readmes_rules_detect_what_it_says_they_do(cookies, kind):
    result = cookies.bake(extra_context={"detector_kind": kind})
    assert result.exit_code == 0, result.exception
    rules = rules_of((pathlib.Path(result.project_path) / "README.md").read_text())

    card = DetectorHarness(rules["CARD_VELOCITY"])
    card.batch(records([(60 * m, {"card": "k-1", "currency": "EUR", "amount": 1500.0}) for m in range(7)]))
    card.advance(pd.Timestamp("2026-11-02T14:00:00Z"))
    (burst,) = card.take_fired().to_dict(orient="records")
    assert burst["count"] == 7  # seven within 10 minutes, one detection

    totals = DetectorHarness(rules["MERCHANT_TOTALS"])
    totals.batch(
        records([(s, {"merchant": "m-1", "amount": 1000.0}) for s in range(51)] + [(s, {"merchant": "m-2", "amount": 1000.0}) for s in range(50)])
    )
    totals.advance(pd.Timestamp("2026-11-02T12:10:00Z"))
    assert totals.take_fired()[["payments", "total"]].to_dict(orient="index") == {"m-1": {"payments": 51, "total": 51_000.0}}

    sequence = DetectorHarness(rules["RESET_THEN_TRANSFER"])
    found = sequence.batch(
        records([(0, {"customer": "c-1", "type": "password_reset", "amount": 0.0}), (300, {"customer": "c-1", "type": "transfer", "amount": 2500.0})])
    )
    assert found["key"].tolist() == ["c-1"]
