"""The partition store alone: what a batch reads and writes, TTL, and the changelog read back."""

import pandas as pd
import pytest

from detectorkit import State
from detectorkit.state import codec
from detectorkit.state.declaration import StateSchemaError
from detectorkit.state.store import PartitionStore, Prepared

STATE = State(columns=("count",), ttl_seconds=10)


def write(store, counts, tag, at_ms=0):
    keys = list(counts)
    new = pd.DataFrame({"count": [counts[k] for k in keys if counts[k] is not None]}, index=[k for k in keys if counts[k] is not None])
    store.write(store.prepare(new, keys, [at_ms] * len(keys), tag=tag), tag)
    store.advance(at_ms)


def records(log):
    """(key, value, tag) as the changelog holds them, with their changelog offsets."""
    return [(key, value, tag, offset) for offset, (key, value, tag) in enumerate(log)]


def test_a_batch_reads_what_the_last_one_wrote_and_a_key_left_out_loses_its_state():
    store = PartitionStore(STATE, 0)
    write(store, {"a": 1, "b": 2}, tag=10)
    assert store.read(["a", "b", "c"]).to_dict(orient="index") == {"a": {"count": 1}, "b": {"count": 2}}
    write(store, {"a": 5, "b": None}, tag=20)
    assert store.snapshot() == {"a": {"count": 5}}
    assert store.position == 20
    # Every key of the batch goes to the changelog, deleted ones as tombstones, each value with its batch's end.
    assert dict(store.take_changes()) == {"a": codec.encode({"count": 5}, 0, tag=20), "b": None}
    assert store.take_changes() == []


@pytest.mark.parametrize("state", [STATE, State(columns={"count": "int64"}, ttl_seconds=10)], ids=["untyped", "typed"])
def test_a_rollback_puts_back_held_keys_and_lets_go_of_keys_it_did_not_hold(state):
    store = PartitionStore(state, 0)
    write(store, {"a": 1, "gone": 1}, tag=10)
    write(store, {"gone": None}, tag=11)  # a tombstone pending for the changelog
    saved = store.savepoint(["new", "a", "gone"])
    write(store, {"a": 2, "new": 3, "gone": 4}, tag=20)
    store.rollback(saved)
    assert store.snapshot() == {"a": {"count": 1}}
    assert dict(store.take_changes()) == {"a": codec.encode({"count": 1}, 0, tag=10), "gone": None}


def test_reads_give_json_values_so_a_restart_changes_nothing_and_the_store_cannot_be_changed_in_place():
    store = PartitionStore(State(columns=("seen",)), 0)
    new = pd.DataFrame({"seen": [(1, 2)]}, index=["a"])
    store.write(store.prepare(new, ["a"], [0], tag=1), 1)
    first = store.read(["a"])
    assert first.at["a", "seen"] == [1, 2]  # a tuple comes back a list, as from the changelog
    first.at["a", "seen"].append(3)
    assert store.read(["a"]).at["a", "seen"] == [1, 2]


def test_a_value_that_is_not_json_is_refused_before_anything_changes():
    store = PartitionStore(STATE, 0)
    new = pd.DataFrame({"count": [pd.Timestamp("2026-01-01", tz="UTC")]}, index=["a"])
    with pytest.raises(TypeError, match="JSON types"):
        store.prepare(new, ["a"], [0], tag=1)
    assert len(store) == 0 and store.take_changes() == []


def test_ttl_follows_event_time_and_sweeps_only_what_expired():
    store = PartitionStore(STATE, 0)
    write(store, {"old": 1}, tag=1, at_ms=0)
    write(store, {"new": 1}, tag=2, at_ms=10_000)
    assert store.expire(2) == 0  # 10 s after "old": at its TTL, not past it
    write(store, {"newer": 1}, tag=3, at_ms=10_001)
    assert store.expire(3) == 1
    assert set(store.snapshot()) == {"new", "newer"}
    assert ("old", None) in store.take_changes()


