"""detectorkit: the runtime of detector services, PySpark Structured Streaming jobs on Kafka."""

from detectorkit.detector import Detector, NoConfig
from detectorkit.state import State

__all__ = ["Detector", "NoConfig", "State"]
__version__ = "0.1.0"
