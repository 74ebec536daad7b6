"""Run the {{ cookiecutter.service_name }} job: `{{ cookiecutter.service_name }} --help` lists the settings."""

import sys

from detectorkit.cli import run_detector

# Absolute, not relative: spark-submit runs this file as a script, outside its package.
from {{ cookiecutter.package_name }}.detector import DETECTOR

# The answers given when the service was generated; environment variables and flags override them.
DEFAULTS = {
    "input_topic": "{{ cookiecutter.input_topic }}",
    "output_topic": "{{ cookiecutter.output_topic }}",
    "dlq_topic": "{{ cookiecutter.dlq_topic }}",
    "consumer_group": "{{ cookiecutter.consumer_group }}",
}


def main() -> int:
    return run_detector(DETECTOR, defaults=DEFAULTS)


if __name__ == "__main__":
    sys.exit(main())
