"""The deployment kit, checked by real tools since Docker and Kubernetes do not run here: the alert
rules by promtool (checked and unit-tested), the Prometheus configurations by promtool, the Compose
file against the Compose specification, detectorkit's Helm chart by helm itself (lint, and the
manifests it renders for a baked detector, its shadow and Strimzi layers, and the shared jobs) and
those manifests against the schemas of a pinned Kubernetes version and KEDA's own CRDs and against
the restricted Pod Security Standard by the Pod Security Admission's own code, the Dockerfiles for
what makes them portable and safe."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
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
# The newest Kubernetes whose schemas kubernetes-validate ships.
KUBERNETES = "1.37.0"
# KEDA's CRDs, from the Go module proxy the way a Go user gets KEDA's source.
KEDA = "v2.21.0"
# The Prometheus Operator's CRDs (a PodMonitor per service), the same way.
PROMETHEUS_OPERATOR = "v0.85.0"
# kind -> (Go module, version, the CRD's path in the module, the CRD version the kit uses)
CRDS = {
    "ScaledObject": ("github.com/kedacore/keda/v2", KEDA, "config/crd/bases/keda.sh_scaledobjects.yaml", "v1alpha1"),
    "TriggerAuthentication": ("github.com/kedacore/keda/v2", KEDA, "config/crd/bases/keda.sh_triggerauthentications.yaml", "v1alpha1"),
    "PodMonitor": (
        "github.com/prometheus-operator/prometheus-operator",
        PROMETHEUS_OPERATOR,
        "example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml",
        "v1",
    ),
    "PrometheusRule": (
        "github.com/prometheus-operator/prometheus-operator",
        PROMETHEUS_OPERATOR,
        "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml",
        "v1",
    ),
    "AlertmanagerConfig": (
        "github.com/prometheus-operator/prometheus-operator",
        PROMETHEUS_OPERATOR,
        "example/prometheus-operator-crd/monitoring.coreos.com_alertmanagerconfigs.yaml",
        "v1alpha1",
    ),
}
CACHE = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "detectorkit"
# The Pod Security Admission's checks in a small Go program (`make tools` builds it first).
PSA_CHECK_SOURCE = REPO / "tests" / "tools" / "psa-check"
# kustomize builds the Grafana dashboard's ConfigMap (`kubectl apply -k` runs the same code).
KUSTOMIZE = "sigs.k8s.io/kustomize/kustomize/v5@v5.7.1"
# helm renders and lints the fleet's chart, deploy/helm/detectorkit-job, at the Makefile's pin.
HELM = re.search(r"^HELM_MODULE = (\S+)$", (REPO / "Makefile").read_text(), re.M)[1]
CHART = DEPLOY / "helm" / "detectorkit-job"
SHARED_VALUES = DEPLOY / "helm" / "values"
# Not jobs: where every shared job reaches Kafka, and how on Strimzi (layered under a job's values).
SHARED_LAYERS = {"kafka", "strimzi"}
SHARED_JOBS = ("normaliser", "notifier", "aggregator")

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
            settings = load(environ={k: v for k, v in env.items() if not k.startswith(("DETECTOR_", "NOTIFIER_"))})
            # Deployed on Apache Kafka, every job of the diamond runs exactly-once (README, "Exactly-once").
            assert settings.exactly_once, f"{name} runs at-least-once"
    # The Prometheus there scrapes the aggregator by its service name, on its port.
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus-compose.yml").read_text())
    assert prometheus["scrape_configs"][0]["static_configs"][0]["targets"] == ["aggregator:9108"]
    assert "9108:9108" in compose["services"]["aggregator"]["ports"]
    # Its alerts go to the Alertmanager there, which reads the routing example beside the rules.
    assert prometheus["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    alertmanager = compose["services"]["alertmanager"]
    assert "9093:9093" in alertmanager["ports"] and "alertmanager" in compose["services"]["prometheus"]["depends_on"]
    mount = next(v for v in alertmanager["volumes"] if v.split(":")[1] == "/etc/alertmanager")
    config = alertmanager["command"][0].split("=", 1)[1]
    assert (DEPLOY / mount.split(":")[0] / pathlib.Path(config).relative_to("/etc/alertmanager")).is_file()


@pytest.fixture(scope="module")
def crd_schemas():
    """The openAPIV3Schema of each CRD the kits use (KEDA's, the Prometheus Operator's), by kind,
    from their Go modules at pinned versions (cached)."""
    schemas = {}
    archives: dict[str, zipfile.ZipFile] = {}
    for kind, (module, version, crd, served) in CRDS.items():
        cached = CACHE / f"{module.split('/')[2]}-{version}-{pathlib.PurePosixPath(crd).name}"
        if not cached.exists():
            if module not in archives:
                with urllib.request.urlopen(f"https://proxy.golang.org/{module.lower()}/@v/{version}.zip", timeout=120) as response:
                    archives[module] = zipfile.ZipFile(io.BytesIO(response.read()))
            CACHE.mkdir(parents=True, exist_ok=True)
            cached.write_bytes(archives[module].read(f"{module}@{version}/{crd}"))
        (found,) = [v for v in yaml.load(cached.read_text(), Loader=KubeLoader)["spec"]["versions"] if v["name"] == served]
        schemas[kind] = strict(python_patterns(found["schema"]["openAPIV3Schema"]))
    return schemas


def python_pattern(pattern: str) -> str:
    return "(?i)" + pattern.replace("(?i)", "") if "(?i)" in pattern else pattern


class KubeLoader(yaml.SafeLoader):
    """YAML as Kubernetes reads it (1.2): a bare `=` (a matcher of the Operator's, as kustomize and
    its CRDs write it) is a string, not YAML 1.1's value tag."""

    yaml_implicit_resolvers = {
        first: [r for r in resolvers if r[0] != "tag:yaml.org,2002:value"] for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }


