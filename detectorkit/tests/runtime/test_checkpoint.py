"""The commit sequence's last step with exactly-once: the task's transaction committed."""

import json
from types import SimpleNamespace

from detectorkit.kafka.planning import PartitionRange
from detectorkit.kafka.transactions import TransactionError
from detectorkit.runtime import writers

from ..tasks import run_task
from .test_processing import arrow, ctx


class Sink:
    def __init__(self):
        self.sent = []

    def send(self, topic, key, value, *args, **kwargs):
        self.sent.append(topic)

    def flush(self, timeout):
        pass


class Txns:
    """Stands for kafka.transactions.TaskTransactions; `failing`: why its commit fails."""

    def __init__(self, partitions, failing=None):
        self.sink, self.partitions, self.failing = Sink(), frozenset(partitions), failing
        self.commits, self.aborted = [], False

    def commit(self, ends, offsets_sent=None):
        if self.failing:
            raise TransactionError(self.failing)
        self.commits.append(dict(ends))

    def abort_open(self):
        self.aborted = True


def task(txns, ranges, ends, batches):
    writer = writers.TransactionalWriter(ctx(), SimpleNamespace(group_metadata="00"), ranges)
    writer.txns = txns
    (summary,) = run_task(ctx(), iter(batches), ends, None, writer)
    return summary.to_pylist()


BATCHES = [arrow([b'{"amount": 5000}'] * 3, partition=3, first_offset=100), arrow([b'{"amount": 5000}'] * 2, partition=4, first_offset=7)]
RANGES = [PartitionRange("in", 3, 100, 103), PartitionRange("in", 4, 7, 9)]


def test_the_partitions_of_a_task_commit_in_one_transaction():
    """Kafka Streams' exactly_once_v2: a transaction per task, whatever its partitions; one per
    partition cost a round of the coordinator's each, several times a checkpoint's time."""
    txns = Txns({3, 4})
    rows = task(txns, RANGES, {3: 103, 4: 9}, BATCHES)
    assert txns.commits == [{3: 103, 4: 9}] and not txns.aborted
    assert len(txns.sink.sent) == 5  # every detection into the one transaction
    assert [(r["partition"], r["next_offset"], r["records"], r["error"]) for r in rows] == [(3, 103, 3, None), (4, 9, 2, None)]


def test_a_task_whose_transaction_cannot_commit_reports_why_and_none_of_its_partitions():
    """A rebalance during an exactly-once slice fails the task's transaction. Raised out of the
    task, the error made Spark drop its summaries; reported, the driver reads its partitions again
    from the group's offsets and counts nothing of them."""
    txns = Txns({3, 4}, failing="transaction g-in-3 aborted: the consumer group rebalanced during the batch")
    rows = task(txns, RANGES, {3: 103, 4: 9}, BATCHES)
    assert txns.commits == [] and txns.aborted
    assert [r["partition"] for r in rows] == [-1]  # no partition's summary: none committed
    assert "rebalanced" in rows[0]["error"] and json.loads(rows[0]["dead_letters"]) == {}
