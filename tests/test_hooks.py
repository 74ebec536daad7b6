"""Unit tests of the pre-generation hook's checks, without baking anything."""

import importlib.util
import pathlib

import pytest

HOOK = pathlib.Path(__file__).parent.parent / "hooks" / "pre_gen_project.py"
spec = importlib.util.spec_from_file_location("pre_gen_project", HOOK)
hook = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hook)

GOOD = {
    "service_name": "high-value-orders",
    "package_name": "high_value_orders",
    "input_topic": "records.normalized",
    "output_topic": "detections",
    "dlq_topic": "high-value-orders.dlq",
    "consumer_group": "high-value-orders",
    "author_email": "ds@example.com",
}


def test_good_answers_pass():
    assert hook.problems(GOOD) == []


@pytest.mark.parametrize("name", ["a", "high-value-orders", "fraud2", "x-1-y"])
def test_kebab_slugs_pass(name):
    assert hook.check_service_name(name) is None


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("High Value Orders", "'high-value-orders'"),
        ("high_value_orders", "'high-value-orders'"),
        ("high--value", "'high-value'"),
        ("-leading", "'leading'"),
        ("trailing-", "'trailing'"),
        ("9lives", "'lives'"),
        ("", "'high-value-orders'"),
        ("x" * 64, "e.g."),
    ],
)
def test_bad_service_names_say_what_to_type(name, suggestion):
    message = hook.check_service_name(name)
    assert message and "kebab-case" in message and suggestion in message


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("high-value", "'high_value'"),
        ("2fast", "'detector_2fast'"),
        ("class", "is a Python keyword"),
        ("match", "is a Python keyword"),
        ("HighValue", "type 'highvalue'"),
        ("", "not a Python identifier"),
    ],
)
def test_bad_package_names_say_what_to_type(name, fragment):
    message = hook.check_package_name(name)
    assert message and fragment in message


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "empty"),
        (".", "not allowed"),
        ("..", "not allowed"),
        ("a" * 250, "at most 249"),
        ("bad topic", "'bad-topic'"),
        ("détections", "letters, digits"),
        ("a/b", "'a-b'"),
    ],
)
def test_bad_topics_say_what_to_type(name, fragment):
    message = hook.check_topic("output_topic", name)
    assert message and "output_topic" in message and fragment in message


@pytest.mark.parametrize("name", ["a" * 249, "records.normalized", "x_y-z.1"])
def test_good_topics_pass(name):
    assert hook.check_topic("input_topic", name) is None


def test_the_three_topics_must_differ():
    problems = hook.problems({**GOOD, "output_topic": "records.normalized"})
    assert any("three different topics" in p for p in problems)


def test_bad_email():
    assert "e-mail" in hook.check_email("not-an-address")
    assert hook.check_email("a@b.c") is None


def test_main_prints_each_problem_and_fails(monkeypatch, capsys):
    monkeypatch.setattr(hook, "rendered_answers", lambda: {**GOOD, "service_name": "Bad Name", "input_topic": "x y"})
    assert hook.main() == 1
    err = capsys.readouterr().err
    assert err.count("ERROR:") == 2 and "service_name" in err and "input_topic" in err


def test_main_passes_good_answers(monkeypatch):
    monkeypatch.setattr(hook, "rendered_answers", lambda: dict(GOOD))
    assert hook.main() == 0


@pytest.mark.parametrize("kind", ["threshold", "burst", "silence"])
def test_every_detector_kind_passes(kind):
    assert hook.check_detector_kind(kind) is None


def test_an_unknown_detector_kind_says_which_to_type():
    assert hook.check_detector_kind("spike").endswith("type one of threshold, burst, silence")
