"""Generating services from the template (pytest-cookies), as cookiecutter-django tests itself."""

import pathlib
import re
import subprocess
import sys

import pytest
import tomllib

# Unrendered template code. Not any "{{": the baked CI workflow legitimately holds GitHub's ${{ }}.
LEFTOVER = re.compile(r"\{\{-?\s*cookiecutter\.|\{%-?\s*(if|elif|else|endif|for|endfor|set|raw)\b")

COMBINATIONS = [
    {},
    {"service_name": "fraud-velocity", "description": "Too many orders from one card in a minute.", "detector_kind": "burst"},
    {"service_name": "x", "input_topic": "orders_v2", "output_topic": "alerts.fraud", "dlq_topic": "x-dead"},
    {"service_name": "geo-mismatch", "package_name": "geo", "consumer_group": "geo.v3", "author_name": "Ana O'Neil"},
    {"service_name": "quotes", "description": 'Says "hello" \\ and {braces}'},
    {"service_name": "from-git", "detectorkit_requirement": "detectorkit @ git+https://git.example.com/diamond.git#subdirectory=detectorkit"},
]


def baked_files(path: pathlib.Path):
    return [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts]


@pytest.mark.parametrize("extra", COMBINATIONS, ids=lambda e: e.get("service_name", "default"))
def test_bake_renders_everything(cookies, extra):
    result = cookies.bake(extra_context=extra)
    assert result.exit_code == 0, result.exception
    assert result.exception is None
    project = pathlib.Path(result.project_path)
    service = extra.get("service_name", "high-value-orders")
    package = extra.get("package_name", service.replace("-", "_"))
    assert project.name == service

    for path in baked_files(project):
        text = path.read_text(errors="replace")
        assert not LEFTOVER.search(text), f"unrendered template code in {path.relative_to(project)}"

    for name in ("pyproject.toml", "README.md", "Dockerfile", ".env.example", f"src/{package}/detector.py",
                 f"src/{package}/__main__.py", "tests/test_detector.py", "tests/test_integration.py", ".gitignore", "Makefile",
                 ".github/workflows/ci.yml", "deploy/k8s/deployment.yaml"):
        assert (project / name).is_file(), name

    meta = tomllib.loads((project / "pyproject.toml").read_text())
    assert meta["project"]["name"] == service
    assert meta["project"]["dependencies"] == [extra.get("detectorkit_requirement", "detectorkit>=0.1,<0.2")]
    # Nothing points back into this repository: the project lives in a repository of its own.
    readme = (project / "README.md").read_text()
    assert "../" not in readme
    assert meta["project"]["scripts"] == {service: f"{package}.__main__:main"}
    main = (project / "src" / package / "__main__.py").read_text()
    for answer in ("input_topic", "output_topic", "dlq_topic", "consumer_group"):
        default = {"input_topic": "records.normalized", "output_topic": "detections",
                   "dlq_topic": f"{service}.dlq", "consumer_group": service}[answer]
        assert f'"{answer}": "{extra.get(answer, default)}"' in main


@pytest.mark.parametrize("extra", COMBINATIONS, ids=lambda e: e.get("service_name", "default"))
def test_baked_project_passes_ruff_check_and_format(cookies, extra):
    result = cookies.bake(extra_context=extra)
    for command in (["check", "."], ["format", "--check", "."]):
        run = subprocess.run([sys.executable, "-m", "ruff", *command], cwd=result.project_path, capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr


def test_baked_ci_workflow_is_a_valid_github_workflow_with_githubs_own_expressions(cookies):
    result = cookies.bake()
    workflow = pathlib.Path(result.project_path) / ".github" / "workflows" / "ci.yml"
    run = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(workflow)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    text = workflow.read_text()
    assert "${{ secrets.PIP_EXTRA_INDEX_URL }}" in text  # left to GitHub, not rendered by cookiecutter
    # It runs what the Makefile runs, so a developer reproduces CI with make.
    makefile = (pathlib.Path(result.project_path) / "Makefile").read_text()
    for target in ("install", "test-unit"):
        assert f"make {target}" in text and f"{target}:" in makefile
    assert "ruff format --check ." in text and "ruff format --check ." in makefile
    assert "cruft check" in text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"service_name": "High Value"}, "service_name 'High Value' is not a kebab-case slug"),
        ({"service_name": "high_value"}, "e.g. 'high-value'"),
        ({"package_name": "class"}, "package_name 'class' is a Python keyword"),
        ({"package_name": "my-pkg"}, "package_name 'my-pkg' is not a Python identifier"),
        ({"input_topic": "orders in"}, "input_topic 'orders in' has characters Kafka does not allow"),
        ({"output_topic": ".."}, "output_topic '..' is not allowed by Kafka"),
        ({"dlq_topic": "d" * 250}, "Kafka allows at most 249"),
        ({"output_topic": "records.normalized"}, "three different topics"),
        ({"author_email": "nobody"}, "is not an e-mail address"),
        ({"detectorkit_requirement": "pandas>=2"}, "is not a requirement on detectorkit: type a version range"),
        ({"description": 'quote " and \\ backslash', "service_name": "Bad Name"}, "is not a kebab-case slug"),
    ],
)
def test_bad_answers_are_refused_with_what_to_type(cookies, capfd, extra, message):
    result = cookies.bake(extra_context=extra)
    assert result.exit_code != 0
    assert "Hook script failed" in str(result.exception)
    assert message in capfd.readouterr().err
    assert result.project_path is None or not pathlib.Path(result.project_path).exists()
