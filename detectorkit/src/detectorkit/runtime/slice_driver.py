"""The driver's side of slices (runtime.slices): each batch of the query runs one slice, a task per
core over the owned partitions from where the last slice ended, and the tasks' reports reach the
driver over the slice control's line as they checkpoint (runtime.slice_control)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from functools import partial

import structlog

from detectorkit.kafka.source_options import SourceOptions
from detectorkit.runtime.driver_checkpoint import DriverCheckpoint
from detectorkit.runtime.job_plan import JobPlan
from detectorkit.runtime.slice_control import SliceControl
from detectorkit.runtime.slices import SlicePositions, run_slice
from detectorkit.runtime.slices import plan as plan_slice
from detectorkit.runtime.supervisor import describe
from detectorkit.runtime.task_context import TaskContext
from detectorkit.runtime.task_result import SPARK_SCHEMA, TaskResult

log = structlog.get_logger("detectorkit.job")


class SliceDriver:
    """Runs a job's slices and keeps where they are: the control line to their tasks, the
    positions the next slice starts from, the slice running."""

    def __init__(self, host: str, plan: JobPlan, committer: DriverCheckpoint, input_recreated: Callable[[], bool | None], leaving: threading.Event):
        """`host`: where the tasks reach the driver (on a cluster, its address); `input_recreated`:
        whether the input topic was deleted and created again since the positions were read (None:
        it is gone now)."""
        self.plan, self.committer, self._input_recreated, self._leaving = plan, committer, input_recreated, leaving
        # A beat four times within what a task waits for one (SliceSpec.pause_seconds).
        self.control = SliceControl(host, on_counts=committer.count_reported, beat_seconds=plan.slice_pause_seconds / 4)
        self._positions = SlicePositions({})
        self._slice: str | None = None  # the running (or last) slice's token

    def starting_at(self, start: dict[int, int]) -> None:
        """A query starts: its first slice reads from `start` (the group's committed offsets)."""
        self._positions = SlicePositions(start)

    def run(self, spark, task: TaskContext, source: SourceOptions) -> list[TaskResult]:
        """One slice, to its end; its tasks' results."""
        plan, control, positions = self.plan, self.control, self._positions
        recreated = self._input_recreated()
        if recreated is None:
            # Deleted: no reader goes on from the old topic's positions into a new one created
            # meanwhile. Once it is back, its id says which of the two it is.
            self._leaving.wait(min(1.0, plan.slice_seconds))
            return []
        restart = positions.input_checked(recreated)
        if restart is not None:
            # The last slice's progress is the old topic's: forgotten before anything commits it.
            if self._slice is not None:
                control.forget(self._slice)
            self._slice = None
            self.committer.restart_at(restart)
        cores = max(1, spark.sparkContext.defaultParallelism // plan.readers)
        tasks = max(1, min(cores, len(positions.next)))
        token = uuid.uuid4().hex
        spec = plan_slice(
            source,
            positions.next,
            tasks,
            plan.slice_seconds,
            plan.slice_commit_interval_seconds,
            plan.tick_seconds,
            control.address,
            token,
            positions.known,
            plan.slice_pause_seconds,
        )
        control.begin(token, after=self._slice)
        self._slice = token
        positions.began()
        try:
            rows = spark.range(0, tasks, 1, tasks).mapInArrow(partial(run_slice, task, spec), SPARK_SCHEMA).collect()
        finally:
            control.end(token)
        results = [TaskResult.from_row(row.asDict()) for row in rows]
        positions.ended(results, plan.exactly_once)
        return results

    def progress(self):
        """Where the running slice's tasks last said they were (None: no report yet)."""
        return self.control.snapshot(self._slice)

    def commit_as_they_go(self, ended: threading.Event) -> None:
        """At-least-once: the positions the running slice's tasks reported at their checkpoints,
        committed every SLICE_COMMIT_INTERVAL_SECONDS as they move (with exactly-once the tasks'
        transactions commit them); the slice's end commits its last ones, as a batch's does. Until
        the job leaves or `ended` is set."""
        while not self._leaving.wait(self.plan.slice_commit_interval_seconds) and not ended.is_set():
            progress = self.progress()
            if progress is None or not progress.positions:
                continue
            try:
                self.committer.commit_reported(progress.positions, progress.durable)
            except Exception as exc:  # noqa: BLE001 - the slice's end commits the same positions, or its failure restarts the query
                log.warning("could not commit the slice's positions yet", error=describe(exc))

    def end(self) -> None:
        """Ends the running slice at its tasks' next checkpoint."""
        self.control.end()

    def seconds_since_report(self) -> float:
        return self.control.seconds_since_report()

    def close(self) -> None:
        self.control.close()
