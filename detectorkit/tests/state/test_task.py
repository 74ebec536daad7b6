"""A task's state without Spark or Kafka: stores opened at the range's start, outputs flushed before
the changelog, the store kept only after its task succeeded, timers of quiet partitions."""

import contextlib
import dataclasses
import json
import time
from types import SimpleNamespace

import pyarrow as pa
import pytest
import structlog.testing

from detectorkit.kafka import offset_store, range_reader
from detectorkit.kafka.access import KafkaAccess
from detectorkit.kafka.planning import PartitionRange
from detectorkit.runtime import processing
from detectorkit.runtime.stage import as_stage
from detectorkit.runtime.task_context import TaskContext
from detectorkit.runtime.task_stores import TaskStores
from detectorkit.runtime.writers import AtLeastOnceWriter, TransactionalWriter
from detectorkit.state import cache, changelog, codec
from detectorkit.state.changelog import StateContext
from detectorkit.state.store import EVENT_TIME_KEY

from ..detectors import COUNT, SILENCE, CountConfig, SilenceConfig
from ..runtime.test_processing import arrow
from ..tasks import run_task

ACCESS = KafkaAccess({}, "svc", 5.0)


class Sink:
    def __init__(self, fail_flush=False, log=None):
        self.events, self.fail_flush = [], fail_flush
        self.log = log if log is not None else {}  # the changelog topic: partition -> records

    def send(self, topic, key, value, headers=None, partition=None, timestamp_ms=None):
        self.events.append(("send", topic, key, value, dict(headers or []), partition))
        if topic == "svc.state":
            self.log.setdefault(partition, []).append((key.decode(), value, codec.tag_of(headers, value)))

    def send_all(self, topic, partition, records, headers):
        for key, value in records:
            self.send(topic, key.encode(), value, headers, partition)

    def send_batch(self, topic, partition, records):
        self.send_all(topic, partition, records, None)

    def flush(self, timeout):
        self.events.append(("flush",))
        if self.fail_flush:
            raise RuntimeError("broker gone")


class Reader:
    """changelog.read over the fake log (offset = position in its list): each partition's records
    from its start, with its end; a start past the end is out of range; a restart reads from None."""

    def __init__(self, state, starts):
        self.state, self.starts, self.restarts = state, dict(starts), []

    def restart(self, partition):
        self.restarts.append(partition)

    def __iter__(self):
        todo = list(self.starts.items())
        while todo:
            partition, start = todo.pop(0)
            self.state["reads"].append((partition, start))
            records = self.state["log"].get(partition, [])
            if start is not None and start > len(records):
                yield changelog.Part(partition, [], out_of_range=True)
            else:
                read = [(k, v, tag, offset) for offset, (k, v, tag) in enumerate(records) if offset >= (start or 0)]
                yield changelog.Part(partition, read, len(records))
            todo += [(p, None) for p in self.restarts]
            self.restarts.clear()


@pytest.fixture
def kafka(monkeypatch):
    """The task's Kafka: a sink that records what is sent and flushed, changelog reads counted, and
    the changelog's ends (ListOffsets) asked."""
    log = {}
    state = {"sink": Sink(log=log), "reads": [], "log": log, "ends": []}

    @contextlib.contextmanager
    def for_worker(conf, idle=None):
        state["sink"].log = log
        yield state["sink"]

    def ends(ctx, partitions):
        state["ends"].append(sorted(partitions))
        return {p: len(log.get(p, [])) for p in partitions}

    monkeypatch.setattr(processing.sinks, "for_worker", for_worker)
    monkeypatch.setattr(changelog, "read", lambda ctx, starts: Reader(state, starts))
    monkeypatch.setattr(changelog, "ends", ends)
    monkeypatch.setattr(cache, "_stores", {})
    return state


def _process(ctx, batches, ends, stores):
    """A task at-least-once, as a slice's task runs one read."""
    with AtLeastOnceWriter(ctx) as writer:
        return list(run_task(ctx, batches, ends, stores, writer))


def task(detector, config, topic="svc.state", grace=60.0):
    return TaskContext("svc", as_stage(detector), config, ACCESS, "out", "svc.dlq", state=StateContext(topic, ACCESS, 600.0, grace, "in"))


def run(ctx, batch, start, end, partition=3, tick=0, tick_ms=None):
    ranges = [PartitionRange("in", partition, start, end, tick=tick, tick_ms=tick_ms)]
    return list(_process(ctx, iter([batch] if batch is not None else []), {partition: end}, TaskStores.open(ctx, ranges)))


