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
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from test_bake import COMBINATIONS

# pip's options that take a value (the next word), as the Dockerfile may use them.
PIP_VALUED_OPTIONS = {
    "-f",
    "--find-links",
    "-i",
    "--index-url",
    "--extra-index-url",
    "-r",
    "--requirement",
    "-c",
    "--constraint",
    "-t",
    "--target",
    "--prefix",
    "--root",
    "--cache-dir",
    "--no-binary",
    "--only-binary",
}
SHELL_SEPARATORS = {"&&", "||", ";", "|"}


def bake(cookies, extra) -> pathlib.Path:
    result = cookies.bake(extra_context=extra)
    assert result.exit_code == 0, result.exception
    return pathlib.Path(result.project_path)


def pip_installs(dockerfile: pathlib.Path) -> list[list[str]]:
    """The arguments of each `pip install` in the Dockerfile's RUN instructions, after Docker's own
    quoting rules and with each ARG's default (or ENV) substituted, as the build's shell sees them."""
    parser = DockerfileParser(path=str(dockerfile), env_replace=True, build_args={})
    installs = []
    for instruction, context in zip(parser.structure, parser.context_structure, strict=True):
        if instruction["instruction"] != "RUN":
            continue
        words = list(WordSplitter(instruction["value"], args=context.args, envs=context.envs).split())
        command: list[str] = []
        for word in [*words, ";"]:
            if word not in SHELL_SEPARATORS:
                command.append(word)
                continue
            for start in range(len(command) - 1):
                if command[start].rsplit("/", 1)[-1] in ("pip", "pip3") and command[start + 1] == "install":
                    installs.append(command[start + 2 :])
            command = []
    return installs


def requirements_in(arguments: list[str]) -> list[Requirement]:
    """pip install's arguments: each is an option (with its value), a path, or a PEP 508 requirement."""
    found = []
    words = iter(arguments)
    for word in words:
        if word in PIP_VALUED_OPTIONS:
            value = next(words, None)
            assert value and not value.startswith("-"), f"pip option {word} lacks its value"
        elif word.startswith("-") or word.startswith((".", "/")):
            continue
        else:
            try:
                found.append(Requirement(word))
            except InvalidRequirement as error:
                raise AssertionError(f"pip install {word!r}: not a requirement pip accepts ({error})") from None
    return found


@pytest.mark.parametrize("extra", COMBINATIONS, ids=lambda e: e.get("service_name", "default"))
def test_every_pip_install_in_the_baked_dockerfile_gets_valid_requirements(cookies, extra):
    project = bake(cookies, extra)
    installs = pip_installs(project / "Dockerfile")
    assert len(installs) >= 2, installs  # detectorkit, then the service itself
    requirements = [r for arguments in installs for r in requirements_in(arguments)]
    answer = Requirement(extra.get("detectorkit_requirement", "detectorkit>=0.1,<0.2"))
    assert answer in requirements, f"the image installs {[str(r) for r in requirements]}, not the answer {answer}"
    # The same requirement as the service's own metadata: the image and `pip install .` agree.
    meta = tomllib.loads((project / "pyproject.toml").read_text())
    assert [Requirement(d) for d in meta["project"]["dependencies"]] == [answer]
    # The service installs without build isolation (no index needed then): its build backend is installed first.
    for needed in meta["build-system"]["requires"]:
        assert Requirement(needed) in requirements, f"the image does not install the build backend {needed}"
    if answer.url and answer.url.startswith("git+"):
        apt = next(
            i["value"]
            for i in DockerfileParser(path=str(project / "Dockerfile")).structure
            if i["instruction"] == "RUN" and "apt-get install" in i["value"]
        )
        assert re.search(r"\bgit\b", apt), "pip needs git in the image to fetch a git reference"


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
    for name in [*private, "tests/__pycache__/x.pyc", "wheels/detectorkit-0.1.0-py3-none-any.whl"]:
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
        f"src/{package}/__init__.py",
        f"src/{package}/detector.py",
        f"src/{package}/__main__.py",
        "wheels/detectorkit-0.1.0-py3-none-any.whl",
    ):
        assert needed in sent, f"the image copies {needed}, but .dockerignore leaves it out"
