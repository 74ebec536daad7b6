"""The diamond's shared jobs' Strimzi resources: deploy/strimzi/{normaliser,notifier,aggregator}.yaml.

Each is what the job's own `kafka-manifests` command prints (its dead letters and changelog, or the
aggregator's view and changelog, and its KafkaUser with exactly the rights it uses), run with the
settings the chart gives the job (deploy/helm/values/<job>.yaml) and, for its topics' partitions and
the cluster's name, the shared topics in deploy/strimzi/topics.yaml. `make kafka-manifests` writes
them; `--check` names the stale ones instead (tests/test_deploy.py runs it).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
STRIMZI = ROOT / "deploy" / "strimzi"
VALUES = ROOT / "deploy" / "helm" / "values"
# The job's values file -> its `detectorkit` command, as the chart's deployment.yaml runs it.
COMMANDS = {"normaliser": "normalise", "notifier": "notify", "aggregator": "aggregate"}
# The values the chart turns into the streaming jobs' settings (deployment.yaml).
SETTINGS = {
    "inputTopic": "INPUT_TOPIC",
    "outputTopic": "OUTPUT_TOPIC",
    "dlqTopic": "DLQ_TOPIC",
    "consumerGroup": "CONSUMER_GROUP",
    "metricsTopic": "METRICS_TOPIC",
    "processingGuarantee": "PROCESSING_GUARANTEE",
}


def shared_topics() -> tuple[str, dict[str, int]]:
    """The cluster's name and each shared topic's partitions, from topics.yaml."""
    docs = [d for d in yaml.safe_load_all((STRIMZI / "topics.yaml").read_text()) if d]
    clusters = {d["metadata"]["labels"]["strimzi.io/cluster"] for d in docs}
    if len(clusters) != 1:
        raise SystemExit(f"deploy/strimzi/topics.yaml names clusters {sorted(clusters)}: its topics must share one")
    return clusters.pop(), {d["spec"]["topicName"]: d["spec"]["partitions"] for d in docs}


def command_of(job: str, values: dict, partitions: dict[str, int]) -> tuple[list[str], dict[str, str]]:
    """The job's kafka-manifests command and the settings it runs with."""
    env = {SETTINGS[key]: str(value) for key, value in values.items() if key in SETTINGS}
    env.update({name: str(value) for name, value in (values.get("settings") or {}).items()})
    args = [sys.executable, "-m", "detectorkit", COMMANDS[job]]
    if job == "aggregator":
        return [*args, "kafka-manifests", "--metrics-topic", values.get("metricsTopic", "metrics")], {}
    topic = values["inputTopic"]
    if topic not in partitions:
        raise SystemExit(f"the {job}'s input topic {topic!r} is not in deploy/strimzi/topics.yaml: declare it there")
    env["TOPIC_PARTITIONS"] = str(partitions[topic])  # its dead letters' and changelog's: the input's
    return [*args, "kafka-manifests"], env


def written(job: str, cluster: str, partitions: dict[str, int]) -> str:
    values = yaml.safe_load((VALUES / f"{job}.yaml").read_text())
    command, env = command_of(job, values, partitions)
    # Only these settings: none of the environment this runs in may leak into the files.
    clean = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    done = subprocess.run([*command, "--cluster", cluster], env={**clean, **env}, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[2:])} failed: {done.stderr.strip()}")
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming the files that are out of date")
    args = parser.parse_args(argv)
    cluster, partitions = shared_topics()
    stale = []
    for job in COMMANDS:
        path = STRIMZI / f"{job}.yaml"
        text = written(job, cluster, partitions)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)}: run make kafka-manifests", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
