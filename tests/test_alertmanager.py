"""The Alertmanager routing example (deploy/alertmanager/alertmanager.yml) checked by Alertmanager's
own tools: amtool validates it and resolves each alert of deploy/prometheus/alerts.yml to a
receiver, and a real Alertmanager applies its inhibit rules to alerts posted to its API."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest
import yaml

DEPLOY = pathlib.Path(__file__).resolve().parents[1] / "deploy"
CONFIG = DEPLOY / "alertmanager" / "alertmanager.yml"
RULES = DEPLOY / "prometheus" / "alerts.yml"
# Which team owns a service, as the example routes them.
OWNER = {"high-value-orders": "detectors", "late-orders": "detectors", "normaliser": "platform", "notifier": "platform"}


def tool(name):
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is not installed; `make tools` installs the Debian package prometheus-alertmanager")
        pytest.skip(f"{name} is not installed (apt-get install prometheus-alertmanager)")
    return found


def alert_rules():
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def labels_of(rule, service):
    """The labels the rule's alert carries: its own, and those its expression keeps."""
    labels = {"alertname": rule["alert"], **rule.get("labels", {})}
    if "by (service)" in rule["expr"]:
        labels["service"] = service
    else:  # the aggregator's own alert: the scrape target's labels
        labels.update(job="metrics-aggregator", instance="metrics-aggregator:9108")
    return labels


def test_the_config_passes_amtool():
    result = subprocess.run([tool("amtool"), "check-config", str(CONFIG)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def routing_cases():
    for rule in alert_rules():
        for service, team in OWNER.items():
            labels = labels_of(rule, service)
            urgency = "page" if labels["severity"] == "critical" else "ticket"
            if "service" not in labels:  # the aggregator's alert: the platform team's, whatever the services
                yield pytest.param(labels, f"platform-{urgency}", id=rule["alert"])
                break
            yield pytest.param(labels, f"{team}-{urgency}", id=f"{rule['alert']}-{service}")


@pytest.mark.parametrize(("labels", "receiver"), list(routing_cases()))
def test_every_alert_reaches_its_team_at_its_urgency(labels, receiver):
    command = [
        tool("amtool"),
        "config",
        "routes",
        "test",
        f"--config.file={CONFIG}",
        f"--verify.receivers={receiver}",
        *(f"{k}={v}" for k, v in labels.items()),
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, f"{labels} went to {result.stdout.strip()!r}, not {receiver}: {result.stderr.strip()}"


def alertname_matchers(config):
    """Every alertname matcher in the routes and inhibit rules: (operator, value)."""
    found = []

    def scan(matchers):
        for m in matchers:
            parsed = re.fullmatch(r'\s*alertname\s*(=~|!~|!=|=)\s*"(.*)"\s*', m)
            if parsed:
                found.append(parsed.groups())

    def walk(route):
        scan(route.get("matchers", []))
        for child in route.get("routes", []):
            walk(child)

    walk(config["route"])
    for rule in config.get("inhibit_rules", []):
        scan(rule.get("source_matchers", []))
        scan(rule.get("target_matchers", []))
    return found


def test_routes_and_inhibit_rules_name_alerts_that_exist():
    config = yaml.safe_load(CONFIG.read_text())
    names = {rule["alert"] for rule in alert_rules()}
    matchers = alertname_matchers(config)
    assert len(matchers) >= 6, matchers
    for op, value in matchers:
        matched = {n for n in names if (re.fullmatch(value, n) if op in ("=~", "!~") else n == value)}
        assert matched, f"alertname{op}{value!r} matches none of {sorted(names)}"
    for rule in config["inhibit_rules"]:
        assert set(rule.get("equal", [])) <= {"service"}, rule  # the one label every detector alert has


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def alertmanager(tmp_path):
    binary = tool("prometheus-alertmanager")
    port = free_port()
    log = (tmp_path / "alertmanager.log").open("w")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={CONFIG}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/api/v2"

    def ready():
        try:
            with urllib.request.urlopen(f"{url}/status", timeout=2):
                return True
        except OSError:
            assert process.poll() is None, (tmp_path / "alertmanager.log").read_text()
            return False

    poll(ready, "Alertmanager to answer")
    yield url
    process.terminate()
    process.wait(30)


def poll(condition, what, timeout=15):
    """`what`: a string, or a callable saying what was last seen."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what() if callable(what) else what}"
        time.sleep(0.1)
    return result


def test_inhibit_rules_on_a_running_alertmanager(alertmanager):
    rules = {rule["alert"]: rule for rule in alert_rules()}

    def post(name, service):
        body = json.dumps([{"labels": labels_of(rules[name], service)}]).encode()
        request = urllib.request.Request(f"{alertmanager}/alerts", data=body, method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5):
            pass

    def states():
        with urllib.request.urlopen(f"{alertmanager}/alerts", timeout=5) as response:
            alerts = json.loads(response.read())
        return {(a["labels"]["alertname"], a["labels"].get("service")): a["status"]["state"] for a in alerts}

    # "down": no live instance, so it also lags, stalls and publishes nothing. "stalled": lags.
    # "lagging": only lags. Each case's symptoms are muted by its cause, only within its service.
    for name in ("DetectorDown", "DetectorLagGrowing", "DetectorStalled", "DetectorMetricsReportsFailing", "DetectorDeadLettersHigh"):
        post(name, "down")
    for name in ("DetectorStalled", "DetectorLagGrowing"):
        post(name, "stalled")
    post("DetectorLagGrowing", "lagging")
    expected = {
        ("DetectorDown", "down"): "active",
        ("DetectorLagGrowing", "down"): "suppressed",
        ("DetectorStalled", "down"): "suppressed",
        ("DetectorMetricsReportsFailing", "down"): "suppressed",
        ("DetectorDeadLettersHigh", "down"): "active",  # bad records are news even while it is down
        ("DetectorStalled", "stalled"): "active",
        ("DetectorLagGrowing", "stalled"): "suppressed",
        ("DetectorLagGrowing", "lagging"): "active",
    }
    seen = []
    poll(lambda: seen.append(states()) or seen[-1] == expected, lambda: f"the inhibitions {expected}, last seen {seen[-1]}")

    # The aggregator down: every detector alert is computed from its numbers, so all wait behind it.
    post("MetricsAggregatorDown", None)
    seen.clear()
    poll(
        lambda: seen.append(states()) or all(state == "suppressed" for (name, _), state in seen[-1].items() if name.startswith("Detector")),
        lambda: f"every detector alert suppressed, last seen {seen[-1]}",
    )
    assert seen[-1][("MetricsAggregatorDown", None)] == "active"
