"""The commit sequence's last step with exactly-once: each partition's transaction committed."""

import threading
from types import SimpleNamespace

import pytest

from detectorkit.kafka.planning import PartitionRange
from detectorkit.kafka.transactions import TransactionError
from detectorkit.runtime import checkpoint, writers


class Transactions:
    """Stands for kafka.transactions.TaskTransactions: a commit waits for the others to start."""

    def __init__(self, partitions: int, failing: int | None = None):
        self.started = threading.Barrier(partitions, timeout=5)
        self.failing = failing
        self.committed: dict[int, int] = {}

    def commit(self, partition, next_offset, offsets_sent=None):
        self.started.wait()  # broken (after 5 s) unless every partition's commit is under way at once
        if partition == self.failing:
            raise RuntimeError(f"partition {partition} fenced")
        self.committed[partition] = next_offset


def test_the_partitions_of_a_task_commit_at_once():
    txns = Transactions(4)
    writers._commit_all(txns, {0: 10, 3: 30, 5: 50, 6: 60})
    assert txns.committed == {0: 10, 3: 30, 5: 50, 6: 60}


def test_a_partition_that_cannot_commit_leaves_the_others_committed_and_fails_the_task():
    txns = Transactions(3, failing=3)
    with pytest.raises(RuntimeError, match="partition 3 fenced"):
        writers._commit_all(txns, {0: 10, 3: 30, 5: 50})
    assert txns.committed == {0: 10, 5: 50}


class Rebalanced(Transactions):
    def commit(self, partition, next_offset, offsets_sent=None):
        if partition == self.failing:
            raise TransactionError(f"transaction of {partition} aborted: the consumer group rebalanced during the batch")
        self.committed[partition] = next_offset


@pytest.mark.parametrize("partitions", [[3], [0, 3, 5]], ids=["one", "several"])
def test_transactions_that_cannot_commit_are_named_and_the_others_stay_committed(partitions):
    txns = Rebalanced(len(partitions), failing=3)
    with pytest.raises(checkpoint.CommitsFailed, match="rebalanced") as failed:
        writers._commit_all(txns, {p: p * 10 + 10 for p in partitions})
    assert failed.value.partitions == {3}
    assert txns.committed == {p: p * 10 + 10 for p in partitions if p != 3}


def test_a_task_reports_the_partitions_it_committed_and_why_the_others_did_not():
    """A rebalance during an exactly-once batch fails some transactions and not others. Raised out
    of the task, the error made Spark drop the summaries of those that committed: their records were
    never read again (committed) nor counted (the scaling test's aggregated records read came out
    5,010 short of 200,000)."""
    import json

    from ..tasks import run_task
    from .test_processing import arrow, ctx

    class Txns:
        def __init__(self):
            self.committed, self.aborted = {}, False

        def of(self, partition):
            return Sink()

        def commit(self, partition, next_offset, offsets_sent=None):
            if partition == 4:
                raise TransactionError("transaction of 4 aborted: the consumer group rebalanced during the batch")
            self.committed[partition] = next_offset

        def abort_open(self):
            self.aborted = True

    class Sink:
        def send(self, *args, **kwargs):
            pass

        def flush(self, timeout):
            pass

    txns = Txns()
    batches = [arrow([b'{"amount": 5000}'] * 3, partition=3, first_offset=100), arrow([b'{"amount": 5000}'] * 2, partition=4, first_offset=7)]
    ranges = [PartitionRange("in", 3, 100, 103), PartitionRange("in", 4, 7, 9)]
    writer = writers.TransactionalWriter(ctx(), SimpleNamespace(group_metadata="00"), ranges)
    writer.txns, writer._done = txns, set()
    (summary,) = run_task(ctx(), iter(batches), {3: 103, 4: 9}, None, writer)
    rows = summary.to_pylist()
    assert txns.committed == {3: 103} and txns.aborted
    assert [(r["partition"], r["next_offset"], r["records"]) for r in rows] == [(3, 103, 3)]
    assert "rebalanced" in rows[0]["error"] and json.loads(rows[0]["dead_letters"]) == {}
