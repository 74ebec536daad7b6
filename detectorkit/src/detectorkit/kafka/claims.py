"""Which task of a slice runs which partitions, settled by the slice's tasks on their machine.

Spark runs a task in whichever of the executor's Python workers is free, and a stateful task's
stores live in its worker. On 2 cores the two workers swapped a job's partition groups every batch
(seen in the worker pids of the "state restored" log lines of the stateful benchmark), so every task
found its stores behind and read the other worker's changes back from the changelog. So when all of
a slice's tasks run on one machine (Spark in local mode, as a detector service runs), each task is
given every partition of the slice and claims its share as it starts: first the partitions whose
stores its worker holds, then others, up to an even share; the last task to start takes what is left.

The claims of a slice are one small file, changed under an exclusive lock: a partition is never
run by two tasks of one slice, and a task attempt Spark retries gets the same partitions as the
attempt before it (a claim is kept by the task's index). A slice's file is found by a digest of
its plan, so a slice planned again with the same positions keeps its claims too.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pathlib
import time
from collections.abc import Collection
from dataclasses import dataclass

from detectorkit.kafka.planning import PartitionRange

# Claim files older than this are removed as new ones are written (a batch lasts seconds).
KEEP_SECONDS = 3600.0


@dataclass(frozen=True)
class Claim:
    """What a task needs to claim its partitions: travels with the task's input partition."""

    directory: str
    batch: str  # the digest of the batch's plan
    index: int  # the task's
    tasks: int
    # A task keeps every partition its worker holds and takes none another worker may hold, however
    # uneven: for exactly-once, whose producers fence each other when a partition changes worker.
    sticky: bool = False


def claims_for(directory: str, ranges: list[PartitionRange], tasks: int, sticky: bool = False) -> list[Claim]:
    """One claim per task of a batch planned as `ranges`."""
    plan = json.dumps([[r.topic, r.partition, r.start, r.end, r.tick] for r in sorted(ranges, key=lambda r: r.partition)] + [tasks])
    batch = hashlib.sha256(plan.encode()).hexdigest()[:32]
    return [Claim(directory, batch, index, tasks, sticky) for index in range(tasks)]


def take(claim: Claim, ranges: list[PartitionRange], held: Collection[int], current: Collection[int] | None = None) -> list[PartitionRange]:
    """The ranges this task runs: those it claimed before (a retried attempt), or its share now,
    the partitions of `current` (whose stores this worker has at the range's start) first, then
    the rest of `held` (stores a catch-up away; by default, all of `held` are current)."""
    directory = pathlib.Path(claim.directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{claim.batch}.json"
    with open(path, "a+", encoding="utf-8") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        file.seek(0)
        text = file.read()
        claimed: dict[str, list[int]] = json.loads(text) if text else {}
        mine = claimed.get(str(claim.index))
        if mine is None:
            taken = {p for partitions in claimed.values() for p in partitions}
            mine = _share(claim, ranges, held, held if current is None else current, taken, len(claimed))
            claimed[str(claim.index)] = mine
            file.seek(0)
            file.truncate()
            file.write(json.dumps(claimed))
            file.flush()
    if not text:
        _sweep(directory, path)
    wanted = set(mine)
    return [r for r in ranges if r.partition in wanted]


def _share(claim: Claim, ranges: list[PartitionRange], held: Collection[int], current: Collection[int], taken: set[int], before: int) -> list[int]:
    free = [r for r in ranges if r.partition not in taken]
    if before >= claim.tasks - 1:
        return [r.partition for r in free]  # the last to start: everything left
    if claim.sticky and held:
        # Only its own: what it does not hold, another worker may (the last task takes the rest).
        return [r.partition for r in free if r.partition in held]
    # An even share of the records (an empty range, which only fires timers, counts as one). A
    # partition whose store is not current here costs a catch-up from the changelog, here and again
    # when it moves back: it is taken only if it brings the share nearer the target. Without that, a
    # worker one partition short of its share by a few records took one from the other worker, which
    # took it back the next batch (the stateful benchmark: a catch-up of 10,000-60,000 changelog
    # records every other batch, a store of one partition held by both workers).
    target = sum(max(1, r.size) for r in ranges) / claim.tasks
    mine, records = [], 0
    for r in sorted(free, key=lambda r: (r.partition not in current, r.partition not in held, -r.size, r.partition)):
        if records >= target:
            break
        size = max(1, r.size)
        if r.partition not in current and records and records + size / 2 >= target:
            continue
        mine.append(r.partition)
        records += size
    return mine


def _sweep(directory: pathlib.Path, keep: pathlib.Path) -> None:
    """Claim files of batches long done (a file is written once per batch, by its first task)."""
    now = time.time()
    for old in directory.glob("*.json"):
        try:
            if old != keep and now - old.stat().st_mtime > KEEP_SECONDS:
                os.unlink(old)
        except FileNotFoundError:
            pass  # another task swept it
