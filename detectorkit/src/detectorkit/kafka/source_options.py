"""The Kafka source's options: what the job resolves (partitions, start offsets, group metadata)
and how the planner and the tasks read, carried to Spark as data source options."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from detectorkit.kafka import broker_kind as kinds
from detectorkit.kafka.planning import MIN_TASK_RECORDS

# Secrets travel under keys that Spark's redaction pattern (spark.redaction.regex matches "secret")
# hides from plans, explain() and the UI.
_SECRET_OPTION = "detectorkit.secret."


@dataclass(frozen=True)
class SourceOptions:
    topic: str
    client_conf: dict[str, Any]
    group: str
    max_records_per_batch: int | None = None
    fail_on_data_loss: bool = True
    timeout: float = 30.0
    partition_refresh_seconds: float = 5.0
    # The partitions this instance owns; None: all of the topic's, including ones added later.
    partitions: list[int] | None = None
    # Where to start each partition, resolved by the group's member (the job); a reader refuses to
    # start without them.
    start_offsets: dict[int, int] | None = None
    # Spark tasks per batch at most: the job passes its parallelism (cores).
    max_tasks: int = 2
    # A task per this many records at least: a caught-up job's small batches go in one task.
    min_task_records: int = MIN_TASK_RECORDS
    # broker_kind.KAFKA or TANSU (AUTO: detected by the planner); the job detects it once at start.
    broker_kind: str = kinds.AUTO
    # A worker's cached reading consumer is closed after this long unused (see worker_clients).
    client_idle_seconds: float = 60.0
    # Plan a batch at least this often, with an empty range for each partition that has nothing to
    # read (a tick: timers of quiet partitions fire in it); None: only when there are records.
    tick_seconds: float | None = None
    # Name each range read to its partition's end at planning (PartitionRange.caught_up): a stateful
    # task writes such a partition's state changes at once rather than waiting for the interval.
    marks_caught_up: bool = False
    # Where a batch's tasks claim their partitions when they all run on this machine (kafka.claims):
    # set for a stateful stage in local mode, so a worker keeps the partitions whose stores it holds.
    claims_dir: str | None = None
    # With exactly-once: the driver's consumer group metadata (hex) at the query's start, with which
    # the tasks commit their offsets inside their transactions (kafka.transactions).
    group_metadata: str | None = None

    def resolved(self) -> SourceOptions:
        """These options with the broker kind detected, if it was AUTO."""
        if self.broker_kind != kinds.AUTO:
            return self
        return dataclasses.replace(self, broker_kind=kinds.resolve(self.broker_kind, self.client_conf, self.timeout))

    def to_options(self) -> dict[str, str]:
        """Spark's data source options. Secrets travel under keys that Spark's redaction pattern
        (spark.redaction.regex matches "secret") hides from plans, explain() and the UI."""
        conf = {k: v for k, v in self.client_conf.items() if not isinstance(v, SecretStr)}
        options = {"detectorkit.options": json.dumps({**self.__dict__, "client_conf": conf})}
        for k, v in self.client_conf.items():
            if isinstance(v, SecretStr):
                options[_SECRET_OPTION + k] = v.get_secret_value()
        return options

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SourceOptions:
        fields = json.loads(options["detectorkit.options"])
        if fields.get("start_offsets") is not None:  # JSON made the partition numbers strings
            fields["start_offsets"] = {int(p): o for p, o in fields["start_offsets"].items()}
        # Spark may hand the options back with lower-cased keys; librdkafka's keys are lower case.
        secrets = {k[len(_SECRET_OPTION) :]: SecretStr(v) for k, v in options.items() if k.lower().startswith(_SECRET_OPTION)}
        return cls(**{**fields, "client_conf": {**fields["client_conf"], **secrets}})
