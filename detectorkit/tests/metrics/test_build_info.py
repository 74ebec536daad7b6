"""`detector_build_info`: every instance says which versions it runs, and the aggregator counts the
instances of each combination."""

import platform
from importlib import metadata

import pyspark
import pytest
from prometheus_client import generate_latest

from detectorkit.metrics import build_info
from detectorkit.metrics import snapshot as snap
from detectorkit.metrics.aggregator import Aggregator
from detectorkit.metrics.registry import JobMetrics
from detectorkit.roles.normaliser import Normaliser
from detectorkit.runtime.stage import as_stage

from ..detectors import THRESHOLD

pytestmark = pytest.mark.unit


def test_a_detector_reports_its_service_detectorkit_pyspark_and_python_versions():
    package = build_info.package_of(as_stage(THRESHOLD))
    assert package == "tests"  # the test detectors' package, run from a checkout: no installed version
    metrics = JobMetrics(process_tree=False, build=build_info.versions(package))
    expected = (
        f'detector_build_info{{detectorkit="{metadata.version("detectorkit")}",pyspark="{pyspark.__version__}",'
        f'python="{platform.python_version()}",version="unknown"}} 1.0'
    )
    assert expected in generate_latest(metrics.registry).decode()


def test_a_role_is_versioned_as_detectorkit():
    assert build_info.package_of(Normaliser()) == "detectorkit"
    assert build_info.versions("detectorkit")["version"] == metadata.version("detectorkit")


def test_the_aggregator_counts_the_instances_of_each_version():
    agg = Aggregator()
    for instance, version in (("a", "1.0"), ("b", "1.0"), ("c", "1.1")):
        metrics = JobMetrics(process_tree=False, build={**build_info.versions(None), "version": version})
        found = snap.from_registry(metrics.registry, "svc", instance, 100.0, 110.0, metrics.aggregations)
        agg.apply(instance.encode(), found.to_json())
    running = {dict(labels)["version"]: n for (name, labels), n in agg.totals(115.0)["svc"].items() if name == "detector_build_info"}
    assert running == {"1.0": 2, "1.1": 1}
