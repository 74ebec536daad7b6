"""Refuse answers that would break the service later, saying what to type instead.

Cookiecutter renders this file before running it, so the answers below are string literals; the
checks are plain functions that tests/test_hooks.py calls directly.
"""

from __future__ import annotations

import keyword
import re
import sys

SERVICE_SLUG = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
TOPIC_CHARS = re.compile(r"^[a-zA-Z0-9._-]+$")
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+$")


def check_service_name(name: str) -> str | None:
    if SERVICE_SLUG.match(name) and len(name) <= 63:
        return None
    suggestion = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    suggestion = re.sub(r"^[^a-z]+", "", suggestion)[:63].strip("-")
    hint = f", e.g. {suggestion!r}" if suggestion and SERVICE_SLUG.match(suggestion) else ", e.g. 'high-value-orders'"
    return (
        f"service_name {name!r} is not a kebab-case slug: use lower-case letters, digits and single "
        f"hyphens, starting with a letter, at most 63 characters{hint}"
    )


def check_package_name(name: str) -> str | None:
    if not name.isidentifier() or not name.isascii():
        suggestion = re.sub(r"\W+", "_", name).strip("_").lower() or "detector"
        if suggestion[0].isdigit():
            suggestion = f"detector_{suggestion}"
        return f"package_name {name!r} is not a Python identifier: use letters, digits and underscores, e.g. {suggestion!r}"
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        return f"package_name {name!r} is a Python keyword: pick another, e.g. '{name}_detector'"
    if name != name.lower():
        return f"package_name {name!r} should be lower case (PEP 8): type {name.lower()!r}"
    return None


def check_topic(field: str, name: str) -> str | None:
    if name in (".", ".."):
        return f"{field} {name!r} is not allowed by Kafka: type a name such as 'detections'"
    if not name:
        return f"{field} is empty: type a topic name such as 'detections'"
    if len(name) > 249:
        return f"{field} has {len(name)} characters; Kafka allows at most 249: type a shorter name"
    if not TOPIC_CHARS.match(name):
        suggestion = re.sub(r"[^a-zA-Z0-9._-]+", "-", name).strip("-") or "detections"
        return f"{field} {name!r} has characters Kafka does not allow: use only letters, digits, '.', '_' and '-', e.g. {suggestion!r}"
    return None


def check_email(email: str) -> str | None:
    if EMAIL.match(email):
        return None
    return f"author_email {email!r} is not an e-mail address: type something like 'data-science@example.com'"


KINDS = ("threshold", "burst", "silence", "totals", "model")


def check_detector_kind(kind: str) -> str | None:
    if kind in KINDS:
        return None
    return f"detector_kind {kind!r} is not one the template knows: type one of {', '.join(KINDS)}"


# PEP 508, the two shapes a team uses: a version range from its package index, or a direct reference.
# No quote, backslash, `$` or line break: the answer is written verbatim between double quotes in the
# Dockerfile (an ARG, where Docker expands `$`) and pyproject.toml, and must mean the same in both.
REQUIREMENT = re.compile(r"detectorkit(\[[\w, -]*\])? *(@ *[^\s\"\\$`]+|( *(===|==|!=|~=|<=|>=|<|>) *[\w.*+!-]+ *,?)*)")


def check_detectorkit_requirement(requirement: str) -> str | None:
    if REQUIREMENT.fullmatch(requirement):
        return None
    if re.search(r"[\"\\$`]|[^\S ]", requirement):
        return (
            f"detectorkit_requirement {requirement!r} holds a quote, backslash, '$', backtick, tab or line break, which the "
            "Dockerfile cannot carry as typed: percent-encode it in a URL (e.g. '$' as %24)"
        )
    return (
        f"detectorkit_requirement {requirement!r} is not a requirement on detectorkit: type a version range from your "
        "package index, e.g. 'detectorkit>=0.1,<0.2', or a direct reference, e.g. "
        "'detectorkit @ git+https://git.example.com/diamond-template.git#subdirectory=detectorkit'"
    )


def slug_suggestion(answer: str, longest: int, fallback: str) -> str:
    """A lower-case, hyphenated slug close to `answer`, at most `longest` long."""
    suggestion = re.sub(r"[^a-z0-9]+", "-", answer.lower()).strip("-")
    return re.sub(r"^[^a-z]+", "", suggestion)[:longest].strip("-") or fallback


def check_team(team: str) -> str | None:
    # A Kubernetes label value and an Alertmanager matcher: the slug rules a service name follows.
    if SERVICE_SLUG.match(team) and len(team) <= 63:
        return None
    suggestion = slug_suggestion(team, 63, "data-science")
    return f"team {team!r} labels the pods and routes the alerts: use lower-case letters, digits and single hyphens, e.g. {suggestion!r}"


def check_kafka_cluster(cluster: str) -> str | None:
    # The Strimzi Kafka resource's name: a Kubernetes name, and the prefix of the Secrets and the
    # bootstrap Service Strimzi makes for it (<cluster>-cluster-ca-cert, <cluster>-kafka-bootstrap).
    if SERVICE_SLUG.match(cluster) and len(cluster) <= 40:
        return None
    suggestion = slug_suggestion(cluster, 40, "my-cluster")
    return f"kafka_cluster {cluster!r} is the name of your Strimzi Kafka resource: lower-case letters, digits and single hyphens, e.g. {suggestion!r}"


def problems(answers: dict[str, str]) -> list[str]:
    found = [
        check_service_name(answers["service_name"]),
        check_detector_kind(answers.get("detector_kind", "threshold")),
        check_package_name(answers["package_name"]),
        check_email(answers["author_email"]),
        check_team(answers.get("team", "data-science")),
        check_kafka_cluster(answers.get("kafka_cluster", "my-cluster")),
        check_detectorkit_requirement(answers.get("detectorkit_requirement", "detectorkit")),
    ]
    found += [check_topic(f, answers[f]) for f in ("input_topic", "output_topic", "dlq_topic")]
    # Kafka allows any group id, but this one also names metrics and files: keep it topic-safe.
    found.append(check_topic("consumer_group", answers["consumer_group"]))
    if len({answers["input_topic"], answers["output_topic"], answers["dlq_topic"]}) < 3:
        found.append("input_topic, output_topic and dlq_topic must be three different topics: a detector reading its own output would loop forever")
    return [p for p in found if p]


def rendered_answers() -> dict[str, str]:
    # tojson makes each answer a valid string literal whatever it holds (quotes, backslashes).
    # Before rendering this body is an odd but valid expression, so tests can import the module.
    # The formatter would take the Jinja for Python sets and squeeze out its spaces.
    # fmt: off
    return {
        "service_name": {{ cookiecutter.service_name | tojson }},
        "package_name": {{ cookiecutter.package_name | tojson }},
        "detector_kind": {{ cookiecutter.detector_kind | tojson }},
        "input_topic": {{ cookiecutter.input_topic | tojson }},
        "output_topic": {{ cookiecutter.output_topic | tojson }},
        "dlq_topic": {{ cookiecutter.dlq_topic | tojson }},
        "consumer_group": {{ cookiecutter.consumer_group | tojson }},
        "team": {{ cookiecutter.team | tojson }},
        "kafka_cluster": {{ cookiecutter.kafka_cluster | tojson }},
        "author_email": {{ cookiecutter.author_email | tojson }},
        "detectorkit_requirement": {{ cookiecutter.detectorkit_requirement | tojson }},
    }
    # fmt: on


def main() -> int:
    found = problems(rendered_answers())
    for problem in found:
        print(f"ERROR: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
