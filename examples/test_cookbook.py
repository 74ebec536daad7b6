"""The cookbook itself: each example a detector of at most 15 code lines (comments and docstrings
aside), with its tests beside it, its settings read from DETECTOR_*."""

import ast
import dataclasses
import importlib
import pathlib

import pytest

HERE = pathlib.Path(__file__).parent
EXAMPLES = sorted(p.stem for p in HERE.glob("*.py") if not p.stem.startswith(("test_", "_")) and p.stem != "history")


def code_lines(path: pathlib.Path) -> int:
    source = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            docstrings |= set(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(1 for n, line in enumerate(source.splitlines(), 1) if line.strip() and not line.strip().startswith("#") and n not in docstrings)


def test_there_are_at_least_ten_examples():
    assert len(EXAMPLES) >= 10, EXAMPLES


@pytest.mark.parametrize("name", EXAMPLES)
def test_each_example_is_at_most_15_code_lines_with_its_tests_beside_it(name):
    assert code_lines(HERE / f"{name}.py") <= 15
    assert (HERE / f"test_{name}.py").is_file()


@pytest.mark.parametrize("name", EXAMPLES)
def test_each_examples_settings_come_from_the_environment(name):
    module = importlib.import_module(f"examples.{name}")
    config = module.DETECTOR.load_config({})
    assert config == module.Config()
    field = dataclasses.fields(module.Config)[0]
    changed = module.DETECTOR.load_config({f"DETECTOR_{field.name.upper()}": str(getattr(config, field.name) * 2)})
    assert getattr(changed, field.name) == getattr(config, field.name) * 2