def python_patterns(schema):
    """The schema's patterns as Python's re reads them: Go's RE2 takes a flag group anywhere
    (`^((?i)january|...)`, in the Prometheus Operator's CRDs), Python only at the start, so such a
    pattern is read case-insensitive throughout (looser than RE2's only where case matters)."""
    if isinstance(schema, dict):
        return {k: python_pattern(v) if k == "pattern" and isinstance(v, str) else python_patterns(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [python_patterns(v) for v in schema]
    return schema


def strict(schema):
    """The schema refusing fields it does not name, as `kubectl apply` does (field validation Strict):
    a CRD's own schema would let a misspelt field through, and the API server would refuse it."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [strict(item) for item in schema]
    return schema


@pytest.fixture(scope="session")
def psa_check():
    """The psa-check binary: the Pod Security Admission's own checks (k8s.io/pod-security-admission),
    built from tests/tools/psa-check with Go (modules from the Go module proxy) and cached; a build
    with nothing changed takes a second or two."""
    binary = CACHE / "psa-check"
    go_build("tests/tools/psa-check", [go_tool(), "build", "-trimpath", "-buildvcs=false", "-o", str(binary), "."], cwd=PSA_CHECK_SOURCE)
    return binary


def go_installed(module: str) -> pathlib.Path:
    """A Go command installed from the module proxy at a pinned version, and cached."""
    # Go names the command after the path's last element that is not a major version (.../v5).
    name = next(part for part in reversed(module.rsplit("@", 1)[0].split("/")) if not re.fullmatch(r"v\d+", part))
    binary = CACHE / f"{name}-{module.rsplit('@', 1)[1]}"
    if not binary.exists():
        go_build(module, [go_tool(), "install", module], env={**os.environ, "GOBIN": str(CACHE)})
        (CACHE / name).rename(binary)
    return binary


@pytest.fixture(scope="session")
def kustomize():
    return go_installed(KUSTOMIZE)


@pytest.fixture(scope="session")
def helm():
    return go_installed(HELM)


def go_tool() -> str:
    go = shutil.which("go")
    if go is None:
        if os.environ.get("CI"):
            pytest.fail("go is not installed: CI must build the tools that check the Kubernetes manifests")
        pytest.skip("go is not installed: the Pod Security check and kustomize are built with it")
    return go


def go_build(what: str, command: list[str], **kwargs) -> None:
    build = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if build.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"{what} did not build: {build.stderr}")
        pytest.skip(f"{what} did not build (offline? its modules come from the Go module proxy): {build.stderr.strip()}")


def bake(output: pathlib.Path, **answers) -> pathlib.Path:
    from cookiecutter.main import cookiecutter

    return pathlib.Path(cookiecutter(str(REPO), no_input=True, output_dir=str(output), extra_context=answers))


def split_rendered(text: str, folder: pathlib.Path, prefix: str = "") -> pathlib.Path:
    """helm's output as one file per template (`# Source: <chart>/templates/<file>`), comments kept."""
    parts = re.split(r"^---\n# Source: [^/]+/templates/(\S+)\n", text, flags=re.M)
    assert parts[0].strip() in ("", "---"), parts[0]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        (folder / f"{prefix}{name}").write_text(body)
    return folder


def rendered(project: pathlib.Path, helm, folder: pathlib.Path, layer: str = "") -> pathlib.Path:
    """What the bake's `make manifests [LAYER=...]` renders, with the chart from this repository."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    command = ["make", "--no-print-directory", "manifests", f"CHART={CHART}", f"HELM={helm}", f"LAYER={layer}"]
    made = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    return split_rendered(made.stdout, folder)


@pytest.fixture(scope="module")
def baked_project(tmp_path_factory):
    return bake(tmp_path_factory.mktemp("bake"), service_name="high-value-orders")


@pytest.fixture(scope="module")
def baked_manifests(baked_project, helm, tmp_path_factory):
    """The baked detector as `make deploy` would apply it."""
    return rendered(baked_project, helm, tmp_path_factory.mktemp("live"))


@pytest.fixture(scope="module")
def shadow_manifests(baked_project, helm, tmp_path_factory):
    """The baked detector's shadow (`make deploy LAYER=shadow`)."""
    return rendered(baked_project, helm, tmp_path_factory.mktemp("shadow"), layer="shadow")


@pytest.fixture(scope="module")
def shared_manifests(helm, tmp_path_factory):
    """The diamond's shared jobs (normaliser, notifier, metrics-aggregator), from the same chart."""
    folder = tmp_path_factory.mktemp("shared")
    for values in sorted(SHARED_VALUES.glob("*.yaml")):
        if values.stem in SHARED_LAYERS:
            continue
        command = [helm, "template", values.stem, CHART, "-f", SHARED_VALUES / "kafka.yaml", "-f", values]
        split_rendered(run(*command), folder, prefix=f"{values.stem}.")
    return folder


def documents(folder: pathlib.Path):
    for path in sorted(folder.glob("*.yaml")):
        for doc in yaml.load_all(path.read_text(), Loader=KubeLoader):
            if doc:
                yield path.name, doc


def manifests(*folders: pathlib.Path) -> dict[tuple[str, str], dict]:
    """The folders' objects by (kind, name); the same kind and name twice is an error."""
    found: dict[tuple[str, str], dict] = {}
    for folder in folders:
        for name, doc in documents(folder):
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in found, f"{name}: a second {key}"
            found[key] = doc
    return found


def shown(folder: pathlib.Path) -> str:
    return f"rendered {folder.name}"


def of_kind(objects: dict, kind: str) -> list[dict]:
    return [doc for (k, _), doc in objects.items() if k == kind]


def container_env(container: dict, configmaps: dict[str, dict], secrets: dict[str, dict]) -> dict[str, str]:
    """A container's environment as the kubelet gives it (and KEDA resolves it): a value, or a key of
    a ConfigMap or Secret; an optional key that is not there leaves the variable unset, a missing
    required one fails the pod's start (and the test)."""
    assert "envFrom" not in container, f"{container['name']}: envFrom hides which names the job gets; name each variable"
    env = {}
    for entry in container.get("env", []):
        source = entry.get("valueFrom")
        if source is None:
            env[entry["name"]] = entry["value"]
            continue
        ((kind, ref),) = source.items()
        data = {"configMapKeyRef": configmaps, "secretKeyRef": secrets}[kind].get(ref["name"])
        if data is not None and ref["key"] in data:
            env[entry["name"]] = data[ref["key"]]
        else:
            assert ref.get("optional"), f"{container['name']}: {entry['name']} needs {ref['name']}/{ref['key']}, which is not there"
    return env


def only_container(deployment: dict) -> dict:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


# What the process reads besides detectorkit's settings: where its temporary files go, and Python's.
PROCESS_ENV = {"TMPDIR", "HOME", "SPARK_LOCAL_DIRS", "PYTHONDONTWRITEBYTECODE"}
# A secured cluster's Secret (never in the repository): what the Deployments and KEDA read from it.
CREDENTIALS = {"KAFKA_SASL_USERNAME": "detector", "KAFKA_SASL_PASSWORD": "s3cret", "ca.crt": "-----BEGIN CERTIFICATE-----"}


def keda_spelling(security_protocol: str, sasl_mechanism: str | None) -> tuple[str, str]:
    """KEDA's Kafka scaler's tls and sasl for librdkafka's security.protocol and sasl.mechanism (the
    values KEDA's pkg/scalers/kafka_scaler.go accepts: tls enable or disable, sasl plaintext,
    scram_sha256 or scram_sha512 for SASL/PLAIN and SCRAM, empty for none)."""
    tls = "enable" if security_protocol.upper() in ("SSL", "SASL_SSL") else "disable"
    if not security_protocol.upper().startswith("SASL_"):
        return tls, ""
    return tls, {"PLAIN": "plaintext", "SCRAM-SHA-256": "scram_sha256", "SCRAM-SHA-512": "scram_sha512"}[sasl_mechanism]


def test_kubernetes_manifests_validate_against_pinned_schemas(baked_manifests, shadow_manifests, shared_manifests, crd_schemas):
    import jsonschema
    import kubernetes_validate

    seen = []
    for name, doc in [*documents(shared_manifests), *documents(baked_manifests), *documents(shadow_manifests)]:
        if doc["kind"] in crd_schemas:
            jsonschema.validate(doc, crd_schemas[doc["kind"]])
        else:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        seen.append((name, doc["kind"]))
    kinds = {kind for _, kind in seen}
    wanted = {"Deployment", "Service", "PodDisruptionBudget", "ConfigMap", "ScaledObject", "TriggerAuthentication"}
    wanted |= {"PodMonitor", "PrometheusRule", "AlertmanagerConfig"}
    assert wanted <= kinds, seen


def test_each_pod_monitor_scrapes_its_own_pods_metrics_where_the_job_serves_them(baked_manifests, shadow_manifests, crd_schemas):
    """Per pod, on the port the probes use, at /metrics (runtime/health.py): the live service's
    PodMonitor its pods only, the shadow's its own."""
    import jsonschema

    pods, monitors = {}, {}
    for folder in (baked_manifests, shadow_manifests):
        objects = manifests(folder)
        (monitor,) = of_kind(objects, "PodMonitor")
        (deployment,) = of_kind(objects, "Deployment")
        jsonschema.validate(monitor, crd_schemas["PodMonitor"])
        container = only_container(deployment)
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["path"] == "/metrics" and endpoint["port"] == container["livenessProbe"]["httpGet"]["port"], endpoint
        assert endpoint["port"] in {p["name"] for p in container["ports"]}
        assert monitor["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
        pods[folder] = deployment["spec"]["template"]["metadata"]["labels"]
        monitors[folder] = monitor["spec"]["selector"]["matchLabels"]
    for folder, selector in monitors.items():
        scraped = [other for other, labels in pods.items() if selector.items() <= labels.items()]
        assert scraped == [folder], f"{folder.name}'s PodMonitor selects the pods of {[f.name for f in scraped]}"


def test_a_wrong_manifest_is_refused(baked_manifests, shared_manifests, crd_schemas):
    # The checks above can fail: a misspelt field, a lag threshold of the wrong type, a misspelt
    # TriggerAuthentication field and one without the key it reads.
    import jsonschema
    import kubernetes_validate

    deployment = next(doc for _, doc in documents(shared_manifests) if doc["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 180
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            {
                "apiVersion": "keda.sh/v1alpha1",
                "kind": "ScaledObject",
                "metadata": {"name": "x"},
                "spec": {"scaleTargetRef": {"name": "x"}, "minReplicaCount": "one", "triggers": []},
            },
            crd_schemas["ScaledObject"],
        )
    (auth,) = of_kind(manifests(baked_manifests), "TriggerAuthentication")
    misspelt = {**auth, "spec": {"secretTargetRefs": auth["spec"]["secretTargetRef"]}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(misspelt, crd_schemas["TriggerAuthentication"])
    keyless = {**auth, "spec": {"secretTargetRef": [{"parameter": "username", "name": "x"}]}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(keyless, crd_schemas["TriggerAuthentication"])


def test_each_detector_deployment_is_wired_to_its_group_probes_and_budget(baked_manifests):
    docs = dict((doc["kind"], doc) for _, doc in documents(baked_manifests))
    deployment, pdb = docs["Deployment"], docs["PodDisruptionBudget"]
    pod = deployment["spec"]["template"]["spec"]
    container = only_container(deployment)
    env = {e["name"]: e.get("value") for e in container["env"]}
    # Longer than a batch: the job finishes and commits its batch in flight on SIGTERM.
    assert pod["terminationGracePeriodSeconds"] >= 120
    assert {"startupProbe", "readinessProbe", "livenessProbe", "resources"} <= set(container)
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready" and container["livenessProbe"]["httpGet"]["path"] == "/live"
    assert env["HEALTH_PORT"] == str(container["ports"][0]["containerPort"])
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # A rolling update starts the replacement before it stops an old pod.
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_every_job_gets_settings_detectorkit_accepts_as_a_dynamic_group_member(baked_manifests, shared_manifests, monkeypatch):
    """Each streaming job's environment, resolved from its ConfigMap and a secured cluster's Secret:
    every name one detectorkit reads (a misspelt one would be ignored without a word), values it
    accepts, and no INSTANCE_ID: a Deployment's pods get new names at every rollout, and a static
    member does not leave the group when it stops, so its partitions would wait for the session
    timeout at every rolling update."""
    from detectorkit.settings import Settings, kafka_options_from_env, load

    for folder in (baked_manifests, shared_manifests):
        objects = manifests(folder)
        configmaps = {doc["metadata"]["name"]: doc["data"] for doc in of_kind(objects, "ConfigMap")}
        secured = {
            name: {**data, "KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "KAFKA_SSL_CA_LOCATION": "/ca.crt"}
            for name, data in configmaps.items()
        }
        jobs = [d for d in of_kind(objects, "Deployment") if only_container(d).get("args", [""])[0] != "aggregate"]
        assert jobs, folder
        for deployment in jobs:
            container = only_container(deployment)
            where = f"{shown(folder)}: {deployment['metadata']['name']}"
            for entry in container["env"]:
                name = entry["name"]
                assert name.lower() in Settings.model_fields or kafka_options_from_env({name: "x"}) or name in PROCESS_ENV, (
                    f"{where}: {name} is not a setting detectorkit reads"
                )
            assert "INSTANCE_ID" not in {e["name"] for e in container["env"]}, f"{where}: INSTANCE_ID makes each pod a static member"
            secrets = {ref["secretKeyRef"]["name"]: CREDENTIALS for e in container["env"] if (ref := e.get("valueFrom", {})).get("secretKeyRef")}
            plain = load(environ=container_env(container, configmaps, {}))
            assert plain.static_instance_id() is None, where
            assert plain.exactly_once, f"{where}: a deployed job runs exactly-once (README, 'Exactly-once')"
            assert plain.kafka_options == {"security.protocol": "PLAINTEXT"}, where
            settings = load(environ=container_env(container, secured, secrets))
            assert settings.kafka_options == {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": "detector",
                "sasl.password": "s3cret",
                "ssl.ca.location": "/ca.crt",
            }, where
            (source,) = {ref["configMapKeyRef"]["name"] for e in container["env"] if (ref := e.get("valueFrom", {})).get("configMapKeyRef")}
            assert settings.kafka_bootstrap_servers == configmaps[source]["KAFKA_BOOTSTRAP_SERVERS"], where
    # The aggregator takes its brokers from the same ConfigMap, through the variable its flag defaults
    # to, and on a secured cluster the same security settings and credentials as the jobs.
    from detectorkit.metrics import aggregator_service

    objects = manifests(shared_manifests)
    configmaps = {doc["metadata"]["name"]: doc["data"] for doc in of_kind(objects, "ConfigMap")}
    container = only_container(objects["Deployment", "metrics-aggregator"])
    secrets = {ref["secretKeyRef"]["name"]: CREDENTIALS for e in container["env"] if (ref := e.get("valueFrom", {})).get("secretKeyRef")}
    built = {}

    class Recorded(aggregator_service.AggregatorService):
        def run(self):
            built.update(self.base)
            return 0

    monkeypatch.setattr(aggregator_service, "AggregatorService", Recorded)
    monkeypatch.setattr(aggregator_service.logs, "setup", lambda *a, **k: None)
    assert aggregator_service.main(container["args"][1:], environ=container_env(container, secured, secrets)) == 0
    assert built["bootstrap.servers"] == configmaps["metrics-aggregator-kafka"]["KAFKA_BOOTSTRAP_SERVERS"]
    assert {k: getattr(v, "get_secret_value", lambda v=v: v)() for k, v in built.items() if "." in k and k != "bootstrap.servers"} == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "detector",
        "sasl.password": "s3cret",
        "ssl.ca.location": "/ca.crt",
    }
    assert "s3cret" not in repr(built)  # wrapped: revealed to the Kafka clients only


def test_a_scaled_deployment_leaves_its_replica_count_to_keda(baked_manifests, shared_manifests):
    # A count in the Deployment would reset KEDA's at every `kubectl apply`.
    for folder in (baked_manifests, shared_manifests):
        objects = manifests(folder)
        for scaled in of_kind(objects, "ScaledObject"):
            target = objects["Deployment", scaled["spec"]["scaleTargetRef"]["name"]]
            assert "replicas" not in target["spec"], f"{shown(folder)}: {target['metadata']['name']} sets replicas under a ScaledObject"
    assert of_kind(manifests(baked_manifests), "ScaledObject")


def test_keda_paces_replica_changes_through_the_hpa_and_never_adds_more_than_the_partitions(baked_manifests):
    """KEDA's cooldownPeriod paces only a scale to zero; between one replica and the maximum the
    HPA's behaviour does, and each change is a rebalance. Replicas past the partition count idle."""
    from detectorkit.settings import Settings, load

    objects = manifests(baked_manifests)
    (scaled,) = of_kind(objects, "ScaledObject")
    spec = scaled["spec"]
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    down = behavior["scaleDown"]
    assert down["stabilizationWindowSeconds"] >= 60, down
    assert down["policies"] and all(p["type"] == "Pods" and p["value"] == 1 for p in down["policies"]), "one rebalance at a time"
    assert behavior["scaleUp"]["policies"], behavior
    deployment = objects["Deployment", spec["scaleTargetRef"]["name"]]
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == spec["scaleTargetRef"]["envSourceContainerName"]]
    configmaps = {doc["metadata"]["name"]: doc["data"] for doc in of_kind(objects, "ConfigMap")}
    settings = load(environ=container_env(container, configmaps, {})).for_service(deployment["metadata"]["name"])
    assert spec["minReplicaCount"] <= spec["maxReplicaCount"] <= settings.topic_partitions
    # What the comments say the defaults are, they are.
    text = (baked_manifests / "deployment.yaml").read_text()
    default = Settings.model_fields["group_session_timeout_seconds"].default
    assert f"GROUP_SESSION_TIMEOUT_SECONDS ({default:g} s" in text.replace("\n# ", " ")


def test_keda_reads_the_brokers_group_topic_and_credentials_the_job_uses(baked_manifests):
    """KEDA's Kafka scaler resolves bootstrapServersFromEnv, consumerGroupFromEnv and topicFromEnv
    from the scale target container's environment, and its TriggerAuthentication from the same
    ConfigMap (KEDA's spelling of the security choice) and the same Secret as the job."""
    from detectorkit.settings import load

    objects = manifests(baked_manifests)
    (scaled,) = of_kind(objects, "ScaledObject")
    deployment = objects["Deployment", scaled["spec"]["scaleTargetRef"]["name"]]
    (container,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == scaled["spec"]["scaleTargetRef"]["envSourceContainerName"]
    ]
    configmaps = {doc["metadata"]["name"]: doc["data"] for doc in of_kind(objects, "ConfigMap")}
    (trigger,) = scaled["spec"]["triggers"]
    metadata = trigger["metadata"]
    assert not {"bootstrapServers", "consumerGroup", "topic", "sasl", "tls"} & set(metadata), "a second place for what the job is given"
    env = container_env(container, configmaps, {})
    settings = load(environ=env).for_service(deployment["metadata"]["name"])
    assert env[metadata["bootstrapServersFromEnv"]] == settings.kafka_bootstrap_servers
    assert env[metadata["consumerGroupFromEnv"]] == settings.consumer_group
    assert env[metadata["topicFromEnv"]] == settings.input_topic

    auth = objects["TriggerAuthentication", trigger["authenticationRef"]["name"]]
    from_secret = {ref["parameter"]: (ref["name"], ref["key"]) for ref in auth["spec"]["secretTargetRef"]}
    job_secrets = {e["name"]: (ref["name"], ref["key"]) for e in container["env"] if (ref := e.get("valueFrom", {}).get("secretKeyRef"))}
    assert from_secret["username"] == job_secrets["KAFKA_SASL_USERNAME"]
    assert from_secret["password"] == job_secrets["KAFKA_SASL_PASSWORD"]
    # The CA KEDA trusts is the file the job's KAFKA_SSL_CA_LOCATION would name.
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if "secret" in volumes[m["name"]]]
    secret = volumes[mount["name"]]["secret"]
    (item,) = secret["items"]
    assert from_secret["ca"] == (secret["secretName"], item["key"])
    ca_location = f"{mount['mountPath']}/{item['path']}"
    assert any(ca_location in line for line in (baked_manifests / "configmap.yaml").read_text().splitlines() if "KAFKA_SSL_CA_LOCATION" in line)

    from_configmap = {ref["parameter"]: configmaps[ref["name"]][ref["key"]] for ref in auth["spec"]["configMapTargetRef"]}
    assert (from_configmap["tls"], from_configmap["sasl"]) == keda_spelling(env["KAFKA_SECURITY_PROTOCOL"], env.get("KAFKA_SASL_MECHANISM"))


@needs_promtool
def test_the_services_alerts_fire_from_the_brokers_side_when_no_instance_reads(baked_manifests, tmp_path):
    """The baked PrometheusRule, run by promtool on the Kafka Exporter's series: a group far behind
    and one whose offsets stand still while records wait (a service that never starts) alert; a
    group that reads, and another service's group, do not. Its lag threshold is what KEDA's
    replicas can take at most (lagThreshold x maxReplicaCount)."""
    objects = manifests(baked_manifests)
    (rule,) = of_kind(objects, "PrometheusRule")
    (scaled,) = of_kind(objects, "ScaledObject")
    (group,) = rule["spec"]["groups"]
    lagging = next(r for r in group["rules"] if r["alert"] == "DetectorGroupLagging")
    most = int(scaled["spec"]["triggers"][0]["metadata"]["lagThreshold"]) * scaled["spec"]["maxReplicaCount"]
    assert lagging["expr"].strip().endswith(f"> {most}"), lagging["expr"]
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(rule["spec"]))
    run(promtool, "check", "rules", rules)
    service, where = "high-value-orders", 'topic="records.normalized", partition="0"'

    def series(name, group_name, values):
        return {"series": f'{name}{{consumergroup="{group_name}", {where}}}', "values": values}

    def fired(name, summary, description, severity):
        labels = {"severity": severity, "service": service, "team": "data-science", "consumergroup": service, "topic": "records.normalized"}
        return [{"exp_labels": labels, "exp_annotations": {"summary": summary, "description": description}}]

    description = {r["alert"]: r["annotations"]["description"] for r in group["rules"]}
    tests = {
        "rule_files": [rules.name],
        "evaluation_interval": "1m",
        "tests": [
            {  # nobody reads: offsets stand still while the lag is far beyond what the replicas take
                "interval": "1m",
                "input_series": [
                    series("kafka_consumergroup_lag", service, "500000x40"),
                    series("kafka_consumergroup_current_offset", service, "1000x40"),
                    series("kafka_consumergroup_lag", "another-service", "500000x40"),
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "25m",
                        "alertname": "DetectorGroupLagging",
                        "exp_alerts": fired(
                            "DetectorGroupLagging",
                            f"{service} is 500k records behind on records.normalized",
                            description["DetectorGroupLagging"],
                            "warning",
                        ),
                    },
                    {
                        "eval_time": "25m",
                        "alertname": "DetectorGroupNotConsuming",
                        "exp_alerts": fired(
                            "DetectorGroupNotConsuming",
                            f"{service} commits nothing on records.normalized while records wait",
                            description["DetectorGroupNotConsuming"],
                            "critical",
                        ),
                    },
                ],
            },
            {  # it reads: some lag, offsets moving
                "interval": "1m",
                "input_series": [
                    series("kafka_consumergroup_lag", service, "500x40"),
                    series("kafka_consumergroup_current_offset", service, "0+1000x40"),
                ],
                "alert_rule_test": [
                    {"eval_time": "25m", "alertname": "DetectorGroupLagging", "exp_alerts": []},
                    {"eval_time": "25m", "alertname": "DetectorGroupNotConsuming", "exp_alerts": []},
                ],
            },
        ],
    }
    (tmp_path / "rules_test.yml").write_text(yaml.safe_dump(tests))
    assert "SUCCESS" in run(promtool, "test", "rules", "rules_test.yml", cwd=tmp_path)


def test_the_team_answer_labels_the_pods_their_series_and_alerts_and_routes_them_to_the_team(helm, tmp_path):
    """`team` from the bake: on the pods (and through the PodMonitor on their series), on every
    alert of the service, and in the AlertmanagerConfig that routes exactly those to the team."""
    project = bake(tmp_path, service_name="card-bursts", team="fraud-ops")
    (tmp_path / "rendered").mkdir()
    objects = manifests(rendered(project, helm, tmp_path / "rendered"))
    (deployment,) = of_kind(objects, "Deployment")
    assert deployment["spec"]["template"]["metadata"]["labels"]["team"] == "fraud-ops"
    (monitor,) = of_kind(objects, "PodMonitor")
    assert "team" in monitor["spec"]["podTargetLabels"]
    (rule,) = of_kind(objects, "PrometheusRule")
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert alerts and all(r["labels"]["team"] == "fraud-ops" for r in alerts)
    (routing,) = of_kind(objects, "AlertmanagerConfig")
    route = routing["spec"]["route"]
    assert route["matchers"] == [{"name": "team", "value": "fraud-ops", "matchType": "="}]
    assert route["receiver"] in {r["name"] for r in routing["spec"]["receivers"]}


def test_the_teams_channel_given_as_alerts_receiver_is_where_its_alerts_go(baked_project, helm, crd_schemas, tmp_path):
    """`alerts.receiver` in deploy/values.yaml: the receiver the team's route names, as the
    Prometheus Operator's AlertmanagerConfig takes it."""
    import jsonschema

    channel = {"slackConfigs": [{"channel": "#fraud-alerts", "apiURL": {"name": "slack-webhook", "key": "url"}}]}
    (tmp_path / "receiver.yaml").write_text(yaml.safe_dump({"alerts": {"receiver": channel}}))
    values = ["-f", baked_project / "deploy" / "values.yaml", "-f", tmp_path / "receiver.yaml"]
    (tmp_path / "rendered").mkdir()
    objects = manifests(split_rendered(run(helm, "template", "high-value-orders", CHART, *values), tmp_path / "rendered"))
    (routing,) = of_kind(objects, "AlertmanagerConfig")
    jsonschema.validate(routing, crd_schemas["AlertmanagerConfig"])
    (receiver,) = [r for r in routing["spec"]["receivers"] if r["name"] == routing["spec"]["route"]["receiver"]]
    assert receiver == {"name": "data-science", **channel}


def test_a_service_on_avro_gets_its_registry_and_the_registrys_password_from_the_secret(baked_project, helm, tmp_path):
    """recordFormat and schemaRegistryUrl in deploy/values.yaml: the job reads Avro with the
    registry's schemas, logging in with the user:password the credentials Secret holds."""
    from detectorkit.settings import load

    (tmp_path / "avro.yaml").write_text("recordFormat: avro\nschemaRegistryUrl: https://registry.example.com\n")
    values = ["-f", baked_project / "deploy" / "values.yaml", "-f", tmp_path / "avro.yaml"]
    (tmp_path / "rendered").mkdir()
    objects = manifests(split_rendered(run(helm, "template", "high-value-orders", CHART, *values), tmp_path / "rendered"))
    (deployment,) = of_kind(objects, "Deployment")
    configmaps = {doc["metadata"]["name"]: doc["data"] for doc in of_kind(objects, "ConfigMap")}
    secrets = {"high-value-orders-kafka-credentials": {"SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO": "detector:s3cret"}}
    settings = load(environ=container_env(only_container(deployment), configmaps, secrets))
    assert (settings.record_format, settings.schema_registry_url) == ("avro", "https://registry.example.com")
    assert settings.registry_conf()["basic.auth.user.info"].get_secret_value() == "detector:s3cret"
    # A format that needs a registry, without one, is refused before anything is applied.
    (tmp_path / "nourl.yaml").write_text("recordFormat: protobuf\n")
    refused = subprocess.run(
        [str(c) for c in (helm, "template", "x", CHART, "-f", baked_project / "deploy" / "values.yaml", "-f", tmp_path / "nourl.yaml")],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 1 and "set schemaRegistryUrl" in refused.stderr, refused.stderr


def test_the_chart_passes_helms_lint_with_every_values_file_that_uses_it(baked_project, helm):
    """`helm lint --strict` (templates, Chart.yaml, values against values.schema.json) for each way
    the chart is used: a baked detector, its shadow and Strimzi layers, and the shared jobs."""
    baked = baked_project / "deploy"
    uses = {
        "detector": [baked / "values.yaml"],
        "shadow": [baked / "values.yaml", baked / "shadow" / "values.yaml"],
        "strimzi": [baked / "values.yaml", baked / "strimzi" / "values.yaml"],
        **{p.stem: [SHARED_VALUES / "kafka.yaml", p] for p in SHARED_VALUES.glob("*.yaml") if p.stem not in SHARED_LAYERS},
        **{f"{job} on strimzi": [SHARED_VALUES / "kafka.yaml", SHARED_VALUES / "strimzi.yaml", SHARED_VALUES / f"{job}.yaml"] for job in SHARED_JOBS},
    }
    assert {"normaliser", "notifier", "aggregator"} <= set(uses)
    for name, values in uses.items():
        linted = subprocess.run([helm, "lint", "--strict", CHART, *(f"--values={v}" for v in values)], capture_output=True, text=True)
        assert linted.returncode == 0 and "0 chart(s) failed" in linted.stdout, f"{name}: {linted.stdout}{linted.stderr}"


def test_a_bake_pins_the_charts_version_it_was_tested_with(baked_project):
    """The bake's CHART_VERSION is this repository's chart: what its deploy tests rendered is what
    the service deploys until Renovate proposes the next one."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    makefile = (baked_project / "Makefile").read_text()
    assert re.search(r"^CHART_VERSION \?= (\S+)$", makefile, re.M)[1] == chart["version"]
    assert re.search(r"^CHART \?= (\S+)$", makefile, re.M)[1].endswith(f"/{chart['name']}")


@pytest.mark.parametrize(
    ("wrong", "said"),
    [
        ("autoscalling: {enabled: false}", "additional properties 'autoscalling' not allowed"),
        ("processingGuarantee: exactly-twice", "processingGuarantee"),
        ("autoscaling: {maxReplicas: 12}", "autoscaling.maxReplicas (12) is more than inputPartitions (8)"),
        ("kafka: {saslMechanism: SCRAM}", "saslMechanism"),
    ],
)
def test_the_chart_refuses_a_wrong_value_saying_which(baked_project, helm, tmp_path, wrong, said):
    """A misspelt key or a wrong value stops `helm template` (and so `make deploy`) with a line that
    names it, before anything reaches the cluster."""
    (tmp_path / "wrong.yaml").write_text(wrong + "\n")
    values = ["-f", baked_project / "deploy" / "values.yaml", "-f", tmp_path / "wrong.yaml"]
    result = subprocess.run([str(c) for c in (helm, "template", "x", CHART, *values)], capture_output=True, text=True)
    assert result.returncode == 1 and said in result.stderr, result.stderr


def test_a_shadow_runs_beside_the_live_service_on_its_own_group_topics_pods_and_scaling(baked_manifests, shadow_manifests):
    """deploy/shadow/: the live Deployment's copy with SHADOW=true and a new image, its own pods,
    budget and KEDA trigger on the group the shadow job reads in; Kafka reached with the live
    service's ConfigMap and Secret."""
    from detectorkit.settings import load

    live, shadow = manifests(baked_manifests), manifests(shadow_manifests)
    name = "high-value-orders"
    assert set(shadow) == {(kind, f"{name}-shadow") for kind in ("Deployment", "PodDisruptionBudget", "ScaledObject", "PodMonitor")}
    configmaps = {doc["metadata"]["name"]: doc["data"] for doc in of_kind(live, "ConfigMap")}
    live_pod, shadow_pod = live["Deployment", name]["spec"]["template"], shadow["Deployment", f"{name}-shadow"]["spec"]["template"]
    for selector in (shadow["Deployment", f"{name}-shadow"]["spec"]["selector"], shadow["PodDisruptionBudget", f"{name}-shadow"]["spec"]["selector"]):
        assert selector["matchLabels"].items() <= shadow_pod["metadata"]["labels"].items()
        assert not selector["matchLabels"].items() <= live_pod["metadata"]["labels"].items(), "the shadow's selector takes live pods"
    for selector in (live["Deployment", name]["spec"]["selector"], live["PodDisruptionBudget", name]["spec"]["selector"]):
        assert not selector["matchLabels"].items() <= shadow_pod["metadata"]["labels"].items(), "the live selector takes shadow pods"
    live_image, shadow_image = (only_container(d)["image"].rsplit(":", 1) for d in (live["Deployment", name], shadow["Deployment", f"{name}-shadow"]))
    assert live_image[0] == shadow_image[0] and live_image[1] != shadow_image[1]

    live_settings = load(environ=container_env(only_container(live["Deployment", name]), configmaps, {})).for_service(name)
    settings = load(environ=container_env(only_container(shadow["Deployment", f"{name}-shadow"]), configmaps, {})).for_service(name)
    assert settings.shadow and settings.input_topic == live_settings.input_topic
    assert settings.consumer_group == f"{live_settings.consumer_group}.shadow"
    assert settings.output_topic == f"{live_settings.output_topic}.shadow" and settings.dlq_topic == f"{live_settings.dlq_topic}.shadow"
    scaled = shadow["ScaledObject", f"{name}-shadow"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == f"{name}-shadow"
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["metadata"]["consumerGroup"] == settings.consumer_group and "consumerGroupFromEnv" not in trigger["metadata"]
    assert ("TriggerAuthentication", trigger["authenticationRef"]["name"]) in live


def workload_files(*folders) -> list[pathlib.Path]:
    return sorted(p for folder in folders for p in folder.glob("*.yaml"))


def test_every_pod_meets_the_restricted_pod_security_standard(baked_manifests, shadow_manifests, shared_manifests, psa_check):
    result = subprocess.run([psa_check, *workload_files(shared_manifests, baked_manifests, shadow_manifests)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    # It saw every Deployment: a manifest it could not read would not pass unseen.
    passed = set(re.findall(r": Deployment/(\S+): ok$", result.stdout, re.M))
    deployments = {name for (kind, name) in manifests(shared_manifests, baked_manifests, shadow_manifests) if kind == "Deployment"}
    assert passed == deployments, result.stdout


def test_the_pod_security_check_refuses_a_weakened_pod(baked_manifests, psa_check, tmp_path):
    deployment = manifests(baked_manifests)["Deployment", "high-value-orders"]
    pod = deployment["spec"]["template"]["spec"]
    pod.setdefault("securityContext", {}).pop("seccompProfile", None)
    pod["containers"][0].setdefault("securityContext", {})["privileged"] = True
    weakened = tmp_path / "weakened.yaml"
    weakened.write_text(yaml.safe_dump(deployment))
    result = subprocess.run([psa_check, weakened], capture_output=True, text=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "privileged" in result.stdout and "seccompProfile" in result.stdout, result.stdout


def test_every_container_writes_only_to_its_scratch_volume(baked_manifests, shared_manifests):
    """A read-only root filesystem, and every place a job writes on an emptyDir: Spark's local
    directory, Python's and the JVM's temporary files (java.io.tmpdir and hsperfdata are /tmp
    whatever TMPDIR says), the checkpoint (a temporary directory) and the home directory."""
    for folder in (baked_manifests, shared_manifests):
        for deployment in of_kind(manifests(folder), "Deployment"):
            pod = deployment["spec"]["template"]["spec"]
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            for container in pod["containers"]:
                where = f"{shown(folder)}: {deployment['metadata']['name']}/{container['name']}"
                assert container["securityContext"]["readOnlyRootFilesystem"] is True, where
                writable = [m["mountPath"] for m in container.get("volumeMounts", []) if "emptyDir" in volumes[m["name"]] and not m.get("readOnly")]
                assert "/tmp" in writable, f"{where}: the JVM writes to /tmp"
                env = {e["name"]: e.get("value") for e in container.get("env", [])}
                spark = container.get("args", [""])[0] != "aggregate"
                for name in ("TMPDIR", *(("SPARK_LOCAL_DIRS", "HOME") if spark else ())):
                    path = pathlib.PurePosixPath(env.get(name) or "/unset")
                    assert any(path.is_relative_to(w) for w in writable), f"{where}: {name}={env.get(name)} is not on a writable volume"
                assert env.get("PYTHONDONTWRITEBYTECODE") == "1", where
                assert "CHECKPOINT_DIR" not in env or any(pathlib.PurePosixPath(env["CHECKPOINT_DIR"]).is_relative_to(w) for w in writable)


@pytest.mark.parametrize("dockerfile", ["{{cookiecutter.service_name}}/Dockerfile", "deploy/docker/Dockerfile"])
def test_dockerfiles_run_on_any_architecture_as_a_non_root_user_with_a_health_check(dockerfile):
    text = "\n".join(line for line in (REPO / dockerfile).read_text().splitlines() if not line.lstrip().startswith("#"))
    assert not re.search(r"amd64|arm64|x86_64|aarch64", text), "an architecture's path in the image"
    assert "JAVA_HOME=/usr/lib/jvm/default-java" in text and "default-jre-headless" in text
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0"), users
    assert re.search(r"^HEALTHCHECK ", text, re.M)
    # An init as PID 1 reaps the JVM's and the workers' orphans, from a package the image installs;
    # the image says what it is and from which commit.
    (entrypoint,) = re.findall(r"^ENTRYPOINT\s+(\[.*\])$", text, re.M)
    assert json.loads(entrypoint)[:2] == ["/usr/bin/tini", "--"] and re.search(r"apt-get install .*\btini\b", text), entrypoint
    assert "org.opencontainers.image.title=" in text and "org.opencontainers.image.revision=" in text


def test_the_dashboard_ships_as_a_configmap_grafanas_sidecar_loads(kustomize):
    """deploy/grafana/ built as `kubectl apply -k` builds it: one ConfigMap with the sidecar's label,
    holding dashboards/diamond.json byte for byte (the file stays the one source), small enough for
    a client-side apply, which copies the object into an annotation of at most 256 KiB."""
    import kubernetes_validate

    built = subprocess.run([kustomize, "build", DEPLOY / "grafana"], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    (configmap,) = [doc for doc in yaml.load_all(built.stdout, Loader=KubeLoader) if doc]
    kubernetes_validate.validate(configmap, KUBERNETES, strict=True)
    assert configmap["kind"] == "ConfigMap" and configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["annotations"]["grafana_folder"] == "Detectors"
    source = DEPLOY / "grafana" / "dashboards" / "diamond.json"
    assert configmap["data"] == {"diamond.json": source.read_text()}
    assert json.loads(configmap["data"]["diamond.json"])["title"] == "Diamond: detectors"
    assert len(json.dumps(configmap)) < 262_144


# Strimzi's schemas, compiled from its CRDs by kubernetes-models (npm), run by Node: no Go module or
# Maven artifact carries them. The package asks for Node 22 but runs on Debian's Node 20.
STRIMZI_VALIDATE = REPO / "tests" / "tools" / "strimzi-validate"


@pytest.fixture(scope="session")
def strimzi_validate():
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        if os.environ.get("CI"):
            pytest.fail("node and npm are not installed: CI must validate the Strimzi resources (apt-get install nodejs npm)")
        pytest.skip("node and npm are not installed (apt-get install nodejs npm): the Strimzi resources are validated with them")
    manifest = (STRIMZI_VALIDATE / "package.json").read_bytes()
    folder = CACHE / f"strimzi-validate-{hashlib.sha256(manifest).hexdigest()[:12]}"
    if not (folder / "node_modules").is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "package.json").write_bytes(manifest)
        installed = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--loglevel=error"], cwd=folder, capture_output=True, text=True)
        if installed.returncode != 0:
            if os.environ.get("CI"):
                pytest.fail(f"npm install of the Strimzi schemas failed: {installed.stderr}")
            pytest.skip(f"npm install of the Strimzi schemas failed (offline?): {installed.stderr.strip()}")
    shutil.copy(STRIMZI_VALIDATE / "validate.mjs", folder / "validate.mjs")

    def validate(text: str) -> subprocess.CompletedProcess:
        return subprocess.run([node, str(folder / "validate.mjs")], input=text, capture_output=True, text=True, cwd=folder)

    return validate


@pytest.mark.parametrize("kind", ["threshold", "burst"])
def test_a_baked_services_kafka_resources_are_valid_strimzi_resources(tmp_path, strimzi_validate, kind):
    """`<service> kafka-manifests`, run as a team runs it (the baked package, the guarantee it is
    deployed with), gives KafkaTopics and a KafkaUser that Strimzi's own schemas accept; a wrong
    operation is refused. (Its ACLs are granted on a real broker in detectorkit's test_on_kafka.)"""

    project = bake(tmp_path, detector_kind=kind)
    guarantee = yaml.safe_load((project / "deploy" / "values.yaml").read_text())["processingGuarantee"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DETECTOR_", "KAFKA_", "MAKE"))}
    # The bake's `make kafka-manifests` runs exactly this, with deploy/values.yaml's guarantee.
    dry_run = ["make", "-n", "--no-print-directory", "kafka-manifests"]
    planned = subprocess.run(dry_run, cwd=project, env=env, capture_output=True, text=True, check=True)
    command = f"PROCESSING_GUARANTEE={guarantee} .venv/bin/python -m high_value_orders kafka-manifests --cluster my-cluster --authentication tls"
    # Written beside the file, then moved over it: a failed run leaves the committed one whole.
    assert f"{command} > deploy/strimzi/strimzi.yaml.new\nmv deploy/strimzi/strimzi.yaml.new deploy/strimzi/strimzi.yaml" in planned.stdout
    env.update(PYTHONPATH=str(project / "src"), PROCESSING_GUARANTEE=guarantee)
    printed = subprocess.run(
        [sys.executable, "-m", "high_value_orders", "kafka-manifests", "--cluster", "main"], env=env, capture_output=True, text=True, check=True
    ).stdout
    kinds = [doc["kind"] for doc in yaml.safe_load_all(printed) if doc]
    assert kinds == ["KafkaTopic", *(["KafkaTopic"] if kind == "burst" else []), "KafkaUser"], kinds
    checked = strimzi_validate(printed)
    assert checked.returncode == 0 and checked.stdout.count(": valid") == len(kinds), checked.stdout + checked.stderr
    wrong = strimzi_validate(printed.replace("- Read\n", "- Reed\n", 1))
    assert wrong.returncode == 1 and "must be equal to one of the allowed values" in wrong.stdout, wrong.stdout


@pytest.fixture(scope="module", params=["tls", "scram-sha-512"])
def strimzi_overlay(request, baked_project, helm, tmp_path_factory):
    """The baked detector on Strimzi, with each authentication a KafkaUser can have: its topics and
    user as `make kafka-manifests` writes them (`kubectl apply -f deploy/strimzi/strimzi.yaml`) and
    the service with the Strimzi layer (`make deploy LAYER=strimzi`)."""
    authentication = request.param
    project = tmp_path_factory.mktemp("project") / baked_project.name
    shutil.copytree(baked_project, project)
    layer = project / "deploy" / "strimzi" / "values.yaml"
    layer.write_text(layer.read_text().replace("strimziAuthentication: tls", f"strimziAuthentication: {authentication}"))
    folder = rendered(project, helm, tmp_path_factory.mktemp("strimzi"), layer="strimzi")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DETECTOR_", "KAFKA_"))}
    env.update(PYTHONPATH=str(project / "src"), PROCESSING_GUARANTEE="exactly-once")
    command = [sys.executable, "-m", "high_value_orders", "kafka-manifests", "--cluster", "my-cluster", "--authentication", authentication]
    (folder / "strimzi.yaml").write_text(subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout)
    return folder


def test_the_strimzi_overlay_validates_and_its_pod_stays_restricted(strimzi_overlay, crd_schemas, psa_check, strimzi_validate):
    import jsonschema
    import kubernetes_validate

    kinds = []
    for _, doc in documents(strimzi_overlay):
        kinds.append(doc["kind"])
        if doc["apiVersion"].startswith("kafka.strimzi.io/"):
            continue  # Strimzi's own schemas, below
        if doc["kind"] in crd_schemas:
            jsonschema.validate(doc, crd_schemas[doc["kind"]])
        else:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    assert {"KafkaTopic", "KafkaUser", "Deployment", "ScaledObject", "TriggerAuthentication"} <= set(kinds), kinds
    checked = strimzi_validate((strimzi_overlay / "strimzi.yaml").read_text())
    assert checked.returncode == 0 and checked.stdout.count(": valid") == 2, checked.stdout + checked.stderr
    result = subprocess.run([psa_check, strimzi_overlay / "deployment.yaml"], capture_output=True, text=True)
    assert result.returncode == 0 and ": Deployment/high-value-orders: ok" in result.stdout, result.stdout + result.stderr


def test_the_strimzi_overlay_gives_the_job_and_keda_the_credentials_strimzi_makes_for_its_user(strimzi_overlay):
    """The Secrets as Strimzi's operators make them (the KafkaUser's, named after it; the cluster
    CA's), and nothing else: the job reaches the cluster's TLS listener with their keys (mutual TLS,
    or SCRAM-SHA-512 with the user's name and password), makes no topic, and KEDA reads the lag as
    the same user."""
    from detectorkit.settings import load

    objects = manifests(strimzi_overlay)
    (user,) = of_kind(objects, "KafkaUser")
    cluster = user["metadata"]["labels"]["strimzi.io/cluster"]
    scram = user["spec"]["authentication"]["type"] == "scram-sha-512"
    made = {
        user["metadata"]["name"]: (
            {"password": "PW", "sasl.jaas.config": "JAAS"}
            if scram
            else {"user.crt": "CERT", "user.key": "KEY", "user.p12": "P12", "user.password": "PW", "ca.crt": "CLIENTS-CA"}
        ),
        f"{cluster}-cluster-ca-cert": {"ca.crt": "CLUSTER-CA", "ca.p12": "P12", "ca.password": "PW"},
    }
    deployment = objects["Deployment", "high-value-orders"]
    container = only_container(deployment)
    configmaps = {doc["metadata"]["name"]: doc["data"] for doc in of_kind(objects, "ConfigMap")}
    settings = load(environ=container_env(container, configmaps, made))
    assert settings.topics_as_code and settings.kafka_bootstrap_servers == f"{cluster}-kafka-bootstrap:9093"
    options = settings.kafka_options
    if scram:
        sasl = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user["metadata"]["name"], "sasl.password": "PW"}
        assert sasl.items() <= options.items() and "ssl.certificate.location" not in options, options
    else:
        assert options["security.protocol"] == "SSL" and not any(k.startswith("sasl.") for k in options), options

    pod = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}

    def mounted(path: str) -> tuple[str, str]:
        """The Secret and key a file in the container comes from."""
        for mount in container["volumeMounts"]:
            prefix = mount["mountPath"].rstrip("/") + "/"
            if path.startswith(prefix):
                secret = volumes[mount["name"]]["secret"]
                (key,) = [i["key"] for i in secret["items"] if i["path"] == path[len(prefix) :]]
                assert key in made[secret["secretName"]], f"{path}: {secret['secretName']} has no {key}"
                return secret["secretName"], key
        raise AssertionError(f"{path} is on no mounted volume")

    files = {name: mounted(options[f"ssl.{name}.location"]) for name in ("ca", *(() if scram else ("certificate", "key")))}
    assert files == {
        "ca": (f"{cluster}-cluster-ca-cert", "ca.crt"),
        **({} if scram else {"certificate": (user["metadata"]["name"], "user.crt"), "key": (user["metadata"]["name"], "user.key")}),
    }
    (auth,) = of_kind(objects, "TriggerAuthentication")
    refs = {r["parameter"]: (r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    keda = {r["parameter"]: configmaps[r["name"]][r["key"]] for r in auth["spec"]["configMapTargetRef"]}
    if scram:
        assert refs == {"ca": files["ca"], "password": (user["metadata"]["name"], "password")}
        assert keda == {"tls": "enable", "sasl": "scram_sha512", "username": user["metadata"]["name"]}
    else:
        assert refs == {"ca": files["ca"], "cert": files["certificate"], "key": files["key"]}
        assert keda == {"tls": "enable", "sasl": ""}


STRIMZI_RESOURCES = DEPLOY / "strimzi"


def strimzi_files() -> list[pathlib.Path]:
    return sorted(STRIMZI_RESOURCES.glob("*.yaml"))


def kafka_user(job: str) -> dict:
    (user,) = [d for d in yaml.safe_load_all((STRIMZI_RESOURCES / f"{job}.yaml").read_text()) if d and d["kind"] == "KafkaUser"]
    return user


def test_the_shared_jobs_kafka_resources_are_current_and_valid_strimzi_resources(strimzi_validate, tmp_path):
    """deploy/strimzi/ (the shared topics, and each shared job's own topics and user as `make
    kafka-manifests` writes them) is what the jobs would ask for now, and Strimzi's schemas accept it;
    a partition count changed in topics.yaml makes the reading job's file stale, and says so."""
    script = REPO / "scripts" / "kafka_manifests.py"
    checked = subprocess.run([sys.executable, script, "--check"], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    text = "".join(path.read_text() for path in strimzi_files())
    kinds = [doc["kind"] for doc in yaml.safe_load_all(text) if doc]
    assert kinds.count("KafkaUser") == len(SHARED_JOBS) and {"KafkaTopic", "KafkaUser"} == set(kinds), kinds
    valid = strimzi_validate(text)
    assert valid.returncode == 0 and valid.stdout.count(": valid") == len(kinds), valid.stdout + valid.stderr

    copy = tmp_path / "repo"
    for part in ("scripts", "deploy/strimzi", "deploy/helm/values"):
        shutil.copytree(REPO / part, copy / part)
    topics = copy / "deploy" / "strimzi" / "topics.yaml"
    topics.write_text(topics.read_text().replace("topicName: detections\n  partitions: 8", "topicName: detections\n  partitions: 12"))
    stale = subprocess.run([sys.executable, copy / "scripts" / "kafka_manifests.py", "--check"], capture_output=True, text=True)
    assert stale.returncode == 1 and "notifier.yaml" in stale.stderr and "normaliser.yaml" not in stale.stderr, stale.stderr


@pytest.fixture(scope="module")
def shared_on_strimzi(helm, tmp_path_factory):
    """The shared jobs with the Strimzi layer (deploy/helm/values/strimzi.yaml)."""
    folder = tmp_path_factory.mktemp("shared-strimzi")
    for job in SHARED_JOBS:
        layers = [SHARED_VALUES / "kafka.yaml", SHARED_VALUES / "strimzi.yaml", SHARED_VALUES / f"{job}.yaml"]
        split_rendered(run(helm, "template", job, CHART, *(f"--values={v}" for v in layers)), folder, prefix=f"{job}.")
    return folder


def test_each_shared_job_on_strimzi_runs_as_its_kafka_user_with_exactly_the_rights_its_settings_need(shared_on_strimzi):
    """Each shared job's pod, with the settings the chart gives it, authenticates with the Secret of
    its KafkaUser in deploy/strimzi/ (mutual TLS, the cluster's TLS listener, no topic made), and that
    user's rights are what its own settings ask for: the chart and the resources cannot drift apart."""
    from detectorkit import manifests as kafka_manifests
    from detectorkit.cli.manifests import service_of
    from detectorkit.metrics.aggregator_service import AggregatorService, add_arguments
    from detectorkit.roles.normaliser import NORMALISER
    from detectorkit.roles.notifier import Notifier
    from detectorkit.settings import kafka_options_from_env, load

    objects = manifests(shared_on_strimzi)
    configmaps = {doc["metadata"]["name"]: doc["data"] for doc in of_kind(objects, "ConfigMap")}
    cluster = yaml.safe_load((SHARED_VALUES / "strimzi.yaml").read_text())["kafka"]["strimziCluster"]
    for job, stage in (("normaliser", NORMALISER), ("notifier", Notifier()), ("aggregator", None)):
        user = kafka_user(job)
        name = user["metadata"]["name"]
        assert user["metadata"]["labels"]["strimzi.io/cluster"] == cluster and user["spec"]["authentication"] == {"type": "tls"}
        service = yaml.safe_load((SHARED_VALUES / f"{job}.yaml").read_text())["service"]
        deployment = objects["Deployment", service]
        container = only_container(deployment)
        made = {name: {"user.crt": "CERT", "user.key": "KEY"}, f"{cluster}-cluster-ca-cert": {"ca.crt": "CLUSTER-CA"}}
        env = container_env(container, configmaps, made)
        secrets = {v["secret"]["secretName"] for v in deployment["spec"]["template"]["spec"]["volumes"] if "secret" in v}
        assert name in secrets, f"{job}: its pod mounts {secrets}, not its KafkaUser's Secret {name}"
        assert env["KAFKA_BOOTSTRAP_SERVERS"] == f"{cluster}-kafka-bootstrap:9093" and env["TOPICS_AS_CODE"] == "true", env
        assert kafka_options_from_env(env)["security.protocol"] == "SSL"
        if stage is None:
            parser = argparse.ArgumentParser()
            add_arguments(parser, env)
            args, _ = parser.parse_known_args(container["args"][1:])
            assert args.topics_as_code
            wanted = AggregatorService("unused", args.metrics_topic, args.aggregate_topic, changelog_topic=args.changelog_topic)
            (expected,) = [d for d in wanted.kafka_manifests(cluster, "tls", 3) if d["kind"] == "KafkaUser"]
            rights = expected["spec"]["authorization"]["acls"]
        else:
            settings = load(environ=env).for_service(stage.name)
            rights = kafka_manifests.acls(service_of(settings, stage.name, stage.state, stage.also_reads(settings)))
        assert user["spec"]["authorization"]["acls"] == rights, job
