"""The docs' reference pages hold every setting, command and metric the code has (they are written
from it as the site builds: cli.reference)."""

import pytest

from detectorkit.cli import reference
from detectorkit.metrics.registry import JobMetrics
from detectorkit.settings import Settings

pytestmark = pytest.mark.unit


def test_every_setting_is_in_the_reference_with_its_variable_default_and_description():
    page = reference.settings_page()
    rows = {line.split("|")[1].strip(" `"): line for line in page.splitlines() if line.startswith("| `")}
    for name, field in Settings.model_fields.items():
        assert name.upper() in rows, f"{name.upper()} is missing from the settings reference"
        assert field.description.split(".")[0].replace("|", "\\|") in rows[name.upper()]
    assert "(none)" in rows["SLICE_SECONDS"] and "300 in local mode" in rows["SLICE_SECONDS"]
    assert "`--slice-seconds`" in rows["SLICE_SECONDS"]


def test_every_command_is_in_the_reference_with_its_flags():
    page = reference.cli_page()
    top = reference.command_help()
    listed = top.split("{", 1)[1].split("}", 1)[0].split(",")
    for command in listed:
        assert f"detectorkit {command}" in page or command == "kafka-tool", f"{command} is missing from the command line reference"
    assert "kafka-tool" in page  # in the top-level help, with what it runs
    assert "--detector DETECTOR" in page and "--join-detector" in page and "--labels" in page


def test_every_metric_is_in_the_reference_with_its_labels():
    page = reference.metrics_page()
    job = JobMetrics(dead_letter_reasons=("malformed_json",), build={"version": "1"})
    for family in job.registry.collect():
        name = f"{family.name}_total" if family.type == "counter" else family.name
        assert f"| `{name}` | {family.type} |" in page, f"{name} is missing from the metrics reference"
    assert "| `detector_dead_letters_total` | counter | `reason` |" in page


def test_every_public_name_of_the_api_reference_has_a_docstring_of_its_own():
    """docs/reference/api.md renders these modules' public names from their docstrings; one without a
    docstring of its own is left out of the page (mkdocstrings shows no undocumented member)."""
    import importlib
    import inspect
    import pathlib

    page = pathlib.Path(__file__).resolve().parents[3] / "docs" / "reference" / "api.md"
    modules = [line.removeprefix("::: ") for line in page.read_text().splitlines() if line.startswith("::: ")]
    assert {"detectorkit.windows", "detectorkit.patterns", "detectorkit.testing", "detectorkit.backtest"} <= set(modules)
    for path in modules:
        module = importlib.import_module(path) if path.count(".") == 1 else None
        if module is None:  # a class: the module's docstring is not its
            continue
        assert hasattr(module, "__all__"), f"{path} says nothing of what is public (__all__)"
        for name in module.__all__:
            obj = getattr(module, name)
            own = getattr(obj, "__doc__", None) if inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj) else None
            assert own and own.strip(), f"{path}.{name} has no docstring: the API reference leaves it out"
