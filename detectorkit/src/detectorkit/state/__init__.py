"""Keyed state kept across slices and restarts: declared by a detector, held per input partition in the
task that processes the partition, backed by a compacted changelog topic in Kafka."""

from detectorkit.state.columns import lists
from detectorkit.state.declaration import State, StateSchemaError

__all__ = ["State", "StateSchemaError", "lists"]
