"""Generating services from the template (pytest-cookies), as cookiecutter-django tests itself."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

REPO = pathlib.Path(__file__).resolve().parents[1]
# The release this template is (scripts/release.py writes it): what a bake requires by default.
DEFAULT_REQUIREMENT = json.loads((REPO / "cookiecutter.json").read_text())["detectorkit_requirement"]
WORKFLOWS = REPO / "{{cookiecutter.service_name}}" / ".github" / "workflows"
# The template repository's own: its CI and its release.
TEMPLATE_WORKFLOWS = REPO / ".github" / "workflows"

# Unrendered template code. Not any "{{": the baked CI workflow legitimately holds GitHub's ${{ }}.
LEFTOVER = re.compile(r"\{\{-?\s*cookiecutter\.|\{%-?\s*(if|elif|else|endif|for|endfor|set|raw)\b")

COMBINATIONS = [
    {},
    {"service_name": "fraud-velocity", "description": "Too many orders from one card in a minute.", "detector_kind": "burst"},
    {"service_name": "gone-quiet", "description": "Customers who stopped sending records.", "detector_kind": "silence"},
    {"service_name": "big-hours", "description": "Customers who spent more than 10,000 in an hour.", "detector_kind": "totals"},
    {"service_name": "fraud-score", "description": "Orders a trained model scores as fraud.", "detector_kind": "model"},
    {"service_name": "x", "input_topic": "orders_v2", "output_topic": "alerts.fraud", "dlq_topic": "x-dead"},
    {"service_name": "geo-mismatch", "package_name": "geo", "consumer_group": "geo.v3", "author_name": "Ana O'Neil"},
    {"service_name": "quotes", "description": 'Says "hello" \\ and {braces}'},
    {"service_name": "from-git", "detectorkit_requirement": "detectorkit @ git+https://git.example.com/diamond.git#subdirectory=detectorkit"},
]


def test_every_detector_kind_is_baked_and_linted_here_and_its_suite_run():
    from test_baked_project import SUITES

    kinds = json.loads((REPO / "cookiecutter.json").read_text())["detector_kind"]
    assert {extra.get("detector_kind", kinds[0]) for extra in COMBINATIONS} == set(kinds)
    assert {extra.get("detector_kind", kinds[0]) for extra in SUITES.values()} == set(kinds) == set(SUITES)


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

    for name in (
        "pyproject.toml",
        "README.md",
        "Dockerfile",
        ".env.example",
        f"src/{package}/detector.py",
        f"src/{package}/__main__.py",
        "tests/test_detector.py",
        "tests/test_integration.py",
        ".gitignore",
        "Makefile",
        ".github/workflows/ci.yml",
        "renovate.json",
        "deploy/values.yaml",
        "deploy/shadow/values.yaml",
        "deploy/strimzi/values.yaml",
        "deploy/strimzi/strimzi.yaml",
    ):
        assert (project / name).is_file(), name

    meta = tomllib.loads((project / "pyproject.toml").read_text())
    assert meta["project"]["name"] == service
    requirement = Requirement(extra.get("detectorkit_requirement", DEFAULT_REQUIREMENT))
    # A model's service scores with ONNX Runtime (the model extra); its developer trains (the train extra).
    model = extra.get("detector_kind") == "model"
    (dependency,) = [Requirement(r) for r in meta["project"]["dependencies"]]
    assert (dependency.name, dependency.extras, dependency.specifier, dependency.url) == (
        "detectorkit",
        {"model"} if model else set(),
        requirement.specifier,
        requirement.url,
    )
    # Developing it needs detectorkit's test extra (the plugin's brokers, the embedded one for `make run`),
    # from the same place as the dependency; the image installs the dependency alone.
    tested = Requirement(meta["project"]["optional-dependencies"]["test"][0])
    expected = {"test", "train"} if model else {"test"}
    assert (tested.name, tested.extras, tested.specifier, tested.url) == ("detectorkit", expected, requirement.specifier, requirement.url)
    # Nothing points back into this repository: the project lives in a repository of its own.
    readme = (project / "README.md").read_text()
    assert "../" not in readme
    assert meta["project"]["scripts"] == {service: f"{package}.__main__:main"}
    main = (project / "src" / package / "__main__.py").read_text()
    for answer in ("input_topic", "output_topic", "dlq_topic", "consumer_group"):
        default = {"input_topic": "records.normalized", "output_topic": "detections", "dlq_topic": f"{service}.dlq", "consumer_group": service}[
            answer
        ]
        assert f'"{answer}": "{extra.get(answer, default)}"' in main


@pytest.mark.parametrize("extra", COMBINATIONS, ids=lambda e: e.get("service_name", "default"))
def test_baked_project_passes_ruff_check_and_format(cookies, extra):
    result = cookies.bake(extra_context=extra)
    for command in (["check", "."], ["format", "--check", "."]):
        run = subprocess.run([sys.executable, "-m", "ruff", *command], cwd=result.project_path, capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr


def test_baked_ci_workflow_is_a_valid_github_workflow_with_githubs_own_expressions(cookies):
    result = cookies.bake()
    project = pathlib.Path(result.project_path)
    path = project / ".github" / "workflows" / "ci.yml"
    # The template's own files too: the weekly update workflow is baked only by cruft (and copied
    # as it is, never rendered).
    workflows = sorted(str(p) for p in [*path.parent.glob("*.yml"), *WORKFLOWS.glob("*.yml"), *TEMPLATE_WORKFLOWS.glob("*.yml")])
    assert not (project / ".github" / "workflows" / "template-update.yml").exists()  # a plain bake: nothing to update it
    run = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", *workflows], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    workflow = yaml.safe_load(path.read_text())
    jobs = workflow["jobs"]
    steps = [step for job in jobs.values() for step in job["steps"]]
    commands = "\n".join(step.get("run", "") for step in steps)

    # detectorkit from the team's index alone (--index-url semantics), left to GitHub, not rendered by
    # cookiecutter; never an extra index beside PyPI, where a package of the same name would win.
    assert workflow["env"]["PIP_INDEX_URL"] == "${{ secrets.PIP_INDEX_URL }}"
    environments = [workflow.get("env", {})] + [job.get("env", {}) for job in jobs.values()] + [s.get("env", {}) for s in steps]
    assert not any("PIP_EXTRA_INDEX_URL" in env for env in environments)
    assert "extra-index-url" not in commands and "PIP_EXTRA_INDEX_URL" not in commands
    # An unset secret stops the jobs that install detectorkit instead of falling back to public PyPI.
    for name in ("unit", "integration"):
        assert jobs[name]["steps"][0]["if"] == "env.PIP_INDEX_URL == ''" and "exit 1" in jobs[name]["steps"][0]["run"]

    # It runs what a developer runs: make targets the Makefile has, the same four a developer uses.
    makefile = (project / "Makefile").read_text()
    called = set(re.findall(r"\bmake ([\w-]+)", commands))
    assert called == {"install", "lint", "test-unit", "test"}, called
    for target in called:
        assert re.search(rf"^{target}:", makefile, re.M), f"CI calls make {target}, which the Makefile lacks"
    # Installs exactly as locked: a lock pyproject.toml has outgrown fails CI instead of being rewritten there.
    assert workflow["env"]["UV_LOCKED"] == "1"
    # A template update is a pull request of its own (template-update.yml), never a red CI here.
    assert "cruft" not in commands

    # The image is built from the same lock, the index a build secret (the Dockerfile's id), pushed
    # only from main where a repository is configured.
    build = next(step for step in jobs["image"]["steps"] if step.get("uses", "").startswith("docker/build-push-action"))
    secret_id = re.search(r"--mount=type=secret,id=([\w-]+)", (project / "Dockerfile").read_text())[1]
    assert build["with"]["secrets"].strip().splitlines() == [f"{secret_id}=${{{{ secrets.PIP_INDEX_URL }}}}"]
    assert "PIP_INDEX_URL" not in build["with"]["build-args"]
    assert jobs["image"]["env"]["PUSH"] == "${{ github.event_name == 'push' && vars.IMAGE_REPOSITORY != '' }}"
    assert build["with"]["push"] == "${{ env.PUSH == 'true' }}"

    # The unit tests on the oldest and the newest Python the service declares.
    classifiers = tomllib.loads((project / "pyproject.toml").read_text())["project"]["classifiers"]
    declared = sorted((c.rsplit(" ", 1)[1] for c in classifiers if re.fullmatch(r".* :: 3\.\d+", c)), key=lambda v: int(v.split(".")[1]))
    assert jobs["unit"]["strategy"]["matrix"]["python-version"] == [declared[0], declared[-1]] == ["3.11", "3.13"]
    setup = next(step for step in jobs["unit"]["steps"] if step.get("uses", "").startswith("actions/setup-python"))
    assert setup["with"]["python-version"] == "${{ matrix.python-version }}"
    assert "make test" in [step.get("run") for step in jobs["integration"]["steps"]]


# The newest major of each action the baked workflows use (Renovate keeps a baked service current).
ACTION_MAJORS = {
    "actions/checkout": 7,
    "actions/setup-python": 7,
    "actions/setup-java": 6,
    "docker/setup-buildx-action": 4,
    "docker/login-action": 4,
    "docker/metadata-action": 6,
    "docker/build-push-action": 7,
}


def test_baked_workflows_use_each_actions_newest_major(cookies):
    project = pathlib.Path(cookies.bake().project_path)
    uses = [
        step["uses"]
        for path in [*(project / ".github" / "workflows").glob("*.yml"), *WORKFLOWS.glob("*.yml"), *TEMPLATE_WORKFLOWS.glob("*.yml")]
        for job in yaml.safe_load(path.read_text())["jobs"].values()
        for step in job["steps"]
        if "uses" in step
    ]
    assert uses
    for use in uses:
        action, _, ref = use.partition("@")
        assert action in ACTION_MAJORS, f"{use}: an action the table of majors lacks"
        assert ref == f"v{ACTION_MAJORS[action]}", f"{use}: not the newest major, v{ACTION_MAJORS[action]}"


def test_baked_renovate_config_is_valid_and_finds_every_pin_it_names(cookies):
    project = pathlib.Path(cookies.bake().project_path)
    path = project / "renovate.json"
    run = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.renovate", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    config = json.loads(path.read_text())
    # Renovate's schema lets unknown keys through: every key must be one of its options.
    import check_jsonschema

    schema = json.loads((pathlib.Path(check_jsonschema.__file__).parent / "builtin_schemas" / "vendor" / "renovate.json").read_text())
    options = set(schema["definitions"])
    for where in [config, config["lockFileMaintenance"], *config["packageRules"], *config["customManagers"]]:
        unknown = {key for key in where if key != "$schema"} - options
        assert not unknown, f"not Renovate options: {unknown}"
    assert config["lockFileMaintenance"]["enabled"] is True  # uv.lock refreshed on a schedule, not left to age
    # Each custom manager's patterns find one pin in each file it names, all the same version.
    for manager in config["customManagers"]:
        found = []
        for pattern in manager["managerFilePatterns"]:
            files = [p for p in project.iterdir() if p.is_file() and re.search(pattern.strip("/"), p.name)]
            assert len(files) == 1, (pattern, files)
            text = files[0].read_text()
            # Renovate's named groups are JavaScript's, (?<name>...); Python writes (?P<name>...).
            hits = [m["currentValue"] for s in manager["matchStrings"] for m in re.finditer(s.replace("(?<", "(?P<"), text)]
            assert len(hits) == 1, (files[0].name, hits)
            found += hits
        assert len(set(found)) == 1, f"{manager['depNameTemplate']} pinned differently: {found}"


def test_one_apache_kafka_version_in_the_tests_the_baked_ci_and_compose(cookies):
    # The version the runtime's tests start (jars from Maven Central) is the one every image names.
    from detectorkit.devtools.kafka_broker import KAFKA_VERSION

    result = cookies.bake()
    workflow = yaml.safe_load((pathlib.Path(result.project_path) / ".github" / "workflows" / "ci.yml").read_text())
    assert workflow["jobs"]["integration"]["services"]["kafka"]["image"] == f"apache/kafka:{KAFKA_VERSION}"
    compose = yaml.safe_load((REPO / "deploy" / "compose.yaml").read_text())
    assert compose["services"]["kafka"]["image"] == f"apache/kafka:{KAFKA_VERSION}"


def test_baked_project_declares_python_3_11_and_newer_everywhere(cookies):
    # detectorkit uses datetime.UTC (3.11): the service cannot promise an older Python.
    project = pathlib.Path(cookies.bake().project_path)
    meta = tomllib.loads((project / "pyproject.toml").read_text())
    python = SpecifierSet(meta["project"]["requires-python"])
    assert not python.contains("3.10.13") and all(python.contains(f"3.{minor}.0") for minor in (11, 12, 13))
    assert {f"Programming Language :: Python :: 3.{minor}" for minor in (11, 12, 13)} <= set(meta["project"]["classifiers"])
    assert not any(":: 3.10" in c for c in meta["project"]["classifiers"])
    assert meta["tool"]["ruff"]["target-version"] == "py311"


def test_baked_pre_commit_config_is_valid_and_its_ruff_passes_the_bake_and_stops_a_bad_commit(cookies, tmp_path):
    project = pathlib.Path(cookies.bake().project_path)
    pre_commit = [sys.executable, "-m", "pre_commit"]
    run = subprocess.run([*pre_commit, "validate-config", ".pre-commit-config.yaml"], cwd=project, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    config = yaml.safe_load((project / ".pre-commit-config.yaml").read_text())
    hooks = {hook["id"]: hook for repo in config["repos"] for hook in repo["hooks"]}
    assert {"ruff-check", "ruff-format"} <= hooks.keys()
    # The pinned ruff is one `make lint` also accepts (the test extra's floor).
    floor = next(
        Requirement(r)
        for r in tomllib.loads((project / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
        if r.startswith("ruff")
    )
    for hook in hooks.values():
        pinned = Requirement(hook["additional_dependencies"][0])
        assert pinned.name == "ruff" and str(pinned.specifier).startswith("==")
        assert floor.specifier.contains(str(pinned.specifier)[2:]), f"pre-commit's {pinned} is below the test extra's {floor}"

    # The hooks themselves, ruff installed from the package index by pre-commit, on a fresh git repository.
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    for command in (["init", "-q", "-b", "main"], ["add", "-A"]):
        subprocess.run(["git", *command], cwd=project, check=True, env=env)
    run = subprocess.run([*pre_commit, "run", "--all-files"], cwd=project, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    detector = next(project.glob("src/*/detector.py"))
    detector.write_text("import sys\nimport os\n" + detector.read_text())
    run = subprocess.run([*pre_commit, "run", "--files", str(detector)], cwd=project, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode != 0 and "ruff check" in run.stdout, run.stdout


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
        ({"detectorkit_requirement": "detectorkit @ https://x.example.com/$TOKEN/detectorkit.whl"}, "percent-encode it"),
        ({"detectorkit_requirement": 'detectorkit>=0.1"'}, "which the Dockerfile cannot carry"),
        ({"description": 'quote " and \\ backslash', "service_name": "Bad Name"}, "is not a kebab-case slug"),
    ],
)
def test_bad_answers_are_refused_with_what_to_type(cookies, capfd, extra, message):
    result = cookies.bake(extra_context=extra)
    assert result.exit_code != 0
    assert "Hook script failed" in str(result.exception)
    assert message in capfd.readouterr().err
    assert result.project_path is None or not pathlib.Path(result.project_path).exists()


def test_make_run_reads_a_dot_env_made_from_the_example(cookies):
    """`.env.example` is read by something: copied to .env, `make run` hands it to the job."""
    project = pathlib.Path(cookies.bake().project_path)

    def job_command() -> str:
        # Under another make (CI's), a make also prints the directories it enters: not wanted here.
        shown = subprocess.run(["make", "-n", "--no-print-directory", "run"], cwd=project, capture_output=True, text=True)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        return shown.stdout.rstrip().splitlines()[-1]

    assert job_command() == ".venv/bin/python -m high_value_orders"
    shutil.copy(project / ".env.example", project / ".env")
    assert job_command() == ".venv/bin/python -m high_value_orders --env-file .env"
    from detectorkit.settings import load, read_env_file

    environ: dict[str, str] = {}
    read_env_file(str(project / ".env"), environ)
    assert load(environ=environ).input_topic == "records.normalized"
