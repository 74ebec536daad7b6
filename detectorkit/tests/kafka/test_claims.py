"""A batch's tasks on one machine claim their partitions: each once, a worker's own stores first."""

import os
import time

from detectorkit.kafka import claims
from detectorkit.kafka.planning import PartitionRange


def ranges(sizes):
    return [PartitionRange("in", p, 100, 100 + size) for p, size in enumerate(sizes)]


def test_each_partition_goes_to_one_task_and_a_worker_keeps_the_partitions_it_holds(tmp_path):
    batch = ranges([10] * 8)
    first, second = claims.claims_for(str(tmp_path), batch, 2)
    # The second task's worker holds 1, 3, 5 and 7; it happens to start first.
    b = claims.take(second, batch, held={1, 3, 5, 7})
    a = claims.take(first, batch, held={0, 2, 4, 6})
    assert [r.partition for r in b] == [1, 3, 5, 7]
    assert [r.partition for r in a] == [0, 2, 4, 6]


def test_the_last_task_to_start_takes_what_is_left_and_shares_are_even_in_records(tmp_path):
    batch = ranges([100, 10, 10, 10, 10, 10, 10, 40])
    first, second, third = claims.claims_for(str(tmp_path), batch, 3)
    a = claims.take(first, batch, held=set(range(8)))  # holds every store: still only its share
    b = claims.take(second, batch, held=set())
    c = claims.take(third, batch, held=set())
    parts = [{r.partition for r in t} for t in (a, b, c)]
    assert set().union(*parts) == set(range(8)) and sum(map(len, parts)) == 8
    assert all(parts) and sum(r.size for r in a) < 200  # nobody took all


def test_a_partition_goes_to_the_worker_whose_store_is_current_whoever_starts_first(tmp_path):
    # Partition 7 moved to the second worker a batch ago: the first still has its store, a batch behind.
    batch = ranges([31, 30, 30, 30, 30, 29, 30, 33])
    first, second = claims.claims_for(str(tmp_path), batch, 2)
    a = claims.take(first, batch, held={0, 1, 5, 6, 7}, current={0, 1, 5, 6})
    b = claims.take(second, batch, held={2, 3, 4, 7}, current={2, 3, 4, 7})
    assert [r.partition for r in a] == [0, 1, 5, 6] and [r.partition for r in b] == [2, 3, 4, 7]


def test_a_share_a_few_records_short_takes_no_partition_from_another_worker(tmp_path):
    batch = ranges([29, 30, 30, 30, 31, 30, 30, 30])
    first, second = claims.claims_for(str(tmp_path), batch, 2)
    a = claims.take(first, batch, held={0, 1, 2, 3})  # 119 records of a target of 120
    b = claims.take(second, batch, held={4, 5, 6, 7})
    assert {r.partition for r in a} == {0, 1, 2, 3} and {r.partition for r in b} == {4, 5, 6, 7}
    # Short by more than half a partition, it does take one.
    batch = ranges([10, 10, 10, 10, 40, 40, 40, 40])
    first, second = claims.claims_for(str(tmp_path), batch, 2)
    a = claims.take(first, batch, held={0, 1, 2, 3})
    assert {r.partition for r in a} == {0, 1, 2, 3, 4}


def test_sticky_claims_keep_every_held_partition_where_it_is_however_uneven(tmp_path):
    """Exactly-once: a partition changing worker costs a new transactional producer (and fences
    the other worker's), so a task keeps what its worker holds even when the shares are uneven."""
    batch = ranges([100, 100, 100, 100, 100, 100, 1, 1])
    first, second = claims.claims_for(str(tmp_path), batch, 2, sticky=True)
    a = claims.take(second, batch, held={6, 7})  # holds the two small ones, starts first
    b = claims.take(first, batch, held={0, 1, 2, 3, 4, 5})
    assert [r.partition for r in a] == [6, 7]
    assert [r.partition for r in b] == [0, 1, 2, 3, 4, 5]
    # The same batch without stickiness: the first task evens the records out.
    first, second = claims.claims_for(str(tmp_path / "even"), batch, 2)
    assert len(claims.take(second, batch, held={6, 7})) > 2


def test_a_sticky_task_holding_nothing_takes_an_even_share(tmp_path):
    batch = ranges([10] * 8)
    first, second = claims.claims_for(str(tmp_path), batch, 2, sticky=True)
    a = claims.take(first, batch, held=set())
    b = claims.take(second, batch, held=set())
    assert len(a) == len(b) == 4


def test_a_retried_task_gets_what_its_first_attempt_claimed(tmp_path):
    batch = ranges([10] * 4)
    first, second = claims.claims_for(str(tmp_path), batch, 2)
    a = claims.take(first, batch, held={2, 3})
    claims.take(second, batch, held=set())
    assert claims.take(first, batch, held={0, 1}) == a  # the attempt again, in a worker holding others


def test_another_plan_is_another_batch(tmp_path):
    one, two = ranges([10] * 4), ranges([11] * 4)
    assert claims.claims_for(str(tmp_path), one, 2)[0].batch != claims.claims_for(str(tmp_path), two, 2)[0].batch
    assert claims.claims_for(str(tmp_path), one, 2)[0].batch != claims.claims_for(str(tmp_path), one, 3)[0].batch
    assert claims.claims_for(str(tmp_path), one, 2)[0].batch == claims.claims_for(str(tmp_path), list(reversed(one)), 2)[0].batch


def test_old_claim_files_are_swept_as_new_batches_are_claimed(tmp_path):
    old = claims.claims_for(str(tmp_path), ranges([1, 1]), 2)[0]
    claims.take(old, ranges([1, 1]), held=set())
    stale = tmp_path / f"{old.batch}.json"
    os.utime(stale, (time.time() - claims.KEEP_SECONDS - 1,) * 2)
    claims.take(claims.claims_for(str(tmp_path), ranges([2, 2]), 2)[0], ranges([2, 2]), held=set())
    assert not stale.exists() and len(list(tmp_path.glob("*.json"))) == 1


def test_sticky_claims_keep_each_workers_partitions_however_uneven(tmp_path):
    # Issue 35, scenario 3: in one task, a tick ran in either Python worker and moved every store
    # there (a catch-up from the changelog at the next tick in the other worker).
    batch = ranges([0, 0, 3, 0])  # one partition with records, three quiet ones
    first, second = claims.claims_for(str(tmp_path), batch, 2, sticky=True)
    # The first to start holds 0 and 1, however uneven; the last takes the rest, the ones it holds.
    a = claims.take(first, batch, held={0, 1})
    b = claims.take(second, batch, held={2, 3})
    assert [r.partition for r in a] == [0, 1] and [r.partition for r in b] == [2, 3]
