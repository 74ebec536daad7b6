"""The docs' reference pages, written from the code so that they cannot drift from it: every setting
(`Settings`: its variable, flag, type, default and description), every command of `detectorkit` with
argparse's own help, and every metric a job publishes (its registry: name, type, labels, help)."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import typing

from pydantic.fields import FieldInfo

from detectorkit.settings import Settings, add_arguments

# The commands of `detectorkit --help`, each a section of the CLI page with its own --help.
COMMANDS = (
    "run",
    "backtest",
    "diff",
    "produce",
    "normalise",
    "notify",
    "aggregate",
    "broker",
    "produce-sample",
    "produce-raw",
    "tail",
    "diamond",
    "cluster",
    "spark-archive",
)  # kafka-tool passes everything after it to Kafka's own tool: the list above says what it is


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _type(field: FieldInfo) -> str:
    annotation = field.annotation
    if typing.get_origin(annotation) is typing.Literal:
        return " or ".join(repr(a) for a in typing.get_args(annotation))
    name = getattr(annotation, "__name__", None)
    return name if name and typing.get_origin(annotation) is None else str(annotation).replace("typing.", "")


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return "(made at start)"
    return "(none)" if field.default is None else f"`{field.default!r}`"


def settings_page() -> str:
    """Every setting of a job: what the command line takes as a flag and reads from its variable."""
    lines = [
        "# Settings",
        "",
        "Every setting of a job, read from its flag, else its environment variable, else the service's",
        "default. A wrong value stops the job at start with one line. Generated from `detectorkit.settings.Settings`.",
        "",
        "| variable | flag | type | default | what |",
        "|---|---|---|---|---|",
    ]
    flags = _flags()
    for name, field in Settings.model_fields.items():
        flag = flags[name]
        lines.append(f"| `{name.upper()}` | {flag} | {_cell(_type(field))} | {_cell(_default(field))} | {_cell(field.description or '')} |")
    lines += ["", "Kafka client settings: `KAFKA_OPTION_*` variables or `--kafka-option`; their secrets never print."]
    return "\n".join(lines) + "\n"


def _flags() -> dict[str, str]:
    """Each setting's flag as the command line declares it (settings.add_arguments), by its name."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = {}
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            # A value named as its variable says nothing more; KEY=VALUE does.
            value = "" if action.metavar == action.dest.upper() else f" {action.metavar}"
            flags[action.dest] = f"`{action.option_strings[0]}{value}`"
    return flags


def command_help(command: str | None = None) -> str:
    """`detectorkit <command> --help` (None: `detectorkit --help`), as the command prints it; a
    backtest's flags, which a detector's command adds to the job's, from the backtest's parser."""
    if command == "backtest":
        from detectorkit.cli.backtest import parser

        return _help([command]) + "\n\n" + parser("detectorkit backtest --detector ...").format_help().rstrip()
    return _help([] if command is None else [command])


def _help(command: list[str]) -> str:
    """In this process (a process each cost seconds): argparse prints the help, then exits."""
    from detectorkit.cli.main import main

    out = io.StringIO()
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                main([*command, "--help"])
            except SystemExit:
                pass
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return out.getvalue().replace("usage: -m ", "usage: detectorkit ").rstrip()


def cli_page() -> str:
    lines = [
        "# Command line",
        "",
        "`detectorkit` and its commands, each with its own `--help` as it prints it. A generated",
        "service's command (`<service> ...`) runs its detector with the job's flags (see Settings) and",
        "has `backtest` and `kafka-manifests` of its own. Generated from the parsers.",
        "",
        "```text",
        command_help(),
        "```",
    ]
    for command in COMMANDS:
        lines += ["", f"## detectorkit {command}", "", "```text", command_help(command), "```"]
    return "\n".join(lines) + "\n"


def metrics() -> list[tuple[str, str, list[str], str]]:
    """(name as Prometheus exposes it, type, label names, help) of every metric of a job."""
    from detectorkit.metrics import build_info
    from detectorkit.metrics.registry import JobMetrics

    job = JobMetrics(dead_letter_reasons=(), build=build_info.versions(None))
    found = []
    for family in job.registry.collect():
        labels = sorted({label for sample in family.samples for label in sample.labels if label not in ("le", "quantile")})
        wrapper = next((m for m in vars(job).values() if getattr(m, "_name", None) == family.name), None)
        labels = sorted(set(labels) | set(getattr(wrapper, "_labelnames", ())))
        name = f"{family.name}_total" if family.type == "counter" else family.name
        found.append((name, family.type, labels, family.documentation))
    return sorted(found)


def metrics_page() -> str:
    lines = [
        "# Metrics",
        "",
        "What each job instance publishes to the metrics topic, keyed by its instance id; the",
        "metrics-aggregator sums them across instances and serves them to Prometheus. Generated from",
        "`detectorkit.metrics.registry.JobMetrics`.",
        "",
        "| name | type | labels | what |",
        "|---|---|---|---|",
    ]
    for name, kind, labels, documentation in metrics():
        lines.append(f"| `{name}` | {kind} | {', '.join(f'`{label}`' for label in labels) or '-'} | {_cell(documentation)} |")
    return "\n".join(lines) + "\n"


def pages() -> dict[str, str]:
    """The reference pages by their file name."""
    return {"settings.md": settings_page(), "cli.md": cli_page(), "metrics.md": metrics_page()}


__all__ = ["COMMANDS", "cli_page", "command_help", "metrics", "metrics_page", "pages", "settings_page"]