def values(n):
    return [json.dumps({"i": i}).encode() for i in range(n)]


def test_outputs_are_flushed_before_the_changelog_and_the_store_is_kept_for_the_next_task(kafka):
    ctx = task(COUNT, CountConfig(every=2))
    batch = arrow(values(4), partition=3, first_offset=100)  # keys k0..k3: one record each
    run(ctx, batch, 100, 104)
    assert kafka["reads"] == [(3, None)]  # a fresh worker: the partition's state read back first
    kinds = [(e[0], e[1] if e[0] == "send" else None) for e in kafka["sink"].events]
    first_changelog = kinds.index(("send", "svc.state"))
    assert ("flush", None) in kinds[:first_changelog] and kinds[-1] == ("flush", None)
    changes = [e for e in kafka["sink"].events if e[0] == "send" and e[1] == "svc.state"]
    assert {e[2] for e in changes} == {b"k0", b"k1", b"k2", b"k3", EVENT_TIME_KEY.encode()}  # and the partition's event time
    assert {codec.tag_of(list(e[4].items()), e[3]) for e in changes} == {104} and {e[5] for e in changes} == {3}

    kafka["sink"] = Sink()
    run(ctx, arrow(values(4), partition=3, first_offset=104), 104, 108)  # the same keys again
    assert kafka["reads"] == [(3, None)]  # the store was current: nothing read
    out = [e for e in kafka["sink"].events if e[0] == "send" and e[1] == "out"]
    assert len(out) == 4  # every key's second record


def test_a_task_that_fails_leaves_no_store_behind(kafka):
    ctx = task(COUNT, CountConfig(every=2))
    kafka["sink"] = Sink(fail_flush=True)
    with pytest.raises(RuntimeError, match="broker gone"):
        run(ctx, arrow(values(4), partition=3, first_offset=100), 100, 104)
    kafka["sink"] = Sink()
    run(ctx, arrow(values(4), partition=3, first_offset=100), 100, 104)  # the batch again
    assert kafka["reads"] == [(3, None), (3, None)]  # read back again, not taken from the failed task
    assert not [e for e in kafka["sink"].events if e[0] == "send" and e[1] == "out"]  # counts started over: 1 each


def test_a_quiet_partitions_timers_fire_in_an_empty_task_as_the_wall_clock_passes_them(kafka):
    ctx = task(SILENCE, SilenceConfig(silence_seconds=1), grace=0.5)
    now_ms = int(time.time() * 1000)
    batch = arrow(values(2), partition=3, first_offset=100)
    stamps = pa.array([(now_ms - 5_000) * 1000] * 2, pa.timestamp("us", tz="UTC"))
    batch = batch.set_column(5, "timestamp", stamps)
    run(ctx, batch, 100, 102)
    assert not [e for e in kafka["sink"].events if e[1:2] == ("out",)]
    kafka["sink"] = Sink()
    run(ctx, None, 102, 102)  # a tick: nothing to read
    out = [e for e in kafka["sink"].events if e[0] == "send" and e[1] == "out"]
    assert sorted(e[2] for e in out) == [b"k0", b"k1"]
    source = json.loads(out[0][3])["source"]
    assert source["timer_ms"] == now_ms - 4_000 and source["partition"] == 3 and source["topic"] == "in"


def test_a_ticks_timers_fire_by_the_clock_when_it_was_planned_not_when_a_busy_executor_ran_it(kafka):
    """A record written after the tick's end offsets were listed, but stamped before its task ran,
    is not behind the partition's event time: the tick moves it by the time of its planning."""
    ctx = task(SILENCE, SilenceConfig(silence_seconds=1), grace=0.5)
    now_ms = int(time.time() * 1000)
    batch = arrow(values(2), partition=3, first_offset=100)
    batch = batch.set_column(5, "timestamp", pa.array([(now_ms - 5_000) * 1000] * 2, pa.timestamp("us", tz="UTC")))
    run(ctx, batch, 100, 102, tick=1)  # timers at now - 4 s
    kafka["sink"] = Sink()
    run(ctx, None, 102, 102, tick=2, tick_ms=now_ms - 4_200)  # planned 4.2 s ago: its event time is now - 4.7 s
    assert not [e for e in kafka["sink"].events if e[0] == "send" and e[1] == "out"]
    run(ctx, None, 102, 102, tick=3, tick_ms=now_ms - 3_000)
    assert sorted(e[2] for e in kafka["sink"].events if e[0] == "send" and e[1] == "out") == [b"k0", b"k1"]


