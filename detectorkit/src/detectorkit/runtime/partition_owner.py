"""What this instance reads: the consumer group's assignment turned into a running query.

Instances of a service share its input through the consumer group (kafka.membership): the query
reads exactly the partitions this instance owns, from the group's committed offsets. When they
change, the query is stopped after its batch in flight (written and committed) and started again on
the new set; revoked partitions are released only then, so the next owner starts where this one
stopped. With exactly-once, what a killed owner left open is aborted (fenced) first."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from detectorkit.kafka import clients, transactions
from detectorkit.kafka.end_offsets import start_positions
from detectorkit.kafka.membership import GroupMember
from detectorkit.kafka.planning import data_loss, deleted_input_topic
from detectorkit.metrics.registry import JobMetrics
from detectorkit.runtime.driver_checkpoint import DriverCheckpoint
from detectorkit.runtime.health import Progress
from detectorkit.runtime.job_plan import JobPlan
from detectorkit.runtime.query_runner import QueryRunner
from detectorkit.runtime.supervisor import Supervisor, describe, is_permanent
from detectorkit.state import changelog

log = structlog.get_logger("detectorkit.job")


class PartitionOwner:
    """The group's owner (membership.Owner): serves the group, applies what it assigns, releases
    what it takes away."""

    def __init__(
        self,
        plan: JobPlan,
        base_conf: Mapping[str, Any],
        runner: QueryRunner,
        committer: DriverCheckpoint,
        supervisor: Supervisor,
        metrics: JobMetrics,
        progress: Progress,
        leaving: threading.Event,
        start_query: Callable[[frozenset[int], dict[int, int], bytes | None], None],
        member: GroupMember,
        ends,
        state_topic: str | None = None,
    ):
        """`member`: the group's, not yet subscribed (this owner subscribes it, `serve`'s thread
        polls it); `ends`: the end offsets (kafka.end_offsets) a start position is judged by."""
        self.plan, self._base = plan, base_conf
        self.runner, self.committer, self.supervisor = runner, committer, supervisor
        self.metrics, self.progress, self._leaving = metrics, progress, leaving
        self._start_query = start_query
        self._state_topic = state_topic
        self.member, self.ends = member, ends
        self.running: frozenset[int] | None = None  # what the query reads; None: nothing runs
        self.metadata: bytes | None = None  # with exactly-once: the group metadata the query's tasks commit with
        self._admin = None  # for the metadata request of an assignment that needs one
        self._input_id: str | None = None  # the input topic's id where the positions were read

    # ---- the serving loop ---------------------------------------------------------------------

    def serve(self) -> None:
        """The group's thread: polls it, and starts a query on what it gives until the job leaves or fails."""
        member, supervisor = self.member, self.supervisor
        try:
            while not self._leaving.is_set() and not supervisor.ended.is_set():
                member.poll(0.2)  # rebalance callbacks, and `release`, run in here
                if member.fatal:
                    supervisor.fail(member.fatal)
                    return
                if member.joined and self._needs_query(member) and not self._leaving.is_set():
                    try:
                        self.apply(member.owned)
                    except Exception as exc:  # noqa: BLE001 - classified by _recover: retried, or the job fails
                        if not self._recover(describe(exc)):
                            return
                        continue
                if member.joined:
                    supervisor.ready.set()
                reason = self.query_failure()
                if reason is not None and not self._recover(reason):
                    return
        except Exception as exc:  # noqa: BLE001 - whatever it is, the job has failed and must say why
            supervisor.fail(describe(exc))

    def _needs_query(self, member: GroupMember) -> bool:
        """A query must start on what the group gave: another set of partitions, or, with
        exactly-once, the same set under a new generation (the tasks commit with the group's
        metadata, which the broker refuses once its generation is over)."""
        if self.running != member.owned:
            return True
        return self.plan.exactly_once and bool(self.running) and member.group_metadata() != self.metadata

    def _recover(self, reason: str) -> bool:
        """The query died, or could not start: it starts again after a backoff, from the group's
        committed offsets, so what the failed batch wrote is written again, as after a crash.
        False once the job has failed instead: an error no restart mends, or one that persists."""
        return self.supervisor.restart_after(reason, before_wait=self._forget_query)

    def _forget_query(self) -> None:
        self.running = None  # a dead query reads nothing: the serving loop starts one again
        self.stop_query()

    def query_failure(self) -> str | None:
        """Why the query this instance runs has died; None while it runs, or when none does."""
        return None if self.running is None else self.runner.failure()

    # ---- assign and release -------------------------------------------------------------------

    def apply(self, owned: frozenset[int]) -> None:
        """Read exactly `owned`, each from the group's committed offset."""
        self._check_state_partitions(owned)
        if not owned:
            self._check_input_is_there()
        began = self.member.changed_at
        before = self.running or frozenset()
        self.stop_query()
        if owned:
            start = self.start_offsets(owned)
            if self._leaving.is_set():
                # Stopped meanwhile (a member is given partitions until it leaves): a query started
                # now would plan its first batch while the stop waits for it. The next owner starts
                # from the same committed offsets.
                return
            self.metadata = self.member.group_metadata() if self.plan.exactly_once else None
            self.committer.allow(owned)
            self._start_query(owned, start, self.metadata)
        self.running = owned
        self.progress.mark()  # a new query has had no chance to complete a batch yet
        seconds = time.monotonic() - began
        self.metrics.set_assignment(owned, seconds)
        log.info(
            "partitions assigned",
            partitions=sorted(owned),
            gained=sorted(owned - before),
            handover_seconds=round(seconds, 3),
            member_id=self.member.member_id(),
        )

    def _check_state_partitions(self, owned: frozenset[int]) -> None:
        """Partitions added to the input while a stateful job runs reach it here: their state would
        be restored from changelog partitions that do not exist (a timeout, restarts, then a
        misleading error), and their keys' state is in other partitions. SettingsError instead, a
        permanent failure in one line, before anything stops; one metadata request an assignment."""
        if not owned or self._state_topic is None:
            return
        if self._admin is None:
            self._admin = clients.new_admin(self._base)
        changelog.check_assignment(self._admin, self._state_topic, self.plan.input_topic, owned, self.plan.timeout)

    def _check_input_is_there(self) -> None:
        """The group gives no partition when there are more members than partitions, and when the
        input topic was deleted: its partitions leave every member's assignment. A query's batch or
        slice may have ended before its reads saw the deletion, so it is told here too: a
        DataLossError, or with FAIL_ON_DATA_LOSS=false a warning, and the group assigns the topic's
        partitions again once it is back."""
        if self._admin is None:
            self._admin = clients.new_admin(self._base)
        try:
            clients.topic_partitions(self._admin, self.plan.input_topic, self.plan.timeout)
        except LookupError:
            log.warning("skipping lost records", problem=deleted_input_topic(self.plan.input_topic, self.plan.fail_on_data_loss))

    def input_recreated(self) -> bool | None:
        """Whether the input topic was deleted and created again since the positions were read (its
        id changed; None while it is not there, or DataLossError): its partitions are new ones, to be read from their
        first record. A slice goes on from
        the last one's positions, and the group may never notice a deletion when the topic is back
        within its metadata refresh: from those positions, the new topic's first records were
        skipped, or some read again each slice. DataLossError instead unless FAIL_ON_DATA_LOSS=false."""
        now = self._topic_id()
        if now is None:
            if self.plan.fail_on_data_loss:
                deleted_input_topic(self.plan.input_topic, True)  # raises the DataLossError that stops the job
            return None  # no slice starts until it is back (SliceDriver.run)
        before, self._input_id = self._input_id, now
        if before is None or now == before:
            return False
        problem = f"topic {self.plan.input_topic!r} was deleted and created again while the job read it"
        if self.plan.fail_on_data_loss:
            raise data_loss(problem)
        log.warning("skipping lost records", problem=f"{problem}: reading the new topic from its first record")
        return True

    def _topic_id(self) -> str | None:
        if self._admin is None:
            self._admin = clients.new_admin(self._base)
        return clients.topic_id(self._admin, self.plan.input_topic, self.plan.timeout)

    def release(self, partitions: set[int], lost: bool) -> None:
        """The group takes `partitions` away (see membership.Owner). Revoked: the batch in flight
        finishes and commits them first. Lost: another member may already read them, so nothing of
        theirs is committed any more."""
        began = time.monotonic()
        if lost:
            self.committer.forbid(partitions)
        if self.running and self.running & partitions:
            self.stop_query()
            self.running = None
        self.committer.forbid(partitions)
        log.info("partitions released", partitions=sorted(partitions), lost=lost, handover_seconds=round(time.monotonic() - began, 3))

    def start_offsets(self, owned: frozenset[int]) -> dict[int, int]:
        plan = self.plan
        if plan.exactly_once:
            # What a killed owner left open is aborted first, so the offsets read next are stable.
            timeout_ms = int(plan.transaction_timeout_seconds * 1000)
            transactions.fence(clients.producer(self._base), plan.group, plan.input_topic, sorted(owned), timeout_ms, plan.timeout)
        # Before the offsets: a topic created again after them is seen as new, never before.
        self._input_id = self._topic_id()
        commits = self.member.commits(owned)  # the offsets, and with a flush interval where the changelog is
        committed = {p: c.offset for p, c in commits.items()}
        policy = plan.starting_offsets
        if any(o is None for o in committed.values()) and policy != "earliest":
            # STARTING_OFFSETS is for the service's first start. Once the group holds a position
            # anywhere in the topic, a partition without one is new (added to the topic): all of
            # its records arrived after the service started, so it is read from its first.
            others = set(self.ends.topic_partitions()) - set(owned)
            if any(o is not None for o in self.member.committed(others).values()):
                policy = "earliest"
        start = start_positions(self.ends, committed, policy, plan.input_topic, plan.group)
        self.committer.starting_at(start, commits)
        # Recorded at once, so a restart before any record arrives starts here too instead of at a
        # later "latest" that would skip what came in between.
        self.member.commit({p: o for p, o in start.items() if committed.get(p) is None})
        return start

    def stop_query(self, timeout: float = 120.0) -> None:
        """Stop the query after its batch in flight; past `timeout` its batch is cancelled and
        nothing of it committed."""
        if self.runner.query is None:
            return
        reason = self.query_failure()
        if reason is not None and is_permanent(reason):
            # It died before the serving loop saw it: when the group takes the partitions away
            # for the same cause (a deleted topic), its error must not go with them.
            self.supervisor.fail(reason)
        elif reason is not None:
            log.warning("query had failed; what this instance still owns starts again", error=reason)
        self.runner.stop(timeout, on_cancel=self.committer.forbid)
        # Before the partitions go, or a new query reads the group's offsets: what failed to commit.
        self.committer.settle()
