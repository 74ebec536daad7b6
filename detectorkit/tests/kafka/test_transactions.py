"""A task's transaction on Apache Kafka: it commits its partitions' positions with what it wrote, a
position moved by someone else is refused, and a producer started elsewhere on the same id fences
this one."""

import uuid

import pytest
from confluent_kafka import Consumer

from detectorkit.kafka import clients, transactions
from detectorkit.testing import read_all

from ..jobs import committed


def topics(bs):
    suffix = uuid.uuid4().hex[:8]
    names = type("Topics", (), {"input": f"txn.in.{suffix}", "output": f"txn.out.{suffix}", "group": f"txn.{suffix}"})
    clients.create_topics(clients.base(bs), {names.input: 2, names.output: 1})
    return names


def metadata(bs, group):
    """The metadata of a consumer that never joined (generation -1): accepted while the group has no members."""
    consumer = Consumer(clients.consumer(clients.base(bs), group))
    try:
        return consumer.consumer_group_metadata()
    finally:
        consumer.close()


def run_slice(bs, t, starts, ends, value=b"x"):
    """A task reading `starts` (partition -> offset) that commits `ends` with one output per partition."""
    base = clients.base(bs)
    with transactions.for_task(base, clients.producer(base), t.group, t.input, starts, metadata(bs, t.group), 10_000, 30.0) as txns:
        for _ in starts:
            txns.sink.send(t.output, None, value)
        txns.commit(ends)


def test_a_task_commits_its_positions_with_its_output_and_a_position_moved_elsewhere_is_refused(transactional_kafka):
    bs, t = transactional_kafka, topics(transactional_kafka)
    run_slice(bs, t, {0: 0, 1: 0}, {0: 10, 1: 5})
    assert committed(bs, t, [0, 1]) == {0: 10, 1: 5}
    assert len(read_all(bs, t.output, committed_only=True)) == 2
    # A task that does not start where the group is (another member, or an earlier attempt of the
    # same task that committed before it failed, moved it): refused, nothing written.
    with pytest.raises(transactions.TransactionError, match="not where this slice starts"):
        run_slice(bs, t, {0: 4, 1: 5}, {0: 12, 1: 6})
    assert committed(bs, t, [0, 1]) == {0: 10, 1: 5}
    assert len(read_all(bs, t.output, committed_only=True)) == 2
    run_slice(bs, t, {0: 10}, {0: 12})
    assert committed(bs, t, [0]) == {0: 12}


def test_a_producer_started_on_the_same_id_elsewhere_fences_this_one(transactional_kafka):
    bs, t = transactional_kafka, topics(transactional_kafka)
    base = clients.base(bs)
    tid = transactions.transactional_id(t.group, t.input, 0)
    old = transactions.TransactionalSink(clients.producer(base), tid, 10_000, 30.0)
    old.begin()
    old.send(t.output, None, b"zombie")
    old.flush(10.0)  # in the log before it is fenced, so that the abort has something to hide
    new = transactions.TransactionalSink(clients.producer(base), tid, 10_000, 30.0)  # the partition's next task
    assert new.current() and not old.current()
    with pytest.raises(transactions.TransactionError, match="fenced"):
        old.commit([], metadata(bs, t.group), 10.0)
    new.begin()
    new.send(t.output, None, b"owner")
    new.commit([], metadata(bs, t.group), 10.0)
    old.close(1.0)
    new.close(1.0)
    assert [m["value"] for m in read_all(bs, t.output, committed_only=True)] == ["owner"]
    assert {m["value"] for m in read_all(bs, t.output)} == {"zombie", "owner"}  # written, never visible


def test_a_producer_fenced_after_its_transaction_outlived_the_timeout_is_said_to_have_timed_out():
    """The coordinator aborts a transaction open past its timeout by bumping the producer's epoch, so
    the producer hears "fenced"; the open time tells the two apart."""
    from confluent_kafka import KafkaError

    for code in (KafkaError.INVALID_PRODUCER_EPOCH, KafkaError.PRODUCER_FENCED):
        late = transactions.describe(KafkaError(code), "g-t-0", "committing", open_seconds=5.2, timeout_seconds=2)
        assert late.startswith("transaction g-t-0 timed out while committing: open 5.2 s, past TRANSACTION_TIMEOUT_SECONDS (2 s)"), late
        early = transactions.describe(KafkaError(code), "g-t-0", "committing", open_seconds=0.3, timeout_seconds=2)
        assert "fenced while committing: a newer task" in early, early
    assert "fenced" in transactions.describe(KafkaError(KafkaError.PRODUCER_FENCED), "g-t-0", "starting the transactional producer")


def test_a_partition_known_to_be_committed_at_its_start_is_not_read_back(transactional_kafka, monkeypatch):
    """A slice continuing its predecessor knows where its partitions are committed: right after a
    transaction commits them, a stable read would wait for the markers. Known, they are not read;
    one partition unknown, all are (and a position moved elsewhere is refused again)."""
    bs, t = transactional_kafka, topics(transactional_kafka)
    run_slice(bs, t, {0: 0, 1: 0}, {0: 10, 1: 5})
    reads = []
    real = transactions._committed
    monkeypatch.setattr(transactions, "_committed", lambda *a, **k: reads.append(a[3]) or real(*a, **k))
    base = clients.base(bs)

    def begin(starts, ends, known):
        with transactions.for_task(base, clients.producer(base), t.group, t.input, starts, metadata(bs, t.group), 10_000, 30.0, known=known) as txns:
            txns.commit(ends)

    begin({0: 10, 1: 5}, {0: 12, 1: 6}, frozenset({0, 1}))
    assert reads == [] and committed(bs, t, [0, 1]) == {0: 12, 1: 6}
    with pytest.raises(transactions.TransactionError, match="not where this slice starts"):
        begin({0: 12, 1: 4}, {0: 13, 1: 8}, frozenset({0}))
    assert reads == [[0, 1]] and committed(bs, t, [0, 1]) == {0: 12, 1: 6}


@pytest.mark.unit
def test_a_worker_holds_the_partitions_of_its_last_task_whose_producer_is_current(monkeypatch):
    """Sticky claims give a worker's next task what it holds: all of its last task's partitions (the
    producer's id names only the first; holding that one alone, a task claimed it alone and the
    other task took the other seven)."""
    from types import SimpleNamespace

    meta = b"generation-1"
    gen = transactions.generation_of(meta).hex()

    def sink(partitions, used, current=True):
        return SimpleNamespace(partitions=frozenset(partitions), used=used, current=lambda: current)

    held = {
        f"g-in-0/{gen}": sink({0, 1, 2, 3}, used=1.0),
        f"g-in-4/{gen}": sink({4, 5}, used=2.0),
        f"g-in-6/{gen}": sink({6, 7}, used=3.0, current=False),  # fenced since: another worker runs them
        "g-in-2/another-generation": sink({2}, used=4.0),
        f"g-other-1/{gen}": sink({1}, used=5.0),
    }
    monkeypatch.setattr(transactions._producers, "held", lambda: held)
    assert transactions.held("g", "in", meta) == {4, 5}
    assert transactions.held("g", "none", meta) == set()
