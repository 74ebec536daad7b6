"""detectorkit: the runtime of detector services, PySpark Structured Streaming jobs on Kafka."""

from detectorkit.detector import Detector, NoConfig

__all__ = ["Detector", "NoConfig"]
__version__ = "0.1.0"