def test_a_tick_run_by_another_worker_is_seen_by_this_one_so_no_timer_fires_twice(kafka, monkeypatch):
    """Spark runs a partition's tasks in whichever Python worker is free; a tick fires timers
    without moving the offset, so a store is current only at the same offset and tick."""
    ctx = task(SILENCE, SilenceConfig(silence_seconds=1), grace=0.5)
    workers = {"a": {}, "b": {}}
    now_ms = int(time.time() * 1000)
    batch = arrow(values(2), partition=3, first_offset=100).set_column(
        5, "timestamp", pa.array([(now_ms - 5_000) * 1000] * 2, pa.timestamp("us", tz="UTC"))
    )
    monkeypatch.setattr(cache, "_stores", workers["b"])
    run(ctx, batch, 100, 102, tick=1)  # worker b sets the timers
    monkeypatch.setattr(cache, "_stores", workers["a"])
    kafka["sink"] = Sink()
    run(ctx, None, 102, 102, tick=2)  # worker a runs the tick: they fire
    assert len([e for e in kafka["sink"].events if e[0] == "send" and e[1] == "out"]) == 2
    monkeypatch.setattr(cache, "_stores", workers["b"])
    kafka["sink"] = Sink()
    run(ctx, None, 102, 102, tick=3)  # back on worker b, whose store still has them
    assert not [e for e in kafka["sink"].events if e[0] == "send" and e[1] == "out"]


def test_a_partitions_records_read_in_interleaved_chunks_go_to_the_detector_once_in_offset_order(kafka):
    calls = []

    def detect(records, state, config):
        calls.append(list(records["i"]))
        return COUNT.detect(records, state, config)

    ctx = task(dataclasses.replace(COUNT, detect=detect), CountConfig(every=2))
    chunks = [arrow(values(2), partition=p, first_offset=100 + 2 * c) for c in range(3) for p in (3, 5)]  # 3, 5, 3, 5, ...
    ranges = [PartitionRange("in", p, 100, 106) for p in (3, 5)]
    list(_process(ctx, iter(chunks), {3: 106, 5: 106}, TaskStores.open(ctx, ranges)))
    assert calls == [[0, 1, 0, 1, 0, 1]] * 2  # one call a partition, its chunks in the order read


def test_a_worker_back_on_its_partition_reads_only_what_others_wrote_since(kafka, monkeypatch):
    """Spark swaps a job's partitions between its Python workers from batch to batch: a store that
    reread its own changes each time it came back read the changelog twice over."""
    ctx = task(COUNT, CountConfig(every=3))
    workers = {"a": {}, "b": {}}
    monkeypatch.setattr(cache, "_stores", workers["a"])
    run(ctx, arrow(values(4), partition=3, first_offset=100), 100, 104)
    mine = len(kafka["log"][3])  # 4 keys and the event time
    monkeypatch.setattr(cache, "_stores", workers["b"])
    run(ctx, arrow(values(4), partition=3, first_offset=104), 104, 108)
    monkeypatch.setattr(cache, "_stores", workers["a"])
    kafka["sink"] = Sink(log=kafka["log"])
    run(ctx, arrow(values(4), partition=3, first_offset=108), 108, 112)
    assert kafka["reads"] == [(3, None), (3, None), (3, mine - 1)]  # worker a: its own last change (checked), then b's
    out = [e for e in kafka["sink"].events if e[0] == "send" and e[1] == "out"]
    assert sorted(e[2] for e in out) == [b"k0", b"k1", b"k2", b"k3"]  # each key's third record, b's counts included


# ---- a flush interval: changes written once it passes, a move replays the records since ----------


def interval_task(seconds=60.0):
    return TaskContext(
        "svc",
        as_stage(COUNT),
        CountConfig(every=3),
        ACCESS,
        "out",
        "svc.dlq",
        state=StateContext("svc.state", ACCESS, 600.0, 60.0, "in", flush_interval_seconds=seconds),
    )


def summaries(rows):
    found = {}
    for batch in rows:
        for r in batch.to_pylist():
            found[r["partition"]] = json.loads(r["state"]) | ({} if r["durable"] is None else {"durable": r["durable"]})
    return found


