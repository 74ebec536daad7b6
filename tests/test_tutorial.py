"""The tutorial (docs/tutorial.md), run as a reader runs it: every shell block from "Your first
detector" on, in order, in one shell, in a directory of its own, with this checkout as TEMPLATE.
A command that no longer works, or a step whose output is no longer what the page says, fails here."""

import os
import pathlib
import re
import subprocess
import sys

from test_deploy import HELM, go_installed

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "tutorial.md"
FIRST = "## Your first detector"


def tutorial_blocks() -> list[str]:
    text = PAGE.read_text()
    return re.findall(r"^```bash\n(.*?)^```", text[text.index(FIRST) :], re.S | re.M)


def test_the_tutorial_has_every_step():
    steps = re.findall(r"^### \d\. (.*)$", PAGE.read_text(), re.M)
    assert [s.split()[0] for s in steps] == ["Bake", "Write", "Test", "Backtest", "Run", "Shadow", "Deploy"], steps
    assert len(tutorial_blocks()) == 7


def test_the_tutorial_runs_from_bake_to_deploy(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "DETECTOR_", "SPARK_", "PYTEST_"))}
    # The checkout's venv is the one a reader set up with `make setup`; this test runs in it.
    env.update(TEMPLATE=str(REPO), PATH=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{env['PATH']}")
    # The chart from this checkout, not a registry; helm as the deploy tests build it.
    env.update(HELM=str(go_installed(HELM)), CHART=str(REPO / "deploy" / "helm" / "detectorkit-job"))
    # The broker a step starts in the background ends with the shell.
    script = "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + "\n".join(tutorial_blocks())
    run = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    out = run.stdout
    assert run.returncode == 0, out[-4000:] + run.stderr[-4000:]
    service = tmp_path / "card-bursts"

    # 3: the rule's own tests ran, the Strimzi resources written again.
    assert re.search(r"= 5 passed", out) and " failed" not in out, out[-3000:]
    # 4: the ten customers who made bursts are the ones flagged, and only they.
    assert re.search(r"labels by key: 10 labelled, 10 flagged, 10 both: precision 1\.000, recall 1\.000", out), out[-3000:]
    # 5: the live run read every payment and wrote its detections, which `tail` printed.
    stopped = [line for line in (service / "run.log").read_text().splitlines() if '"job stopped"' in line]
    assert stopped and '"records": 3600' in stopped[-1] and '"detections": 10' in stopped[-1], stopped
    # `tail` prints each detection as JSON in a JSON line: quoted, whatever the spacing.
    assert len(re.findall(r'\\?"service\\?":\s*\\?"card-bursts\\?"', out)) >= 2, out[-3000:]
    # 6: the shadow ran as its own service, and the diff set its answers beside the live ones.
    assert '"service": "card-bursts-shadow"' in (service / "shadow.log").read_text()
    assert "B: topic:detections.shadow" in out and "compared: 20" in out, out[-3000:]
    # 7: what `make deploy` would apply.
    assert int(out.strip().splitlines()[-1]) >= 5, out[-1000:]
