"""The driver's end of a batch (steps 5 and 7 of runtime.checkpoint): fold what the tasks report,
commit the batch's end offsets with where each partition's changelog is, count; and between
batches, measure lag and commit the same positions again now and then.

It owns what a batch may still commit (`committable`): the group's hand-overs narrow it, under the
same lock as the commits, so no commit ever moves a partition another member now reads."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import structlog
from confluent_kafka import KafkaException

from detectorkit.kafka import clients, offset_store, transactions
from detectorkit.kafka.membership import CommitRefused, GroupMember
from detectorkit.kafka.planning import deleted_input_topic
from detectorkit.metrics.registry import LATENCY_BUCKETS, JobMetrics, merged_counts
from detectorkit.runtime.job_plan import JobPlan
from detectorkit.runtime.supervisor import describe, is_permanent
from detectorkit.runtime.task_result import NO_PARTITION, TaskResult

log = structlog.get_logger("detectorkit.job")


@dataclass
class BatchResult:
    batch_id: int
    records: int
    detections: int
    dead_letters: Counter
    committed: dict[int, int]
    seconds: float


@dataclass
class JobStats:
    batches: int = 0
    records: int = 0
    detections: int = 0
    dead_letters: Counter = field(default_factory=Counter)
    last: BatchResult | None = None


@dataclass
class _Folded:
    """A batch's task results summed up."""

    committed: dict[int, int] = field(default_factory=dict)
    records: int = 0
    detections: int = 0
    dead: Counter = field(default_factory=Counter)
    latency_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    latency_sum: float = 0.0
    score_counts: list[int] = field(default_factory=list)
    score_sum: float = 0.0
    errors: list[str] = field(default_factory=list)