@pytest.fixture
def input_log(monkeypatch):
    """The input topic as a replay reads it, and the group's committed metadata as a task reads it."""
    batches, durable = {}, {}

    def read_planned(source, ranges):
        for r in ranges:
            yield arrow(values(r.end - r.start), partition=r.partition, first_offset=r.start)
            batches.setdefault("replayed", []).append((r.partition, r.start, r.end))

    monkeypatch.setattr(range_reader, "read_planned", read_planned)
    monkeypatch.setattr(offset_store, "committed_durable", lambda conf, group, topic, partitions, timeout: {p: durable.get(p) for p in partitions})
    return SimpleNamespace(batches=batches, durable=durable)


def run_from(ctx, start, end, partition=3, caught_up=False):
    ranges = [PartitionRange("in", partition, start, end, caught_up=caught_up)]
    source = SimpleNamespace(client_conf={}, group="svc", topic="in")
    batch = arrow(values(end - start), partition=partition, first_offset=start)
    return list(_process(ctx, iter([batch]), {partition: end}, TaskStores.open(ctx, ranges, source)))


def test_with_an_interval_each_changed_key_is_written_once_when_it_has_passed(kafka, input_log):
    ctx = interval_task()
    first = summaries(run_from(ctx, 100, 104))[3]
    second = summaries(run_from(ctx, 104, 108))[3]
    assert first["written"] == second["written"] == 0 and "durable" not in second and 3 not in kafka["log"]
    cache._stores[("svc.state", 3, COUNT.state)][0].flushed_at -= 61  # the interval has passed
    third = summaries(run_from(ctx, 108, 112))[3]
    written = kafka["log"][3]
    assert sorted(k for k, _, _ in written) == sorted([EVENT_TIME_KEY, "k0", "k1", "k2", "k3"])  # each key once, for three batches
    assert third["durable"] == 112 and third["written"] == 5
    assert {codec.state_of(v)["count"] for k, v, _ in written if k != EVENT_TIME_KEY} == {3}
    assert {tag for k, _, tag in written} == {112}


def test_a_partition_read_to_its_end_is_written_at_once_so_a_quiet_one_keeps_nothing_back(kafka, input_log):
    ctx = interval_task()
    run_from(ctx, 100, 104)
    assert "durable" not in summaries(run_from(ctx, 104, 108))[3]  # a backlog: the interval holds
    assert summaries(run_from(ctx, 108, 112, caught_up=True))[3]["durable"] == 112


def test_a_worker_without_the_changes_reads_the_changelog_to_where_it_was_written_and_replays_the_rest(kafka, input_log, monkeypatch):
    ctx = interval_task()
    workers = {"a": {}, "b": {}}
    monkeypatch.setattr(cache, "_stores", workers["a"])
    assert summaries(run_from(ctx, 100, 104, caught_up=True))[3]["durable"] == 104  # counts of 1 in the changelog
    run_from(ctx, 104, 108)  # counts of 2, in worker a only
    input_log.durable[3] = 104  # what the driver committed with offset 108
    kafka["sink"] = Sink(log=kafka["log"])
    monkeypatch.setattr(cache, "_stores", workers["b"])
    run_from(ctx, 108, 112)
    assert kafka["reads"][-1] == (3, None) and input_log.batches["replayed"] == [(3, 104, 108)]
    # Nothing of the replayed records is written again; the third records count from 2, not from 1.
    out = [e for e in kafka["sink"].events if e[0] == "send" and e[1] == "out"]
    assert sorted(e[2] for e in out) == [b"k0", b"k1", b"k2", b"k3"]
    assert workers["b"][("svc.state", 3, COUNT.state)][0].snapshot() == {f"k{i}": {"count": 3} for i in range(4)}
    assert {tag for _, _, tag in kafka["log"][3][-4:]} == {112}  # written at once: the next move replays no more


def test_a_store_holding_changes_it_never_wrote_is_rebuilt_not_caught_up(kafka, input_log, monkeypatch):
    ctx = interval_task()
    workers = {"a": {}, "b": {}}
    monkeypatch.setattr(cache, "_stores", workers["a"])
    run_from(ctx, 100, 104, caught_up=True)  # counts of 1, written
    run_from(ctx, 104, 108)  # counts of 2, not written
    monkeypatch.setattr(cache, "_stores", workers["b"])
    input_log.durable[3] = 104
    assert summaries(run_from(ctx, 108, 112))[3]["durable"] == 112  # replays 104-108 first
    input_log.durable[3] = 112
    monkeypatch.setattr(cache, "_stores", workers["a"])
    kafka["reads"].clear()
    with structlog.testing.capture_logs() as logs:
        run_from(ctx, 112, 116)
    assert kafka["reads"] == [(3, None)]  # from the first record: a's counts of 2 were never written
    assert [e["reason"] for e in logs if e["event"] == "state store rebuilt"] == ["it holds changes its changelog has not got"]
    assert workers["a"][("svc.state", 3, COUNT.state)][0].snapshot() == {f"k{i}": {"count": 4} for i in range(4)}


