"""The deployment kit, checked by real tools since Docker and Kubernetes do not run here: the alert
rules by promtool (checked and unit-tested), the Prometheus configurations by promtool, the Compose
file against the Compose specification, the Kubernetes manifests (the repository's and a baked
detector's) against the schemas of a pinned Kubernetes version and KEDA's own CRD, the Dockerfiles
for what makes them portable and safe."""

from __future__ import annotations

import io
import os
import pathlib
import re
import shutil
import subprocess
import sys
import urllib.request
import zipfile

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
KUBERNETES = "1.31.0"
# KEDA's ScaledObject schema, from the Go module proxy the way a Go user gets KEDA's source.
KEDA = "v2.16.1"
KEDA_CRD = "config/crd/bases/keda.sh_scaledobjects.yaml"

promtool = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(promtool is None, reason="promtool is not installed (apt-get install prometheus)")


def run(*command, cwd=None):
    result = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@needs_promtool
def test_alert_rules_pass_promtool_and_their_unit_tests():
    run(promtool, "check", "rules", DEPLOY / "prometheus" / "alerts.yml")
    out = run(promtool, "test", "rules", "alerts_test.yml", cwd=DEPLOY / "prometheus")
    assert "SUCCESS" in out


@needs_promtool
@pytest.mark.parametrize("config", ["prometheus.yml", "prometheus-compose.yml", "prometheus-k8s.yml"])
def test_prometheus_configurations_are_valid_and_load_the_alert_rules(config):
    out = run(promtool, "check", "config", DEPLOY / "prometheus" / config)
    assert "7 rules found" in out


def test_every_alert_has_a_test_that_fires_it():
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    names = {r["alert"] for group in rules["groups"] for r in group["rules"]}
    tests = yaml.safe_load((DEPLOY / "prometheus" / "alerts_test.yml").read_text())
    fired = {case["alertname"] for t in tests["tests"] for case in t["alert_rule_test"] if case["exp_alerts"]}
    assert names == fired


def test_compose_file_follows_the_compose_specification():
    run(sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", DEPLOY / "compose.yaml")


def test_compose_mounts_what_exists_and_gives_every_job_settings_it_accepts():
    from detectorkit.settings import load

    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name} mounts {source}, which is not in deploy/"
        env = {k: str(v) for k, v in service.get("environment", {}).items()}
        if "KAFKA_BOOTSTRAP_SERVERS" in env:  # a streaming job: detectorkit must accept its settings
            load(environ={k: v for k, v in env.items() if not k.startswith(("DETECTOR_", "NOTIFIER_"))})
    # The Prometheus there scrapes the aggregator by its service name, on its port.
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus-compose.yml").read_text())
    assert prometheus["scrape_configs"][0]["static_configs"][0]["targets"] == ["aggregator:9108"]
    assert "9108:9108" in compose["services"]["aggregator"]["ports"]


@pytest.fixture(scope="module")
def keda_schema():
    """KEDA's ScaledObject openAPIV3Schema, from its Go module at a pinned version (cached)."""
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "detectorkit" / f"keda-{KEDA}.yaml"
    if not cache.exists():
        url = f"https://proxy.golang.org/github.com/kedacore/keda/v2/@v/{KEDA}.zip"
        with urllib.request.urlopen(url, timeout=120) as response:
            archive = zipfile.ZipFile(io.BytesIO(response.read()))
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_bytes(archive.read(f"github.com/kedacore/keda/v2@{KEDA}/{KEDA_CRD}"))
    crd = yaml.safe_load(cache.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return version["schema"]["openAPIV3Schema"]


@pytest.fixture(scope="module")
def baked_manifests(tmp_path_factory):
    from cookiecutter.main import cookiecutter

    project = pathlib.Path(cookiecutter(str(REPO), no_input=True, output_dir=str(tmp_path_factory.mktemp("bake")),
                                        extra_context={"service_name": "high-value-orders"}))
    return project / "deploy" / "k8s"


def documents(folder: pathlib.Path):
    for path in sorted(folder.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path.name, doc


def test_kubernetes_manifests_validate_against_pinned_schemas(baked_manifests, keda_schema):
    import jsonschema
    import kubernetes_validate

    seen = []
    for name, doc in [*documents(DEPLOY / "k8s"), *documents(baked_manifests)]:
        if doc["kind"] == "ScaledObject":
            jsonschema.validate(doc, keda_schema)
        else:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        seen.append((name, doc["kind"]))
    kinds = {kind for _, kind in seen}
    assert {"Deployment", "Service", "PodDisruptionBudget", "ScaledObject"} <= kinds, seen


def test_a_wrong_manifest_is_refused(keda_schema):
    # The checks above can fail: a misspelt field and a lag threshold of the wrong type.
    import jsonschema
    import kubernetes_validate

    deployment = next(doc for _, doc in documents(DEPLOY / "k8s") if doc["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 180
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "x"},
                             "spec": {"scaleTargetRef": {"name": "x"}, "minReplicaCount": "one", "triggers": []}}, keda_schema)


def test_each_detector_deployment_is_wired_to_its_group_probes_and_budget(baked_manifests):
    docs = dict((doc["kind"], doc) for _, doc in documents(baked_manifests))
    deployment, pdb, scaled = docs["Deployment"], docs["PodDisruptionBudget"], docs["ScaledObject"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    # Longer than a batch: the job finishes and commits its batch in flight on SIGTERM.
    assert pod["terminationGracePeriodSeconds"] >= 120
    assert {"startupProbe", "readinessProbe", "livenessProbe", "resources"} <= set(container)
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready" and container["livenessProbe"]["httpGet"]["path"] == "/live"
    assert env["HEALTH_PORT"] == str(container["ports"][0]["containerPort"])
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # KEDA reads the lag of the group the job commits to, on the topic it reads.
    trigger = scaled["spec"]["triggers"][0]["metadata"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert (trigger["consumerGroup"], trigger["topic"]) == (env["CONSUMER_GROUP"], env["INPUT_TOPIC"])


@pytest.mark.parametrize("dockerfile", ["{{cookiecutter.service_name}}/Dockerfile", "deploy/docker/Dockerfile"])
def test_dockerfiles_run_on_any_architecture_as_a_non_root_user_with_a_health_check(dockerfile):
    text = "\n".join(line for line in (REPO / dockerfile).read_text().splitlines() if not line.lstrip().startswith("#"))
    assert not re.search(r"amd64|arm64|x86_64|aarch64", text), "an architecture's path in the image"
    assert "JAVA_HOME=/usr/lib/jvm/default-java" in text and "default-jre-headless" in text
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0"), users
    assert re.search(r"^HEALTHCHECK ", text, re.M)
