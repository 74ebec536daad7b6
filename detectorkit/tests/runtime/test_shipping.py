"""What a job ships to a cluster's executors: the packages its stage is made of, importable from zips."""

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from detectorkit.detector import Detector
from detectorkit.runtime import shipping
from detectorkit.runtime.stage import as_stage

from ..detectors import THRESHOLD


def test_a_detectors_stage_ships_detectorkit_and_the_detectors_own_package():
    assert shipping.stage_packages(as_stage(THRESHOLD)) == ["detectorkit", "tests"]


def test_what_detectorkit_depends_on_is_not_shipped():
    # The workers' environment has it, like PySpark; shipping it would shadow theirs.
    for fn in (pd.DataFrame.head, np.asarray):  # a dependency, a dependency's dependency
        assert shipping.stage_packages(as_stage(Detector(name="borrowed", detect=fn))) == ["detectorkit"]


def test_a_service_installed_in_site_packages_is_shipped_all_the_same():
    # A service's image installs it like any package; the workers still lack it. (pytest stands in
    # for it: installed in site-packages, and no dependency of detectorkit.)
    stage = as_stage(Detector(name="installed", detect=pytest.approx))
    assert shipping.stage_packages(stage) == ["_pytest", "detectorkit"]


def test_a_shipped_zip_is_imported_with_its_data_files(tmp_path):
    zipped = shipping.package_zip("detectorkit", tmp_path)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import detectorkit.runtime.slices, detectorkit; "
        "from importlib import resources; print(detectorkit.__file__); "
        "print(resources.files('detectorkit.runtime').joinpath('log4j2.properties').read_text()[:1])"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-c", code, str(zipped)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    where, data = run.stdout.splitlines()
    assert where.startswith(str(zipped)) and data == "#"


def test_zips_are_put_on_pythonpath_for_the_drivers_own_python_processes(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    zips = shipping.zip_packages(["detectorkit"])
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(zips[0]), "/elsewhere"]