def test_a_key_seen_again_lives_a_ttl_from_its_newest_record_and_a_spent_timer_lets_it_go():
    store = PartitionStore(STATE, 0)
    write(store, {"a": 1, "t": 1}, tag=1, at_ms=0)
    write(store, {"a": 2}, tag=2, at_ms=8_000)
    store.write(Prepared.of([("t", codec.encode({"count": 1}, 0, 30_000), 0, 30_000)]), 3)  # t waits for its timer
    write(store, {"b": 1}, tag=4, at_ms=18_000)
    assert store.expire(4) == 0  # a: 10 s after its newest record; t: has a timer
    write(store, {"b": 1}, tag=5, at_ms=18_001)
    assert store.expire(5) == 1 and "a" not in store.snapshot()
    assert store.due(30_000) == [("t", 30_000)]
    store.write(store.prepare(pd.DataFrame({"count": [1]}, index=["t"]), ["t"], [0], {"t": None}, tag=6), 6)  # fired, no timer now
    assert store.expire(6) == 1 and set(store.snapshot()) == {"b"}


def test_an_expired_key_reads_as_new_for_a_record_past_its_ttl():
    store = PartitionStore(STATE, 0)
    write(store, {"a": 7}, tag=1, at_ms=0)
    assert store.read(["a"], [10_000]).at["a", "count"] == 7
    assert store.read(["a"], [10_001]).empty


def test_a_rotating_key_space_keeps_the_store_flat():
    store = PartitionStore(STATE, 0)
    sizes = []
    for second in range(200):
        write(store, {f"k{second}-{i}": 1 for i in range(5)}, tag=second + 1, at_ms=second * 1000)
        store.expire(second + 1)
        sizes.append(len(store))
    assert max(sizes[50:]) == min(sizes[50:]) == 55  # 11 seconds of keys, 5 a second
    assert store._used == max(sizes) + 5  # the slots of expired keys go to new ones: the most held at once, before a sweep


def test_restore_skips_changes_of_batches_never_committed_and_a_zombies_late_writes():
    written = PartitionStore(STATE, 0)
    log = []
    for counts, tag in (({"a": 1, "b": 1}, 100), ({"a": 2}, 200), ({"a": 99, "b": 99}, 300)):  # 300: never committed
        write(written, counts, tag)
        log += [(k, v, tag) for k, v in written.take_changes()]
    log.append(("a", codec.encode({"count": 1}, 0), 100))  # a zombie's batch, written late
    restored = PartitionStore(STATE, 0)
    assert restored.restore(records(log), 200) == len(log)
    assert restored.snapshot() == {"a": {"count": 2}, "b": {"count": 1}}
    assert restored.changelog_offset == len(log)
    restored.advance(STATE.ttl_ms + 1)  # the restored keys expire as the written ones would
    assert restored.expire(200) == 2 and len(restored) == 0


def test_a_tombstone_is_not_undone_by_an_older_write_read_after_it():
    store = PartitionStore(STATE, 0)
    store.restore(records([("a", codec.encode({"count": 1}, 0), 100), ("a", None, 200), ("a", codec.encode({"count": 1}, 0), 100)]), 500)
    assert store.snapshot() == {}
    assert store.bytes == 0


def test_state_of_another_shape_stops_with_the_store_named_and_what_to_do():
    store = PartitionStore(State(columns=("total",)), 3, "state changelog svc.state-3")
    with pytest.raises(StateSchemaError) as raised:
        store.restore(records([("a", codec.encode({"count": 1}, 0), 1)]), 10)
    message = str(raised.value)
    assert "svc.state-3" in message and "['count']" in message and "['total']" in message and "State(name=...)" in message
    with pytest.raises(StateSchemaError, match="not detectorkit state"):
        store.restore(records([("a", b"not json", 1)]), 10)


def test_nan_and_infinity_which_json_lacks_read_back_as_none():
    store = PartitionStore(State(columns=("count", "flagged_ms")), 0)
    new = pd.DataFrame({"count": [1, 2], "flagged_ms": [None, 5]}, index=["a", "b"])  # pandas: NaN, 5.0
    store.write(store.prepare(new, ["a", "b"], [0, 0], tag=1), 1)
    assert dict(store.take_changes())["a"] == codec.encode({"count": 1, "flagged_ms": None}, 0, tag=1)
    store.write(store.prepare(pd.DataFrame({"count": [[float("inf"), 1.5]], "flagged_ms": [float("-inf")]}, index=["a"]), ["a"], [0], tag=2), 2)
    assert store.snapshot()["a"] == {"count": [None, 1.5], "flagged_ms": None}
