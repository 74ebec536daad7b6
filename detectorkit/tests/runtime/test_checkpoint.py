"""The commit sequence's last step with exactly-once: each partition's transaction committed."""

import threading

import pytest

from detectorkit.runtime import checkpoint


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
    checkpoint._commit_all(txns, {0: 10, 3: 30, 5: 50, 6: 60})
    assert txns.committed == {0: 10, 3: 30, 5: 50, 6: 60}


def test_a_partition_that_cannot_commit_leaves_the_others_committed_and_fails_the_task():
    txns = Transactions(3, failing=3)
    with pytest.raises(RuntimeError, match="partition 3 fenced"):
        checkpoint._commit_all(txns, {0: 10, 3: 30, 5: 50})
    assert txns.committed == {0: 10, 5: 50}
