"""The hooks: the pre-generation checks as plain functions, without baking anything; the
post-generation choice of the detector kind's files, on a copy of them and in real bakes."""

import importlib.util
import json
import pathlib
import shutil

import pytest

REPO = pathlib.Path(__file__).parent.parent
KINDS = REPO / "{{cookiecutter.service_name}}" / "_kinds"


def load_hook(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hook = load_hook("pre_gen_project")
post_gen = load_hook("post_gen_project")

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


@pytest.mark.parametrize(("team", "suggestion"), [("Data Science", "data-science"), ("fraud_ops", "fraud-ops"), ("", "data-science")])
def test_a_team_that_is_no_label_value_says_what_to_type(team, suggestion):
    (problem,) = hook.problems({**GOOD, "team": team})
    assert problem.startswith(f"team {team!r}") and f"e.g. {suggestion!r}" in problem
    assert hook.problems({**GOOD, "team": "fraud-ops"}) == []


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


@pytest.mark.parametrize("kind", ["threshold", "burst", "silence", "totals", "model"])
def test_every_detector_kind_passes(kind):
    assert hook.check_detector_kind(kind) is None


def test_an_unknown_detector_kind_says_which_to_type():
    assert hook.check_detector_kind("spike").endswith("type one of threshold, burst, silence, totals, model")


def test_each_kind_offered_has_a_folder_of_its_files_and_nothing_else():
    offered = json.loads((REPO / "cookiecutter.json").read_text())["detector_kind"]
    assert sorted(offered) == sorted(hook.KINDS) == sorted(p.name for p in KINDS.iterdir())
    for kind in offered:
        # A file the hook does not place would be dropped from every bake without a word.
        files = {p.name for p in (KINDS / kind).iterdir()}
        assert set(post_gen.EVERY_KIND) <= files <= set(post_gen.places("pkg")), files


@pytest.mark.parametrize("kind", ["threshold", "burst", "silence", "totals", "model"])
def test_keep_kind_puts_the_chosen_files_in_place_and_drops_the_other_kinds(tmp_path, kind):
    shutil.copytree(KINDS, tmp_path / "_kinds")
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    post_gen.keep_kind(tmp_path, kind, "pkg")
    assert not (tmp_path / "_kinds").exists()
    kept = {name: place for name, place in post_gen.places("pkg").items() if (KINDS / kind / name).exists()}
    for name, place in kept.items():
        assert (tmp_path / place).read_bytes() == (KINDS / kind / name).read_bytes()
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == sorted(kept.values())


def test_the_template_update_workflow_stays_only_in_a_service_cruft_made(tmp_path):
    for made_by_cruft in (True, False):
        workflow = tmp_path / str(made_by_cruft) / post_gen.TEMPLATE_UPDATE
        workflow.parent.mkdir(parents=True)
        workflow.write_text("on: schedule")
        post_gen.keep_template_update(tmp_path / str(made_by_cruft), made_by_cruft)
        assert workflow.exists() is made_by_cruft


@pytest.mark.parametrize("kind", ["threshold", "burst", "silence", "totals", "model"])
def test_a_bake_holds_its_kinds_files_under_the_usual_names_and_no_other_kinds(cookies, kind):
    result = cookies.bake(extra_context={"service_name": f"svc-{kind}", "detector_kind": kind})
    assert result.exit_code == 0, result.exception
    project = pathlib.Path(result.project_path)
    assert not (project / "_kinds").exists()
    for name, place in post_gen.places(f"svc_{kind}").items():
        if not (KINDS / kind / name).exists():
            assert not (project / place).exists(), place
            continue
        if name.endswith(".onnx"):  # copied as it is, never rendered
            assert (project / place).read_bytes() == (KINDS / kind / name).read_bytes()
            continue
        template = (KINDS / kind / name).read_text()
        rendered = template.replace("{{ cookiecutter.service_name }}", f"svc-{kind}").replace("{{ cookiecutter.package_name }}", f"svc_{kind}")
        assert (project / place).read_text() == rendered, place
    shipped = ["model.onnx"] if kind == "model" else []
    assert sorted(p.name for p in (project / "src" / f"svc_{kind}").iterdir()) == sorted(["__init__.py", "__main__.py", "detector.py", *shipped])
    # The kind's two tests, and the one every kind has (its Strimzi resources are current).
    assert sorted(p.name for p in (project / "tests").iterdir()) == ["test_detector.py", "test_integration.py", "test_kafka_manifests.py"]


@pytest.mark.parametrize(("cluster", "suggestion"), [("Prod Kafka", "prod-kafka"), ("kafka_eu", "kafka-eu"), ("", "my-cluster")])
def test_a_kafka_cluster_that_is_no_kubernetes_name_says_what_to_type(cluster, suggestion):
    (problem,) = hook.problems({**GOOD, "kafka_cluster": cluster})
    assert problem.startswith(f"kafka_cluster {cluster!r}") and f"e.g. {suggestion!r}" in problem
    assert hook.problems({**GOOD, "kafka_cluster": "prod-kafka"}) == []