def _crashed_with_changes_not_written(ctx, input_log, monkeypatch):
    """At-least-once with an interval: counts of 1 written at 104, counts of 2 (to 108) only in a
    worker that is gone, and the group's commit at 108 says the changelog reflects 104."""
    monkeypatch.setattr(cache, "_stores", {})
    run_from(ctx, 100, 104, caught_up=True)
    run_from(ctx, 104, 108)
    input_log.durable[3] = 104
    monkeypatch.setattr(cache, "_stores", {})  # redeployed: a new worker


def test_a_redeploy_without_the_interval_still_replays_what_the_commit_says_the_changelog_lacks(kafka, input_log, monkeypatch):
    _crashed_with_changes_not_written(interval_task(), input_log, monkeypatch)
    run_from(interval_task(0), 108, 112)
    assert input_log.batches["replayed"] == [(3, 104, 108)]
    assert next(iter(cache._stores.values()))[0].snapshot() == {f"k{i}": {"count": 3} for i in range(4)}


def test_a_redeploy_with_exactly_once_replays_what_the_commit_says_the_changelog_lacks_inside_the_transaction(kafka, input_log, monkeypatch):
    _crashed_with_changes_not_written(interval_task(), input_log, monkeypatch)
    committed = []

    class Transactions:
        sink = kafka["sink"]
        partitions = frozenset({3})

        def commit(self, ends, offsets_sent=None):
            committed.extend(sorted(ends.items()))

    @contextlib.contextmanager
    def for_task(*args, **kwargs):
        yield Transactions()

    monkeypatch.setattr(processing.transactions, "for_task", for_task)
    ctx = dataclasses.replace(interval_task(0), exactly_once=True)
    source = SimpleNamespace(client_conf={}, group="svc", topic="in", group_metadata="00")
    ranges = [PartitionRange("in", 3, 108, 112)]
    with TransactionalWriter(ctx, source, ranges) as writer:
        stores = TaskStores.open(ctx, ranges, source)
        list(run_task(ctx, range_reader.read_planned(source, ranges), {3: 112}, stores, writer))
    # The replay's read, then the batch's own (the fake input reads both).
    assert input_log.batches["replayed"] == [(3, 104, 108), (3, 108, 112)] and committed == [(3, 112)]
    assert next(iter(cache._stores.values()))[0].snapshot() == {f"k{i}": {"count": 3} for i in range(4)}
    # The replayed state went to the changelog in the transaction, tagged with its end.
    assert {tag for _, _, tag in kafka["log"][3][-4:]} == {112}


# ---- issue 35: stores kept current through ticks, a zombie's late changes, a changelog gone ---------


def stamped(n, first_offset, age_ms):
    """`n` records of keys k0.. on partition 3, `age_ms` old by the wall clock."""
    batch = arrow(values(n), partition=3, first_offset=first_offset)
    at = int(time.time() * 1000) - age_ms
    return batch.set_column(5, "timestamp", pa.array([at * 1000] * n, pa.timestamp("us", tz="UTC")))


@pytest.mark.parametrize("interval", [0.0, 60.0], ids=["every-batch", "interval"])
def test_a_timer_detectors_store_stays_current_through_the_sources_ticks(kafka, interval):
    """The source ticks (an empty range for a quiet partition, and a new tick on every range) every
    few seconds: a store kept in its worker must not be read back at each one, nor, holding changes
    an interval has not written yet, be rebuilt from the changelog's start."""
    ctx = task(SILENCE, SilenceConfig(silence_seconds=1), grace=0.5)
    ctx = dataclasses.replace(ctx, state=dataclasses.replace(ctx.state, flush_interval_seconds=interval))
    run(ctx, stamped(2, 100, 5_000), 100, 102, tick=1)
    run(ctx, None, 102, 102, tick=2)  # a tick: k0, k1 fire
    run(ctx, stamped(3, 102, 0), 102, 105, tick=2)  # records within the same tick
    run(ctx, stamped(4, 105, 0), 105, 109, tick=3)  # records in the next tick
    run(ctx, None, 109, 109, tick=5)  # a tick, one skipped (the job was busy)
    kafka["sink"] = Sink(log=kafka["log"])
    run(ctx, stamped(1, 109, 0), 109, 110, tick=6)
    assert kafka["reads"] == [(3, None)]  # read once, when the worker first ran the partition
    assert len(kafka["ends"]) == 4  # a ListOffsets at each new tick: nobody else wrote the changelog
    store = cache._stores[("svc.state", 3, SILENCE.state)][0]
    assert (store.position, store.tick) == (110, 6)


