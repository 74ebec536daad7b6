"""Metrics end to end on a broker: detector instances report, the aggregator sums, Prometheus scrapes."""

import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from detectorkit.samples import samples
from detectorkit.testing import create_test_topics, produce, read_all

from ..jobs import Job, aggregator_command, job_env, wait_for
from ..models.spending import spending_model

REPO = pathlib.Path(__file__).resolve().parents[3]
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "diamond.json"
SERVICE = "test-threshold"
MODEL_SERVICE = "test-model"
MODEL = [sys.executable, "-m", "detectorkit", "run", "--detector", "tests.detectors:MODEL"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AggregatorProcess:
    def __init__(self, bootstrap, metrics_topic, service=SERVICE):
        self.port, self.service = free_port(), service
        self.log = tempfile.NamedTemporaryFile(prefix="aggregator-", suffix=".log", delete=False)
        command = aggregator_command(bootstrap, metrics_topic, self.port, "--ttl-seconds", "4")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(self.answers, timeout=30, what="the aggregator's /metrics")

    def answers(self):
        try:
            self.scrape()
            return True
        except OSError:
            assert self.process.poll() is None, pathlib.Path(self.log.name).read_text()
            return False

    def scrape(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as response:
            text = response.read().decode()
        values = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.labels.get("service", self.service) == self.service:
                    values[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "service")))] = s.value
        return values

    def value(self, name, **labels):
        return self.scrape().get((name, tuple(sorted(labels.items()))))

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(30) == 0


def instance_env(bootstrap, topics, metrics_topic, instance):
    # The instances share the partitions through the group; a set INSTANCE_ID makes b a static
    # member, so its restart below gets its own partitions back.
    return job_env(
        bootstrap,
        topics,
        starting_offsets="earliest",
        metrics_topic=metrics_topic,
        metrics_interval_seconds=1,
        instance_id=instance,
        group_session_timeout_seconds=10,
    )


def test_two_instances_aggregate_across_stop_restart_and_aggregator_restart(kafka_bootstrap_servers):
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "metrics-e2e", partitions=4)
    metrics_topic = f"metrics.{uuid.uuid4().hex[:8]}"
    sent = produce(bs, topics.input, samples(2_000, seed=31, bad_every=25))
    aggregator = AggregatorProcess(bs, metrics_topic)
    a = Job(instance_env(bs, topics, metrics_topic, "instance-a"))
    b = Job(instance_env(bs, topics, metrics_topic, "instance-b"))
    try:
        read = lambda: aggregator.value("detector_records_read_total") or 0  # noqa: E731
        wait_for(
            lambda: read() == 2_000 and aggregator.value("detector_instances_up") == 2, timeout=180, what="both instances' counts in the aggregate"
        )
        dead = sum(v for (name, _), v in aggregator.scrape().items() if name == "detector_dead_letters_total")
        assert dead == sum(1 for s in sent if s.sample.kind != "valid")

        # Scale down: b stops; its counts stay in the sum, it leaves `up` after the TTL.
        b.process.send_signal(signal.SIGTERM)
        assert b.wait(120) == 0, b.output()
        wait_for(lambda: aggregator.value("detector_instances_up") == 1, timeout=30, what="b to leave the up count")
        assert read() == 2_000

        # b restarts with the same id and counters back at zero: the total never drops.
        more = produce(bs, topics.input, samples(1_000, seed=32, bad_every=0))
        b = Job(instance_env(bs, topics, metrics_topic, "instance-b"))
        seen = []

        def caught_up():
            seen.append(read())
            return seen[-1] == 3_000

        # Whichever instance reads the new records (b's partitions wait for it within the session
        # timeout, or move to a), the total only grows.
        wait_for(lambda: caught_up() and aggregator.value("detector_instances_up") == 2, timeout=180, what="the new records counted and b up again")
        assert min(seen) >= 2_000, f"the total dropped: {seen}"

        # The aggregate also goes to the aggregated topic, keyed by service.
        def published_total():
            values = [json.loads(m["value"]) for m in read_all(bs, f"{metrics_topic}-agg") if m["key"] == SERVICE]
            return next((v for name, labels, v in values[-1]["samples"] if name == "detector_records_read_total"), None) if values else None

        wait_for(lambda: published_total() == 3_000, timeout=30, what="the total on the aggregated topic")

        # A restarted aggregator replays the topic and rebuilds the same totals.
        before = read()
        aggregator.stop()
        aggregator = AggregatorProcess(bs, metrics_topic)
        wait_for(lambda: read() == before, timeout=30, what="the same totals after the aggregator restart")
        assert before == len(sent) + len(more)
        assert aggregator.value("detector_detections_written_total") == sum(
            1 for s in sent + more if s.sample.kind == "valid" and s.sample.amount > 1000
        )
    finally:
        for job in (a, b):
            if job.process.poll() is None:
                job.process.send_signal(signal.SIGTERM)
                job.wait(120)
        aggregator.stop()


