"""Offset planning for the Kafka source, as pure functions so they can be tested without a broker.

Offsets are per partition: ``{partition: next offset to read}``. Spark stores them as JSON, so the
source turns them into ``{topic: {"0": offset, ...}}`` at its boundary (see `to_spark`/`from_spark`).
"""

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


def reconcile(start: Mapping[int, int], latest: Mapping[int, int], fail_on_data_loss: bool, topic: str = "") -> tuple[Offsets, set[int], list[str]]:
    """Check `start` against the partitions that exist now.

    Returns the start offsets to plan from, the partitions to read from their earliest record, and
    the data-loss problems that were skipped (raised instead when `fail_on_data_loss`).
    """
    problems = []
    planned: Offsets = {}
    from_earliest: set[int] = set()
    for partition, offset in start.items():
        if partition not in latest:
            problems.append(f"partition {topic}-{partition} no longer exists (was at offset {offset})")
        elif latest[partition] < offset:
            problems.append(
                f"partition {topic}-{partition} ends at offset {latest[partition]}, before the job's "
                f"position {offset}: the topic was deleted or re-created"
            )
            planned[partition] = 0
            from_earliest.add(partition)
        else:
            planned[partition] = offset
    for partition in latest:
        if partition not in start:  # added to the topic since the job started
            planned[partition] = 0
            from_earliest.add(partition)
    if problems and fail_on_data_loss:
        raise data_loss("; ".join(problems))
    return planned, from_earliest, problems


def cap_end_offsets(start: Mapping[int, int], latest: Mapping[int, int], max_records: int | None) -> Offsets:
    """End offsets of the next batch: everything available, or at most `max_records` spread over the
    partitions in proportion to their backlog (Spark's maxOffsetsPerTrigger rule), exactly summing
    to the cap so that a capped batch is as large as allowed."""
    backlog = {p: max(0, latest[p] - start.get(p, 0)) for p in latest}
    total = sum(backlog.values())
    if max_records is None or total <= max_records:
        return {p: start.get(p, 0) + backlog[p] for p in latest}
    if max_records <= 0:
        raise ValueError("max_records must be positive")
    shares = {p: max_records * backlog[p] / total for p in backlog}
    taken = {p: int(shares[p]) for p in backlog}
    left = max_records - sum(taken.values())
    # Largest remainders first; ties go to the lower partition so the plan is deterministic.
    for p in sorted(backlog, key=lambda p: (-(shares[p] - taken[p]), p))[:left]:
        taken[p] += 1
    return {p: start.get(p, 0) + taken[p] for p in latest}


def plan_ranges(topic: str, start: Mapping[int, int], end: Mapping[int, int]) -> list[PartitionRange]:
    """One non-empty range per partition, in partition order.

    A partition missing from `start` (added to the topic) or whose end lies before its start (the
    topic was re-created; `reconcile` already decided that this may be skipped) is read from its
    earliest record.
    """
    ranges = []
    for partition in sorted(end):
        first = start.get(partition)
        from_earliest = first is None or end[partition] < first
        if from_earliest:
            first = 0
        if end[partition] > first:
            ranges.append(PartitionRange(topic, partition, first, end[partition], from_earliest))
    return ranges


# About 50 ms of work for a core here: below that, a second task's overhead costs more than it saves.
MIN_TASK_RECORDS = 5_000


def pack_ranges(ranges: list[PartitionRange], tasks: int, min_records: int = 0) -> list[list[PartitionRange]]:
    """At most `tasks` groups of ranges, and no more than one per `min_records` records, as even
    in records as greedy packing makes them.

    A Spark task costs tens of milliseconds whatever it reads; one task per Kafka partition would
    spend most of a small batch on that. One task per core, each reading its partitions at once,
    keeps large batches parallel; a small batch (a job that has caught up) goes in one task, which
    measured 430 -> 220 ms per micro-batch at 1,000 records/s (with the checkpoint change in
    runtime/spark.py): two tasks of a few hundred records cost two tasks' overhead for nothing.
    """
    if tasks <= 0:
        raise ValueError("tasks must be positive")
    if min_records > 0:
        tasks = max(1, min(tasks, sum(r.size for r in ranges) // min_records))
    groups: list[list[PartitionRange]] = [[] for _ in range(min(tasks, len(ranges)))]
    sizes = [0] * len(groups)
    for r in sorted(ranges, key=lambda r: (-r.size, r.partition)):
        lightest = sizes.index(min(sizes))
        groups[lightest].append(r)
        sizes[lightest] += r.size
    return [sorted(g, key=lambda r: r.partition) for g in groups]


def to_spark(topic: str, offsets: Mapping[int, int]) -> dict:
    return {topic: {str(p): int(o) for p, o in sorted(offsets.items())}}


def from_spark(topic: str, offsets: Mapping | None) -> Offsets:
    if not offsets:
        return {}
    if topic not in offsets:
        raise DataLossError(
            f"the checkpoint holds offsets for topic(s) {', '.join(offsets)}, not {topic!r}; "
            "use a new checkpoint directory when the input topic changes"
        )
    return {int(p): int(o) for p, o in offsets[topic].items()}