def test_a_store_is_current_after_a_batch_that_changed_no_state(kafka):
    ctx = task(COUNT, CountConfig(every=2))
    run(ctx, arrow(values(4), partition=3, first_offset=100), 100, 104)
    run(ctx, arrow([b"{not json"] * 4, partition=3, first_offset=104), 104, 108)  # dead letters only
    run(ctx, arrow(values(4), partition=3, first_offset=108), 108, 112)
    assert kafka["reads"] == [(3, None)]
    assert len([e for e in kafka["sink"].events if e[0] == "send" and e[1] == "out"]) == 4


def test_a_zombies_late_changes_do_not_hide_the_new_owners(kafka, monkeypatch):
    """At-least-once, A pauses mid-batch, B takes the partition, runs further and commits; A wakes
    and writes its changes after B's (its commit is refused). When the partition comes back to A
    at B's committed offset, A must hold B's counts, not its own."""
    ctx = task(COUNT, CountConfig(every=3))
    workers = {"a": {}, "b": {}}
    monkeypatch.setattr(cache, "_stores", workers["a"])
    run(ctx, arrow(values(4), partition=3, first_offset=100), 100, 104)  # A: counts of 1
    a_stores = TaskStores.open(ctx, [PartitionRange("in", 3, 104, 108)])  # A's next task starts, and pauses
    monkeypatch.setattr(cache, "_stores", workers["b"])
    chunks = [arrow(values(4), partition=3, first_offset=o) for o in (104, 108)]
    list(_process(ctx, iter(chunks), {3: 112}, TaskStores.open(ctx, [PartitionRange("in", 3, 104, 112)])))  # B: counts of 3
    monkeypatch.setattr(cache, "_stores", workers["a"])
    list(_process(ctx, iter([arrow(values(4), partition=3, first_offset=104)]), {3: 108}, a_stores))  # A wakes: counts of 2, written last
    kafka["sink"] = Sink(log=kafka["log"])
    run(ctx, arrow(values(4), partition=3, first_offset=112), 112, 116)  # back to A, at B's committed offset
    assert workers["a"][("svc.state", 3, COUNT.state)][0].snapshot() == {f"k{i}": {"count": 4} for i in range(4)}
    assert not [e for e in kafka["sink"].events if e[0] == "send" and e[1] == "out"]  # 4th records: none is a 3rd
    # A looked for its last change where it expected it (offset 8: its first 5 records, then 4 more;
    # the event time did not move), found B's there (B wrote 5-8, A 9-12), and read the changelog
    # again from its first record.
    assert kafka["reads"] == [(3, None), (3, None), (3, 8), (3, None)]


def test_a_store_whose_changelog_lost_its_offset_is_read_again_from_the_first_record(kafka, monkeypatch):
    """The changelog was deleted and created again (or truncated): a catch-up from an offset it no
    longer has must not jump to its end (librdkafka's default) but restore in full."""
    ctx = task(COUNT, CountConfig(every=3))
    workers = {"a": {}, "b": {}}

    def on(worker, start, n, first=None):
        monkeypatch.setattr(cache, "_stores", workers[worker])
        run(ctx, arrow(values(n) if first is None else [first] * n, partition=3, first_offset=start), start, start + n)

    on("a", 100, 4)  # counts of 1 at 0-4
    on("b", 104, 4)  # counts of 2 at 5-8
    on("a", 108, 2, b"{not json")  # a catches up (9 records) and changes nothing: it expects the end at 9
    kafka["log"][3] = []  # the changelog created again, empty
    on("b", 110, 2)  # k0, k1: counts of 1 (b's own offset is gone too), at 0-2
    kafka["sink"] = Sink(log=kafka["log"])
    on("a", 112, 4)
    assert kafka["reads"][-2:] == [(3, 9), (3, None)]  # 9: beyond the new changelog's end (3)
    assert workers["a"][("svc.state", 3, COUNT.state)][0].snapshot() == {
        "k0": {"count": 2},
        "k1": {"count": 2},
        "k2": {"count": 1},
        "k3": {"count": 1},
    }
    assert not [e for e in kafka["sink"].events if e[0] == "send" and e[1] == "out"]  # a's own counts of 2 would have made 3s
