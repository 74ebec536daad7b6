"""The command line: `detectorkit ...`, and `run_detector` for a generated service's `__main__`."""

from detectorkit.cli.main import main
from detectorkit.cli.run import run_detector

__all__ = ["main", "run_detector"]
