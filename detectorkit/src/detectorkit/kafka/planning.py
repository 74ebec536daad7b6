"""Where a job starts reading, the ranges its tasks take and the errors of records gone, as pure
functions so they can be tested without a broker. Offsets are per partition: ``{partition: next
offset to read}``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

Offsets = dict[int, int]

STARTING_POLICIES = ("latest", "earliest", "error")


class DataLossError(RuntimeError):
    """Records the job was planned to read are gone (retention, a deleted or re-created topic)."""


def data_loss(problem: str) -> DataLossError:
    """The error that stops a job whose records are gone, saying what to do about it."""
    return DataLossError(f"{problem}. Some records were never processed. Set FAIL_ON_DATA_LOSS=false to skip ahead.")


def deleted_input_topic(topic: str, fail_on_data_loss: bool) -> str:
    """The input topic was deleted while the job read it: the DataLossError that stops the job, or
    with FAIL_ON_DATA_LOSS=false the problem for the caller's warning as it skips ahead."""
    problem = f"topic {topic!r} was deleted while the job read it"
    if fail_on_data_loss:
        raise data_loss(problem) from None
    return problem


class NoCommittedOffsetsError(RuntimeError):
    """STARTING_OFFSETS=error and the consumer group has no committed offset for a partition."""


@dataclass(frozen=True)
class PartitionRange:
    """Offsets [start, end) of one Kafka partition: one Spark input partition, one task."""

    topic: str
    partition: int
    start: int
    end: int
    # A partition the job has not seen before starts at its earliest record; if retention already
    # removed offsets from `start` on, that is not data loss, just where the partition begins.
    from_earliest: bool = False
    # The source's newest tick when planned (SourceOptions.tick_seconds): a tick changes state (timers
    # fire) without moving the offset, so a state store knows it is current by (offset, tick).
    tick: int = 0
    # When that tick began (ms): the end offsets were listed after it, so a quiet partition's records
    # not yet seen were stamped after it less the producer's delay. A tick's timers fire by this time,
    # not by when a busy executor got to run the task (a record stamped between would be late).
    tick_ms: int | None = None
    # Planned to the partition's end (SourceOptions.marks_caught_up): nothing else waited behind it.
    caught_up: bool = False

    @property
    def size(self) -> int:
        return self.end - self.start


def resolve_start(
    committed: Mapping[int, int | None],
    earliest: Mapping[int, int],
    latest: Mapping[int, int],
    policy: str,
    topic: str = "",
    group: str = "",
) -> Offsets:
    """Where the job starts: the group's committed offset, else the policy's choice.

    A committed offset outside the partition's current range is where retention or a re-created
    topic moved things; it is kept as is so that reading it reports data loss the configured way.
    """
    if policy not in STARTING_POLICIES:
        raise ValueError(f"starting offsets policy must be one of {', '.join(STARTING_POLICIES)}, not {policy!r}")
    start: Offsets = {}
    missing = []
    for partition in sorted(latest):
        offset = committed.get(partition)
        if offset is not None and offset >= 0:
            start[partition] = offset
        elif policy == "latest":
            start[partition] = latest[partition]
        elif policy == "earliest":
            start[partition] = earliest.get(partition, 0)
        else:
            missing.append(partition)
    if missing:
        raise NoCommittedOffsetsError(
            f"consumer group {group!r} has no committed offset for topic {topic!r} partition(s) "
            f"{', '.join(map(str, missing))} and STARTING_OFFSETS=error; "
            "set STARTING_OFFSETS=latest or earliest to choose where to start"
        )
    return start
