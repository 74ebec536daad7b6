"""deploy/strimzi/strimzi.yaml is what the service would ask Strimzi for now: its topics and its
user's rights and authentication follow its detector (the state's changelog), its topics, and the
guarantee and authentication it is deployed with (deploy/values.yaml, deploy/strimzi/values.yaml).
After changing any of them, `make kafka-manifests` writes the file again."""

import os
import pathlib
import subprocess
import sys

import yaml

PROJECT = pathlib.Path(__file__).resolve().parents[1]


def test_the_strimzi_resources_are_what_the_service_would_write_now():
    committed = list(yaml.safe_load_all((PROJECT / "deploy" / "strimzi" / "strimzi.yaml").read_text()))
    cluster = committed[0]["metadata"]["labels"]["strimzi.io/cluster"]
    guarantee = yaml.safe_load((PROJECT / "deploy" / "values.yaml").read_text())["processingGuarantee"]
    layer = yaml.safe_load((PROJECT / "deploy" / "strimzi" / "values.yaml").read_text())
    authentication = layer["kafka"]["strimziAuthentication"]
    settings = ("DETECTOR_", "KAFKA_", "PROCESSING_", "INPUT_", "OUTPUT_", "DLQ_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(settings)}
    env["PROCESSING_GUARANTEE"] = guarantee
    printed = subprocess.run(
        [
            sys.executable,
            "-m",
            "{{ cookiecutter.package_name }}",
            "kafka-manifests",
            "--cluster",
            cluster,
            "--authentication",
            authentication,
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    stale = "deploy/strimzi/strimzi.yaml is out of date: run make kafka-manifests"
    assert list(yaml.safe_load_all(printed)) == committed, stale
