"""Keep the chosen detector kind's files under their usual names, and drop the other kinds'; keep
the weekly template update only in a service that cruft generated (it updates nothing else).

The template holds each kind's detector and tests as plain files in `_kinds/<kind>/`, rather than
one file per name with a Jinja branch per kind, so each reads as the Python it bakes to (the way
cookiecutter-django keeps optional files whole and lets its post-generation hook choose). Cookiecutter
runs this in the baked project, after rendering the file; the pre-generation hook has already
refused any kind or package name that is not a plain word, so the literals below need no escaping.
"""

from __future__ import annotations

import pathlib
import shutil

KINDS = "_kinds"


def places(package: str) -> dict[str, str]:
    """Each file a kind's folder may hold, and where it goes in the baked project: every kind has the
    first three; a model's has its training script and the model it made."""
    return {
        "detector.py": f"src/{package}/detector.py",
        "test_detector.py": "tests/test_detector.py",
        "test_integration.py": "tests/test_integration.py",
        "train.py": "train.py",
        "model.onnx": f"src/{package}/model.onnx",
    }


EVERY_KIND = ("detector.py", "test_detector.py", "test_integration.py")


def keep_kind(project: pathlib.Path, kind: str, package: str) -> None:
    chosen = project / KINDS / kind
    for name, place in places(package).items():
        if not (chosen / name).exists():
            continue
        target = project / place
        target.parent.mkdir(parents=True, exist_ok=True)
        (chosen / name).replace(target)
    shutil.rmtree(project / KINDS)


TEMPLATE_UPDATE = ".github/workflows/template-update.yml"


def keep_template_update(project: pathlib.Path, made_by_cruft: bool) -> None:
    """The workflow runs `cruft update`, which needs the `.cruft.json` only `cruft create` writes:
    in a plain cookiecutter bake it would run weekly and do nothing."""
    if not made_by_cruft:
        (project / TEMPLATE_UPDATE).unlink(missing_ok=True)


if __name__ == "__main__":
    keep_kind(pathlib.Path.cwd(), "{{ cookiecutter.detector_kind }}", "{{ cookiecutter.package_name }}")
    # cruft adds the template's commit to the context it generates with; cookiecutter does not.
    keep_template_update(pathlib.Path.cwd(), "{{ cookiecutter._commit | default('') }}" != "")