class DriverCheckpoint:
    def __init__(
        self,
        plan: JobPlan,
        metrics: JobMetrics,
        stats: JobStats | None = None,
        member: GroupMember | None = None,
        ends=None,
        on_input_gone: Callable[[], None] | None = None,
    ):
        """`member`: the group's, which commits (None: nothing is committed, as in a test of the
        folding alone); `ends`: the end offsets (kafka.end_offsets), for the lag; `on_input_gone`:
        what ends the running slice when a commit finds the input topic gone."""
        self.plan = plan
        self.metrics = metrics
        self.stats = JobStats() if stats is None else stats
        self.member = member
        self.on_input_gone = on_input_gone
        self.ends = ends
        # Serialises the group commits of batches with the periodic refresh, the lag reading and
        # the hand-over of partitions.
        self._lock = threading.Lock()
        self._committable: set[int] = set()
        self._committed_at = time.monotonic()
        # With a state flush interval: how far each partition's changelog reflects the input,
        # committed with its offset; the tasks report it as they flush.
        self._durable: dict[int, int] = {}
        # What this instance last committed of each partition, and the lock that keeps its commits
        # in order: a slice's checkpoints are committed from another thread than its end, and an
        # older position landing after a newer one would move the group back.
        self._committed: dict[int, int] = {}
        self._commit_lock = threading.Lock()
        # Positions whose outputs are flushed but whose commit failed (the broker away a moment):
        # the next commit of the partition supersedes them; a stop or a hand-over tries them again
        # (`settle`), else the next owner would read a whole slice again.
        self._owed: dict[int, int] = {}
        # What a slice's tasks reported at their checkpoints, counted as it came, since the slice began.
        self._counts_lock = threading.Lock()
        self._reported = _Folded()

    # ---- what may be committed ----------------------------------------------------------------

    def allow(self, partitions: Iterable[int]) -> None:
        """A query starts on `partitions`: its batches commit them."""
        with self._lock:
            self._committable = set(partitions)

    def forbid(self, partitions: Iterable[int] | None = None) -> None:
        """Handed over (or, None, a batch cancelled): nothing of theirs is committed any more."""
        with self._lock:
            if partitions is None:
                self._committable = set()
                self._owed.clear()
            else:
                self._committable -= set(partitions)
                for p in partitions:
                    self._committed.pop(p, None)  # its next owner commits it, maybe back where this one began
                    self._owed.pop(p, None)
                self.metrics.forget_partitions(set(partitions))

    def starting_at(self, start: dict[int, int], commits: dict[int, offset_store.Commit]) -> None:
        """Where the changelog of each partition a query starts on is: the metadata of its commit.
        Without any (a new partition, or one committed by a version that wrote the changelog every
        batch) the changelog reflects the input up to the committed offset. The offsets are what the
        group holds: what this instance commits next must not fall behind them."""
        with self._lock:
            self._committed.update(start)
        if self.plan.flushes_per_interval:
            self._durable.update({p: start[p] if commits[p].durable is None else commits[p].durable for p in start})

    def restart_at(self, start: dict[int, int]) -> None:
        """The input topic was created again: its partitions start at `start`, committed now,
        though behind what this instance committed of the old topic (a restart starts there too)."""
        with self._commit_lock:
            self.starting_at(start, {p: offset_store.Commit(o, None) for p, o in start.items()})
            self.member.commit(start, self._durable_metadata(start))

    # ---- a batch ------------------------------------------------------------------------------

    def finish(self, batch_id: int, results: list[TaskResult], started: float) -> BatchResult:
        """Steps 5 and 7 of the commit sequence, once every task has flushed: the output and the state's
        changes are written, so the position may move."""
        folded = self._fold(results)
        collected = time.monotonic()
        if folded.errors:
            # What committed is counted; the batch fails, and the query starts again from the
            # group's offsets, where the failed partitions' records are read again.
            self._count(self._result(batch_id, folded, collected - started), folded)
            self._take_reported()  # counted as it came; the next slice starts from none
            raise transactions.TransactionError(folded.errors[0])
        with self._commit_lock:
            self._commit(folded.committed)
        commit_seconds = time.monotonic() - collected
        self._count(self._result(batch_id, folded, time.monotonic() - started), folded)
        # Its result and log line: the whole slice, with what its tasks reported before they ended.
        reported = self._take_reported()
        whole = _Folded(folded.committed, folded.records + reported.records, folded.detections + reported.detections, folded.dead + reported.dead)
        result = self._result(batch_id, whole, time.monotonic() - started)
        self.stats.batches += 1
        self.stats.last = result
        if result.records:
            log.info(
                "batch done",
                records=result.records,
                detections=result.detections,
                dead_letters=dict(result.dead_letters),
                committed={str(k): v for k, v in result.committed.items()},
                seconds=round(result.seconds, 3),
                tasks_seconds=round(collected - started, 3),
                commit_seconds=round(commit_seconds, 3),
            )
        return result

    def _fold(self, results: list[TaskResult]) -> _Folded:
        f = _Folded()
        for r in results:
            if r.error:
                f.errors.append(r.error)
            if r.partition != NO_PARTITION:
                f.committed[r.partition] = max(f.committed.get(r.partition, -1), r.next_offset)
            f.records += r.records
            f.detections += r.detections
            f.dead.update(r.dead_letters)
            f.latency_counts = merged_counts(f.latency_counts, r.latency_counts)
            f.latency_sum += r.latency_sum
            if r.scores:
                f.score_counts = merged_counts(f.score_counts, r.scores["counts"])
                f.score_sum += r.scores["sum"]
            self.metrics.executors.update(r.processes)
            if r.state:
                self.metrics.record_state(r.partition, r.state)
            if r.durable is not None:
                self._durable[r.partition] = max(self._durable.get(r.partition, -1), r.durable)
        return f

    @staticmethod
    def _result(batch_id: int, f: _Folded, seconds: float) -> BatchResult:
        return BatchResult(batch_id, f.records, f.detections, f.dead, f.committed, seconds)

    def _count(self, result: BatchResult, f: _Folded) -> None:
        """What the batch's tasks wrote, into the metrics and the stats: also for a batch that
        fails after some of its transactions committed, whose records are not read again."""
        with self._counts_lock:
            self.metrics.record_batch(result.records, result.detections, result.dead_letters, result.seconds, f.latency_counts, f.latency_sum)
            if f.score_counts:
                self.metrics.record_scores(f.score_counts, f.score_sum)
            self._add_to_stats(result.records, result.detections, result.dead_letters)

    def count_reported(self, counts: dict) -> None:
        """Slices: what a task wrote since its last checkpoint (processing.take_counts), counted as
        it comes; a slice's end brings only what its tasks had not reported. Counted at a slice's end,
        the metrics stood still while it ran and then jumped by all of it."""
        records, detections, dead = counts["records"], counts["detections"], Counter(counts["dead_letters"])
        with self._counts_lock:
            self.metrics.record_counts(records, detections, dead, counts["latency_counts"], counts["latency_sum"])
            if counts.get("score_counts"):
                self.metrics.record_scores(counts["score_counts"], counts["score_sum"])
            for partition, state in counts.get("state", {}).items():
                self.metrics.record_state(int(partition), state)
            self._add_to_stats(records, detections, dead)
            r = self._reported
            r.records, r.detections = r.records + records, r.detections + detections
            r.dead.update(dead)

    def _add_to_stats(self, records: int, detections: int, dead: Counter) -> None:
        st = self.stats
        st.records += records
        st.detections += detections
        st.dead_letters.update(dead)

    def _take_reported(self) -> _Folded:
        """What a slice's tasks reported since the last batch ended (already counted), taken."""
        with self._counts_lock:
            reported, self._reported = self._reported, _Folded()
        return reported

    def commit_reported(self, positions: dict[int, int], durable: dict[int, int]) -> None:
        """At-least-once slices: the positions the tasks reported at their last checkpoints, where
        their outputs are flushed and their state's changes written (the changelog as far as
        `durable`), committed while the slice goes on. Without it a crash replays up to a slice,
        and the group's lag, what KEDA scales on, stays up to a slice behind."""
        with self._commit_lock:
            with self._lock:
                if self.member is None:
                    return
                for p, d in durable.items():
                    self._durable[p] = max(self._durable.get(p, -1), d)
                # Only what moved, of partitions still this instance's (the others are quietly left
                # to their new owner: a handed-over slice goes on reporting until it ends).
                ahead = {p: o for p, o in positions.items() if p in self._committable and o > self._committed.get(p, -1)}
            if ahead:
                self._commit(ahead, measure=False)  # the lag is measured at each metrics report (show_positions)

    def _commit(self, committed: dict[int, int], measure: bool = True) -> None:
        """The batch's end offsets, for the partitions this instance still owns. With exactly-once
        the tasks have committed them in their transactions: only the lag is measured here."""
        exactly_once = self.plan.exactly_once
        with self._lock:
            mine = {p: o for p, o in committed.items() if p in self._committable}
            behind = {p for p, o in mine.items() if o < self._committed.get(p, -1)}
        mine = {p: o for p, o in mine.items() if p not in behind}
        if mine.keys() | behind != committed.keys() and not exactly_once:
            log.warning("not committing partitions this instance no longer owns", partitions=sorted(set(committed) - set(mine) - behind))
        # Not under the lock: the commit runs on the group's thread, which may be handing
        # partitions over and take that lock.
        try:
            try:
                if not exactly_once:
                    self.member.commit(mine, self._durable_metadata(mine))
            except CommitRefused as exc:
                # A zombie: the group moved on while this instance was away. The output is written
                # (the new owner writes it again), the group's offsets stay where the owner put them.
                log.warning(
                    "offsets not committed: the group gave these partitions to another member", partitions=sorted(mine), error=exc.args[0].str()
                )
                mine = {}
            except Exception as exc:  # noqa: BLE001 - the output is flushed: only the position waits
                if isinstance(exc, KafkaException | LookupError) and clients.is_not_there(exc) or is_permanent(describe(exc)):
                    raise  # a deleted input below; an error no retry mends fails the job
                # The slice goes on; its next commit, or a stop's or a hand-over's, carries them.
                log.warning("could not commit the slice's positions yet", partitions=sorted(mine), error=describe(exc))
                with self._lock:
                    self._owed.update(mine)
                return
            with self._lock:
                if not exactly_once:
                    self._committed.update(mine)
                    for p, o in mine.items():
                        if self._owed.get(p, -1) <= o:
                            self._owed.pop(p, None)
                if mine:
                    self._committed_at = time.monotonic()
                if mine and measure:
                    self.metrics.set_offsets(mine, self.ends.end_offsets(mine))
        except (LookupError, KafkaException) as exc:
            if not clients.is_not_there(exc):
                raise
            # Deleted after the batch was planned: a deletion like any other. When skipping,
            # the source waits for the topic to come back.
            log.warning("skipping lost records", problem=deleted_input_topic(self.plan.input_topic, self.plan.fail_on_data_loss))
            if self.on_input_gone is not None:
                # Its readers would go on from the old topic's positions into one created again.
                self.on_input_gone()

    def settle(self) -> None:
        """Before a stop or a hand-over, once no slice runs: positions whose commit failed are tried
        once more. Failing again, the next owner reads those records again (at least once)."""
        with self._commit_lock:
            with self._lock:
                if self.member is None:
                    return
                owed = {p: o for p, o in self._owed.items() if p in self._committable and o > self._committed.get(p, -1)}
            if owed:
                self._commit(owed, measure=False)

    def _durable_metadata(self, offsets: dict[int, int]) -> dict[int, str] | None:
        """The metadata of a commit of `offsets`: where each partition's changelog is (a commit
        without it would make the next owner take the changelog as reflecting the whole input)."""
        if not self.plan.flushes_per_interval:
            return None
        return {p: offset_store.durable_metadata(self._durable[p]) for p in offsets if p in self._durable}

    # ---- between batches ----------------------------------------------------------------------

    def maintain(self, between_batches: Callable[[], AbstractContextManager[bool]]) -> None:
        """Before each metrics report: lag of every partition the instance owns, also while no batch
        runs; and, every COMMIT_REFRESH_SECONDS, the group's positions committed again.

        Kafka deletes a group's offsets once they are older than offsets.retention.minutes (7 days
        by default) and the group has had no member for that long; committing the same positions
        again now and then costs nothing and keeps a quiet partition's position safe either way.
        With exactly-once the tasks commit, outside the driver: a recommit then only runs while no
        batch does (`between_batches`), else it could write back a position a task's transaction
        has just moved on."""
        member = self.member
        with self._lock:
            partitions = sorted(self._committable)
        if member is None or self.ends is None or not partitions:
            return
        try:
            known = None
            if time.monotonic() - self._committed_at >= self.plan.commit_refresh_seconds:
                with between_batches() if self.plan.exactly_once else nullcontext(True) as free:
                    if free:
                        known = member.recommit(partitions)  # the same positions: only their commit time moves
                if known is not None:
                    self._committed_at = time.monotonic()
                    log.info("positions committed again", partitions=len(known))
            if known is None:
                known = {p: o for p, o in member.committed(partitions).items() if o is not None}
            with self._lock:
                known = {p: o for p, o in known.items() if p in self._committable}
                if known and self.ends is not None:
                    self.metrics.set_offsets(known, self.ends.end_offsets(known))
        except CommitRefused:
            pass  # being handed over: the new owner commits them
        except (LookupError, KafkaException) as exc:
            if not clients.is_not_there(exc):
                raise
            # A deleted input topic: the source and the batches say so; there is no lag to tell.

    def show_positions(self, positions: dict[int, int]) -> None:
        """The lag of the partitions still owned, from positions their tasks reached (a slice's)."""
        try:
            with self._lock:
                mine = {p: o for p, o in positions.items() if p in self._committable}
                if mine and self.ends is not None:
                    self.metrics.set_offsets(mine, self.ends.end_offsets(mine))
        except (LookupError, KafkaException) as exc:
            if not clients.is_not_there(exc):
                raise

    def close(self) -> None:
        with self._lock:
            if self.ends is not None:
                self.ends.close()
            self.member = self.ends = None