def dashboard_queries():
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel.get("targets", [])]


def dashboard_variables():
    return {v["name"]: v for v in json.loads(DASHBOARD.read_text())["templating"]["list"]}


# A metric selector in a PromQL expression: a detector_* name and its label matchers, if any.
SELECTOR = re.compile(r"\b(detector_[a-z_]+)(\{[^}]*\})?")


def test_one_dashboard_serves_every_detector_through_its_variables():
    """The datasource, service and instance are variables, and every panel and query uses them."""
    dashboard = json.loads(DASHBOARD.read_text())
    variables = dashboard_variables()
    assert set(variables) >= {"datasource", "service", "instance"}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("service", "instance"):
        variable = variables[name]
        assert variable["type"] == "query", name
        assert variable["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, name
        assert variable["multi"] and variable["includeAll"] and variable["allValue"] == ".*", name
        assert re.fullmatch(rf"label_values\(detector_\w+(\{{.*\}})?, {name}\)", variable["definition"]), variable["definition"]
        assert variable["query"]["query"] == variable["definition"], name
    # The instances offered are those of the services chosen.
    assert "$service" in variables["instance"]["definition"]
    problems = []
    for panel in (p for p in dashboard["panels"] if p["type"] != "row"):  # a row only groups panels
        if panel.get("datasource") != {"type": "prometheus", "uid": "${datasource}"}:
            problems.append(f"{panel['title']}: panel datasource {panel.get('datasource')}")
        for target in panel["targets"]:
            if target.get("datasource") != {"type": "prometheus", "uid": "${datasource}"}:
                problems.append(f"{panel['title']}: query datasource {target.get('datasource')}")
            selectors = SELECTOR.findall(target["expr"])
            if not selectors:
                problems.append(f"{panel['title']}: no detector metric in {target['expr']}")
            for metric, matchers in selectors:
                if 'service=~"$service"' not in matchers or 'instance=~"$instance"' not in matchers:
                    problems.append(f"{panel['title']}: {metric}{matchers} is not filtered by $service and $instance")
    assert not problems, "\n".join(problems)


ALL = None  # the variable's "All": its allValue, ".*"


def as_grafana_would(expr, chosen):
    """`expr` with $service and $instance replaced as Grafana's Prometheus data source does for a
    multi-value variable in a regex matcher: the values regex-escaped (in a PromQL string, so the
    backslash doubled) and joined as (a|b); "All" as the variable's allValue."""

    def value(name):
        values = chosen.get(name, ALL)
        if values is ALL:
            return ".*"
        escaped = [re.sub(r"([\\$^*{}\[\]'+?.()|])", r"\\\\\1", v) for v in values]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"

    return re.sub(r"\$(\w+)|\$\{(\w+)\}", lambda m: value(m.group(1) or m.group(2)), expr)


def test_the_variables_are_substituted_as_grafana_does():
    expr = 'sum(x{service=~"$service", instance=~"$instance"})'
    assert as_grafana_would(expr, {"service": ["a.b"], "instance": ALL}) == 'sum(x{service=~"a\\\\.b", instance=~".*"})'
    assert as_grafana_would(expr, {"service": ["a", "b"], "instance": ["h:1"]}) == 'sum(x{service=~"(a|b)", instance=~"h:1"})'


def test_dashboard_covers_what_sres_read():
    titles = " ".join(title.lower() for title, _ in dashboard_queries())
    for subject in (
        "records in",
        "detections",
        "dead letters",
        "lag",
        "batch duration p50",
        "batch duration p99",
        "end-to-end latency p99",
        "instances up",
        "cpu",
        "memory",
        "state keys held",
        "state size",
        "state changelog records written",
        "input records replayed",
        "state restore",
        "model version",
        "model scores",
        "model score p50",
    ):
        assert subject in titles


def prometheus_binary():
    found = shutil.which("prometheus")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is not installed; .ci/run installs the Debian package")
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    return found


def test_every_dashboard_panel_returns_data_from_a_real_prometheus(kafka_bootstrap_servers, tmp_path):
    binary = prometheus_binary()
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "panels", partitions=2)
    metrics_topic = f"metrics.{uuid.uuid4().hex[:8]}"
    aggregator = AggregatorProcess(bs, metrics_topic, MODEL_SERVICE)
    prom_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs: [{{job_name: aggregator, static_configs: [{{targets: ['127.0.0.1:{aggregator.port}']}}]}}]\n"
    )
    prometheus = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # A model detector with window features (a key's orders and spending kept), so the state and the
    # model panels have data too.
    model = spending_model(tmp_path / "model.onnx")
    env = job_env(bs, topics, starting_offsets="latest", metrics_topic=metrics_topic, metrics_interval_seconds=1, detector_model_uri=model)
    job = Job(env, MODEL)

    def query(expr):
        url = f"http://127.0.0.1:{prom_port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]["result"]

    def label_values(definition, chosen):
        """A query variable's values, as Grafana's Prometheus data source asks for them."""
        selector, label = re.fullmatch(r"label_values\((.+), (\w+)\)", definition).groups()
        url = f"http://127.0.0.1:{prom_port}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": as_grafana_would(selector, chosen)})
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def prometheus_has(expr):
        try:
            return bool(query(expr))
        except OSError:
            return False

    try:
        # Reading, not only reporting: it starts at the latest offsets, so what is sent before it
        # owns its partitions is never read (on Tansu the group's join takes ~25 s).
        wait_for(
            lambda: aggregator.value("detector_instances_up") == 1 and aggregator.value("detector_assigned_partitions") == 2,
            timeout=120,
            what="the job to report and own both partitions",
        )
        # Records keep arriving during the scrape window, so rates and latencies have something to show.
        deadline = time.monotonic() + 25
        seed = 0
        while time.monotonic() < deadline:
            seed += 1
            produce(bs, topics.input, samples(300, seed=seed, bad_every=10, high_share=0.2))
            time.sleep(1)  # a steady trickle, one second apart, as a live stream would be
            if seed > 8 and prometheus_has("rate(detector_end_to_end_latency_seconds_count[1m]) > 0"):
                break
        # The variables' own queries, as Grafana sends them: the label-values API of the series matched.
        variables = dashboard_variables()
        assert MODEL_SERVICE in label_values(variables["service"]["definition"], {})
        instances = label_values(variables["instance"]["definition"], {"service": [MODEL_SERVICE]})
        assert instances == [f"127.0.0.1:{aggregator.port}"]  # the aggregator Prometheus scraped
        assert label_values(variables["instance"]["definition"], {"service": ["no-such-service"]}) == []
        # Every panel with the service chosen and every instance (All), then one chosen by name.
        failures = []
        for title, expr in dashboard_queries():
            for chosen in (
                {"service": [MODEL_SERVICE], "instance": ALL},
                {"service": [MODEL_SERVICE, "another-service"], "instance": instances},
            ):
                result = query(as_grafana_would(expr, chosen))
                if not result:
                    failures.append(f"{title}: {as_grafana_would(expr, chosen)} returned no data")
                elif {r["metric"].get("service") for r in result} != {MODEL_SERVICE}:
                    failures.append(f"{title}: {[r['metric'] for r in result]} is not only {MODEL_SERVICE}")
            # The filters filter: another service's dashboard shows none of this one's data.
            if query(as_grafana_would(expr, {"service": ["no-such-service"], "instance": ALL})):
                failures.append(f"{title}: data for a service nobody runs")
        assert not failures, "\n".join(failures)
        records_in = query("sum by (service) (rate(detector_records_read_total[1m]))")
        assert float(records_in[0]["value"][1]) > 0, f"no records read in the last minute; the job said:\n{job.output()[-3000:]}"
        p99 = query("histogram_quantile(0.99, sum by (service, le) (rate(detector_end_to_end_latency_seconds_bucket[5m])))")
        assert float(p99[0]["value"][1]) > 0
        # One instance runs the model, of the version its file names.
        versions = query("sum by (model, version) (detector_model_info)")
        assert [(r["metric"], r["value"][1]) for r in versions] == [({"model": "model", "version": "7"}, "1")]
    finally:
        job.process.send_signal(signal.SIGTERM)
        job.wait(120)
        prometheus.terminate()
        prometheus.wait(30)
        aggregator.stop()
