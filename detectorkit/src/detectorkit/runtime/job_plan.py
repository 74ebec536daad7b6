"""Settings turned, once, into what a job does: the guarantee, the broker's profile and what follows
from both (how often state is flushed, whether batches claim partitions, how often quiet partitions
tick). The driver's parts read this plan, never `Settings`, and never test a broker's name."""

from __future__ import annotations

import enum
import os
import re
import shutil
import tempfile
from dataclasses import dataclass

from detectorkit.kafka.broker_kind import BrokerProfile
from detectorkit.runtime.stage import Stage
from detectorkit.settings import Settings, SettingsError


def slice_seconds(spark_master: str) -> float:
    """A slice's length when SLICE_SECONDS is unset. Reading pauses between two slices while Spark
    starts the next, so the longer the better, but for one thing a slice's end does: on a cluster, a
    task lost with its executor is retried once a core frees, and the slice's other tasks hold
    theirs until its end. In local mode a failed task fails its slice at once (Spark retries no
    task there), and the query starts again."""
    return 300.0 if spark_master.startswith("local") else 30.0


class Guarantee(enum.Enum):
    AT_LEAST_ONCE = "at-least-once"
    # Each partition's writes and next offset in one transaction per task.
    EXACTLY_ONCE = "exactly-once"


@dataclass(frozen=True)
class JobPlan:
    service: str
    instance_id: str
    group: str
    input_topic: str
    guarantee: Guarantee
    broker: BrokerProfile
    # How often a task writes its stores' changes (0: every checkpoint); with an interval the group's
    # commit carries where the changelog is (kafka.offset_store.durable_metadata).
    flush_interval_seconds: float
    # How often a slice's task fires the timers of its quiet partitions (None: never).
    tick_seconds: float | None
    # Where a slice's tasks claim their partitions (kafka.claims); None: each task takes every n-th.
    claims_dir: str | None
    timeout: float
    starting_offsets: str
    fail_on_data_loss: bool
    # Tasks that run this long each (runtime.slices).
    slice_seconds: float
    slice_commit_interval_seconds: float
    # How long a slice's task may stand still before it ends its slice (runtime.slices): half the
    # session timeout, within which a paused instance's partitions are still its own.
    slice_pause_seconds: float
    # The readers sharing the Spark session's cores (a repartitioned job's feeder and detector: 2):
    # a slice runs on its share, so that neither reader's slices wait for the other's to end.
    readers: int
    checkpoint_dir: str | None
    restart_attempts: int
    restart_backoff_seconds: float
    commit_refresh_seconds: float
    transaction_timeout_seconds: float

    @property
    def exactly_once(self) -> bool:
        return self.guarantee is Guarantee.EXACTLY_ONCE

    @property
    def flushes_per_interval(self) -> bool:
        return self.flush_interval_seconds > 0

    @property
    def state_isolation(self) -> str:
        """How a task reads its changelog back: under exactly-once an aborted batch's changes never count."""
        return "read_committed" if self.exactly_once else "read_uncommitted"

    @classmethod
    def of(cls, stage: Stage, settings: Settings, broker: BrokerProfile, spark_master: str = "local") -> JobPlan:
        s = settings
        if s.processing_guarantee == "auto":
            guarantee = Guarantee.EXACTLY_ONCE if broker.hides_aborted else Guarantee.AT_LEAST_ONCE
        else:
            guarantee = Guarantee(s.processing_guarantee)
        if guarantee is Guarantee.EXACTLY_ONCE and not broker.hides_aborted:
            raise SettingsError(
                "PROCESSING_GUARANTEE=exactly-once needs Apache Kafka: the embedded broker (Tansu) shows aborted transactions "
                "to read_committed consumers, so nothing written there can be exactly once; use at-least-once with it"
            )
        stateful = stage.state is not None
        # Exactly-once commits a partition's changes with its offset in each batch's transaction; a
        # broker that keeps no metadata with a commit has nowhere to say where the changelog is.
        every_batch = guarantee is Guarantee.EXACTLY_ONCE or not broker.keeps_commit_metadata
        claims = (stateful or guarantee is Guarantee.EXACTLY_ONCE) and spark_master.startswith("local")
        return cls(
            service=stage.name,
            instance_id=s.instance_id,
            group=s.consumer_group,
            input_topic=s.input_topic,
            guarantee=guarantee,
            broker=broker,
            flush_interval_seconds=0.0 if not stateful or every_batch else s.state_flush_interval_seconds,
            tick_seconds=max(0.5, min(10.0, s.timer_idle_grace_seconds / 4)) if stage.ticks else None,
            # Only when all tasks run on this machine: Spark in local mode.
            claims_dir=os.path.join(tempfile.gettempdir(), "detectorkit-claims", f"{s.consumer_group}-{os.getpid()}") if claims else None,
            timeout=s.connect_timeout_seconds,
            starting_offsets=s.starting_offsets,
            fail_on_data_loss=s.fail_on_data_loss,
            slice_seconds=s.slice_seconds or slice_seconds(spark_master),
            slice_commit_interval_seconds=s.slice_commit_interval_seconds,
            slice_pause_seconds=s.group_session_timeout_seconds / 2,
            # A repartitioned detector's reader and its feeder's, in one session.
            readers=2 if stage.repartition_field is not None or stage.feeds_repartition else 1,
            checkpoint_dir=s.checkpoint_dir,
            restart_attempts=s.query_restart_attempts,
            restart_backoff_seconds=s.query_restart_backoff_seconds,
            commit_refresh_seconds=s.commit_refresh_seconds,
            transaction_timeout_seconds=s.transaction_timeout_seconds,
        )

    def fresh_checkpoint(self) -> str:
        """A checkpoint directory that holds nothing: the group's offsets are the only position."""
        if self.checkpoint_dir is None:
            return tempfile.mkdtemp(prefix=f"{self.service}-checkpoint-")
        # Per instance, so instances sharing CHECKPOINT_DIR never empty each other's.
        path = os.path.join(self.checkpoint_dir, re.sub(r"[^\w.-]", "_", self.instance_id))
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        return path
