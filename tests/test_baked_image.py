"""The baked service's image, read as a builder reads it: the Dockerfile through a real parser for every
combination of answers, and the build context as the baked .dockerignore leaves it."""

import pathlib
import re
import tomllib

import docker.utils
import pytest
import yaml
from dockerfile_parse import DockerfileParser
from dockerfile_parse.util import WordSplitter
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from test_bake import COMBINATIONS, DEFAULT_REQUIREMENT

SHELL_SEPARATORS = {"&&", "||", ";", "|"}


def bake(cookies, extra) -> pathlib.Path:
    result = cookies.bake(extra_context=extra)
    assert result.exit_code == 0, result.exception
    return pathlib.Path(result.project_path)


def run_commands(dockerfile: pathlib.Path) -> list[list[str]]:
    """Each simple command of the Dockerfile's RUN instructions, after Docker's own quoting rules and
    with each ARG's default (or ENV) substituted, as the build's shell sees them."""
    parser = DockerfileParser(path=str(dockerfile), env_replace=True, build_args={})
    commands = []
    for instruction, context in zip(parser.structure, parser.context_structure, strict=True):
        if instruction["instruction"] != "RUN":
            continue
        command: list[str] = []
        for word in [*WordSplitter(instruction["value"], args=context.args, envs=context.envs).split(), ";"]:
            if word not in SHELL_SEPARATORS:
                command.append(word)
            elif command:
                commands.append(command)
                command = []
    return commands


def invocations(commands: list[list[str]], program: str, subcommand: str) -> list[list[str]]:
    """The arguments after `program subcommand` (a path to the program counts) in each command."""
    return [
        command[start + 2 :]
        for command in commands
        for start in range(len(command) - 1)
        if command[start].rsplit("/", 1)[-1] == program and command[start + 1] == subcommand
    ]


@pytest.mark.parametrize("extra", COMBINATIONS, ids=lambda e: e.get("service_name", "default"))
def test_the_baked_image_installs_the_service_and_its_dependencies_exactly_as_locked(cookies, extra):
    project = bake(cookies, extra)
    dockerfile = project / "Dockerfile"
    commands = run_commands(dockerfile)
    syncs = invocations(commands, "uv", "sync")
    # The dependencies, then the service: every sync refuses a lock that pyproject.toml has outgrown,
    # installs the service itself rather than a link to /app/src, and leaves the test tools out.
    assert len(syncs) == 2 and syncs[0][-1] == "--no-install-project", syncs
    for arguments in syncs:
        assert "--locked" in arguments and "--no-editable" in arguments and "--extra" not in arguments, arguments
    # Nothing installs around the lock: pip installs uv alone, at the Makefile's pin.
    (uv,) = invocations(commands, "pip", "install")
    pin = re.search(r"^UV_VERSION \?= (\S+)$", (project / "Makefile").read_text(), re.M)
    assert [word for word in uv if not word.startswith("-")] == [f"uv=={pin[1]}"], uv
    copies = [i["value"].split() for i in DockerfileParser(path=str(dockerfile)).structure if i["instruction"] == "COPY"]
    assert any("uv.lock" in words[:-1] for words in copies), copies
    # One source for the requirement on detectorkit: pyproject.toml, which the lock follows.
    answer = Requirement(extra.get("detectorkit_requirement", DEFAULT_REQUIREMENT))
    meta = tomllib.loads((project / "pyproject.toml").read_text())
    (dependency,) = [Requirement(d) for d in meta["project"]["dependencies"]]
    assert (dependency.name, dependency.specifier, dependency.url) == (answer.name, answer.specifier, answer.url)
    assert str(answer) not in dockerfile.read_text() and "DETECTORKIT_SPEC" not in dockerfile.read_text()
    if answer.url and answer.url.startswith("git+"):
        apt = next(
            i["value"] for i in DockerfileParser(path=str(dockerfile)).structure if i["instruction"] == "RUN" and "apt-get install" in i["value"]
        )
        assert re.search(r"\bgit\b", apt), "uv needs git in the image to fetch a git reference"


def test_the_images_python_is_one_the_service_declares_and_ci_tests(cookies):
    project = bake(cookies, {})
    base = DockerfileParser(path=str(project / "Dockerfile")).baseimage
    version = re.fullmatch(r"python:(3\.\d+)-slim-\w+", base)
    assert version, f"base image {base!r} is not an official slim Python image"
    meta = tomllib.loads((project / "pyproject.toml").read_text())
    assert SpecifierSet(meta["project"]["requires-python"]).contains(f"{version[1]}.0")
    assert f"Programming Language :: Python :: {version[1]}" in meta["project"]["classifiers"]
    workflow = yaml.safe_load((project / ".github" / "workflows" / "ci.yml").read_text())
    # The integration job runs the service on the image's Python.
    setup = next(s for s in workflow["jobs"]["integration"]["steps"] if s.get("uses", "").startswith("actions/setup-python"))
    assert setup["with"]["python-version"] == version[1]


def test_the_build_context_leaves_out_secrets_and_local_state_but_keeps_what_the_image_copies(cookies):
    project = bake(cookies, {})
    package = "high_value_orders"
    # Secrets and local state, none of which may reach the image builder.
    private = [
        ".env",
        ".env.local",
        ".git/config",
        ".venv/pyvenv.cfg",
        f"src/{package}/__pycache__/detector.cpython-311.pyc",
        ".pytest_cache/v/cache/nodeids",
        ".ruff_cache/CACHEDIR.TAG",
        ".hypothesis/examples/0f/1a",
        "build/lib/x.py",
        "dist/x.whl",
        f"src/{package}.egg-info/PKG-INFO",
    ]
    for name in [*private, "tests/__pycache__/x.pyc", "wheels/detectorkit-0.1.0-py3-none-any.whl", "uv.lock"]:
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text("x")
    patterns = [line.strip() for line in (project / ".dockerignore").read_text().splitlines() if line.strip() and not line.startswith("#")]
    # docker-py's implementation of the Docker CLI's .dockerignore rules (Go's filepath.Match, `**`, `!`).
    sent = docker.utils.exclude_paths(str(project), patterns, dockerfile="Dockerfile")
    for leaked in private:
        assert leaked not in sent, f"{leaked} would be sent to the image builder"
    for needed in (
        "Dockerfile",
        "pyproject.toml",
        "uv.lock",
        f"src/{package}/__init__.py",
        f"src/{package}/detector.py",
        f"src/{package}/__main__.py",
        "wheels/detectorkit-0.1.0-py3-none-any.whl",
    ):
        assert needed in sent, f"the image copies {needed}, but .dockerignore leaves it out"
