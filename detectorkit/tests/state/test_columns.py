"""Typed state columns: the store keeps them as arrays, the detector gets arrays, the changelog the
same JSON as untyped state."""

from unittest import mock

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectorkit import State
from detectorkit.state import codec, columns, lists
from detectorkit.state.declaration import StateSchemaError
from detectorkit.state.store import PartitionStore

TYPED = State(columns={"recent_ms": "list<int64>", "flagged_ms": "float64", "count": "int64"}, ttl_seconds=10)
UNTYPED = State(columns=("recent_ms", "flagged_ms", "count"), ttl_seconds=10)


def frame(rows: dict) -> pd.DataFrame:
    keys = list(rows)
    return pd.DataFrame(
        {c: pd.Series([rows[k][c] for k in keys], index=keys, dtype=object) for c in ("recent_ms", "flagged_ms", "count")}, index=keys
    )


def write(store, rows, tag, keys=None, at_ms=0, timers=None):
    keys = list(rows) if keys is None else keys
    store.write(store.prepare(frame(rows), keys, [at_ms] * len(keys), timers, tag=tag), tag)
    store.advance(at_ms)


def test_a_batch_gets_numbers_as_numpy_and_lists_as_arrow_columns_it_cannot_change_the_store_through():
    store = PartitionStore(TYPED, 0)
    write(store, {"a": {"recent_ms": [1, 2], "flagged_ms": None, "count": 1}, "b": {"recent_ms": [], "flagged_ms": 5.0, "count": 2}}, tag=1)
    state = store.read(["b", "a", "c"])
    assert list(state.index) == ["b", "a"]
    assert state["count"].dtype == np.int64 and state["flagged_ms"].dtype == np.float64
    assert state["recent_ms"].list.len().tolist() == [0, 2] and state["recent_ms"].list.flatten().tolist() == [1, 2]
    state.loc["a", "count"] = 99
    assert store.read(["a"]).at["a", "count"] == 1
    assert store.snapshot() == {"a": {"recent_ms": [1, 2], "flagged_ms": None, "count": 1}, "b": {"recent_ms": [], "flagged_ms": 5.0, "count": 2}}


def test_lists_builds_a_column_from_values_and_lengths_and_a_longer_list_widens_the_store():
    store = PartitionStore(TYPED, 0)
    new = pd.DataFrame({"recent_ms": lists([7, 8, 9, 10, 11], [1, 4]), "flagged_ms": [np.nan, 1.5], "count": [3, 4]}, index=["b", "a"])
    store.write(store.prepare(new.iloc[::-1], ["a", "b"], [0, 0], tag=1), 1)  # rows in another order than the keys
    assert store.snapshot() == {
        "a": {"recent_ms": [8, 9, 10, 11], "flagged_ms": 1.5, "count": 4},
        "b": {"recent_ms": [7], "flagged_ms": None, "count": 3},
    }
    with pytest.raises(ValueError, match="add up to 3, there are 2 values"):
        lists([1, 2], [1, 2])


@pytest.mark.parametrize(
    ("column", "value", "says"),
    [
        ("count", None, "int64, and None is not"),
        ("count", 1.5, "whole number"),
        ("count", "1", "int64, and '1' is not"),
        ("flagged_ms", "x", "float64, and 'x' is not"),
        ("recent_ms", None, "needs a list"),
        ("recent_ms", [None], "may not hold None"),
        ("recent_ms", [1.5], "list<int64>, and [1.5] is not"),
        ("recent_ms", "ab", "list<int64>, and 'ab' is not"),
    ],
)
def test_a_value_that_does_not_fit_its_type_is_refused_before_anything_changes(column, value, says):
    store = PartitionStore(TYPED, 0)
    row = {"recent_ms": [1], "flagged_ms": 1.0, "count": 1} | {column: value}
    with pytest.raises(TypeError, match=says.replace("[", r"\[").replace("]", r"\]")):
        store.prepare(frame({"a": row}), ["a"], [0], tag=1)
    assert len(store) == 0 and store.take_changes() == []


def test_the_changelog_gets_each_changed_key_once_with_the_tag_of_the_batch_that_last_wrote_it():
    store = PartitionStore(TYPED, 0)
    write(store, {"a": {"recent_ms": [1], "flagged_ms": None, "count": 1}, "b": {"recent_ms": [2], "flagged_ms": None, "count": 1}}, tag=10)
    write(store, {"a": {"recent_ms": [1, 3], "flagged_ms": 3.0, "count": 2}}, tag=20, keys=["a", "c"], timers={"a": 9_000})
    assert dict(store.take_changes()) == {
        "a": codec.encode({"recent_ms": [1, 3], "flagged_ms": 3.0, "count": 2}, 0, 9_000, tag=20),
        "b": codec.encode({"recent_ms": [2], "flagged_ms": None, "count": 1}, 0, tag=10),
        "c": None,
    }


def test_state_written_untyped_reads_back_typed_and_a_value_that_does_not_fit_stops_the_restore():
    written = PartitionStore(UNTYPED, 0)
    write(written, {"a": {"recent_ms": [1, 2], "flagged_ms": 4.5, "count": 3}}, tag=5)
    log = [(k, v, codec.tag_of(None, v), i) for i, (k, v) in enumerate(written.take_changes())]
    restored = PartitionStore(TYPED, 0)
    restored.restore(log, 5)
    assert restored.snapshot() == written.snapshot()
    assert restored.read(["a"])["recent_ms"].list.flatten().tolist() == [1, 2]
    wrong = codec.encode({"recent_ms": ["x"], "flagged_ms": None, "count": 1}, 0, tag=1)
    with pytest.raises(StateSchemaError) as raised:
        PartitionStore(TYPED, 2, "state changelog svc.state-2").restore([("k", wrong, 1, 0)], 5)
    assert "svc.state-2" in str(raised.value) and "list<int64>" in str(raised.value) and "State(name=...)" in str(raised.value)


def test_a_type_that_is_not_offered_is_refused_with_the_ones_that_are():
    with pytest.raises(ValueError, match="int64, float64, list<int64>, list<float64>"):
        State(columns={"a": "string"})


# One operation on a store: write rows (None: the key loses its state) at a tag, with timers; or expire.
_ROWS = st.dictionaries(
    st.sampled_from("abcdefgh"),
    st.none()
    | st.fixed_dictionaries(
        {
            "recent_ms": st.lists(st.integers(-(2**40), 2**40), max_size=6),
            "flagged_ms": st.none() | st.floats(allow_nan=False, allow_infinity=False),
            "count": st.integers(-(2**53), 2**53),
        }
    ),
    min_size=1,
)
_OPS = st.lists(st.tuples(_ROWS, st.integers(0, 30_000), st.booleans(), st.booleans()), max_size=12)


@settings(max_examples=150, deadline=None)
@given(_OPS)
def test_typed_and_untyped_stores_agree_on_every_read_change_and_restore(ops):
    # Rooms and pools as small as they go here: rows move, and pools are packed, within a few writes.
    with mock.patch.object(columns, "FIRST_ROOM", 1), mock.patch.object(columns, "FIRST_POOL", 1):
        _typed_and_untyped_agree(ops)


def test_a_busy_keys_long_list_costs_its_own_room_and_rolls_back_as_it_was():
    store = PartitionStore(TYPED, 0)
    rows = {f"k{i}": {"recent_ms": [i], "flagged_ms": None, "count": i} for i in range(100)}
    rows["busy"] = {"recent_ms": list(range(10_000)), "flagged_ms": 1.0, "count": 0}
    write(store, rows, tag=1)
    pool = store._typed._lists["recent_ms"]
    # Each row has room for twice what it holds, not for the longest row.
    assert pool.room[store._slot["k7"]] == columns.FIRST_ROOM and pool.room[store._slot["busy"]] == 20_000
    assert store.read(["k7", "busy"])["recent_ms"].list.len().tolist() == [1, 10_000]
    saved = store.savepoint(["busy", "k7"])
    write(
        store,
        {"busy": {"recent_ms": [1], "flagged_ms": 1.0, "count": 0}, "k7": {"recent_ms": list(range(500)), "flagged_ms": None, "count": 7}},
        tag=2,
    )
    assert store.read(["k7", "busy"])["recent_ms"].list.len().tolist() == [500, 1]
    store.rollback(saved)
    assert store.snapshot()["busy"]["recent_ms"] == list(range(10_000)) and store.snapshot()["k7"]["recent_ms"] == [7]
    busy = store._slot["busy"]
    write(store, {}, tag=3, keys=["busy"])
    assert pool.room[busy] == 0 and pool.left >= 20_000  # a key let go gives up its room
    write(store, {"big": {"recent_ms": list(range(30_000)), "flagged_ms": None, "count": 1}}, tag=4)
    # No room for it: the rows were packed, and the room given up is gone.
    assert pool.left == 0 and pool.top == int(pool.room.sum())
    assert store.snapshot()["big"]["recent_ms"] == list(range(30_000)) and store.snapshot()["k7"]["recent_ms"] == [7]
    assert "busy" not in store.snapshot()


def _typed_and_untyped_agree(ops):
    typed, untyped = PartitionStore(TYPED, 0), PartitionStore(UNTYPED, 0)
    typed_log, untyped_log = [], []
    for tag, (rows, at_ms, timed, take) in enumerate(ops, start=1):
        kept = {k: v for k, v in rows.items() if v is not None}
        timers = {k: at_ms + 5_000 for k in kept} if timed else None
        for store in (typed, untyped):
            store.write(store.prepare(frame(kept), list(rows), [at_ms] * len(rows), timers, tag=tag), tag)
            store.advance(at_ms)
            store.expire(tag)
        assert typed.snapshot() == untyped.snapshot()
        _assert_same_reads(typed, untyped, list("abcdefgh"))
        if take:
            typed_log += [(k, v, tag) for k, v in typed.take_changes()]
            untyped_log += [(k, v, tag) for k, v in untyped.take_changes()]
            assert typed_log == untyped_log
    typed_log += [(k, v, len(ops)) for k, v in typed.take_changes()]
    # A value carries its batch's tag; a tombstone is sent with the tag of the flush (runtime.checkpoint).
    log = [(k, v, tag if v is None else codec.tag_of(None, v), i) for i, (k, v, tag) in enumerate(typed_log)]
    restored = PartitionStore(TYPED, 0)
    restored.restore(log, len(ops))
    assert restored.snapshot() == typed.snapshot()


def _assert_same_reads(typed: PartitionStore, untyped: PartitionStore, keys: list[str]) -> None:
    a, b = typed.read(keys), untyped.read(keys)
    assert list(a.index) == list(b.index)
    assert a["recent_ms"].list.flatten().tolist() == [t for r in b["recent_ms"] for t in r]
    assert a["count"].tolist() == b["count"].tolist()
    assert [None if f != f else f for f in a["flagged_ms"].tolist()] == [None if f != f else f for f in b["flagged_ms"].tolist()]


def test_typed_lists_go_to_the_changelog_byte_for_byte_as_untyped_ones_long_rows_included():
    declared = {"amounts": "list<float64>", "recent_ms": "list<int64>"}
    typed, untyped = PartitionStore(State(columns=declared), 0), PartitionStore(State(columns=tuple(declared)), 0)
    rows = {f"k{i}": {"amounts": [i + 0.1, 5e-324, -1e300][: i % 4], "recent_ms": list(range(i))} for i in range(8)}
    rows["busy"] = {"amounts": [x / 7 for x in range(200)], "recent_ms": [2**62, -(2**62)]}
    for store in (typed, untyped):
        keys = list(rows)
        data = pd.DataFrame({c: pd.Series([rows[k][c] for k in keys], index=keys, dtype=object) for c in declared}, index=keys)
        store.write(store.prepare(data, keys, [0] * len(keys), tag=4), 4)
    assert typed.take_changes() == untyped.take_changes()


LISTS = State(columns={"t": "list<int64>", "v": "list<float64>"})
_LIST_ROWS = st.dictionaries(
    st.sampled_from("abcdefgh"),
    st.tuples(st.lists(st.integers(-(2**62), 2**62), max_size=8), st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=8)),
    min_size=1,
)


@settings(max_examples=100, deadline=None)
@given(st.lists(_LIST_ROWS, min_size=1, max_size=6))
def test_a_detector_on_its_stores_lists_reads_writes_and_encodes_them_as_a_detect_call_does(batches):
    """`lists_of` and `write_lists` (compiled row copies, and the changelog's bytes gathered by a
    compiled loop once they were used) against `prepare` and `write`: the same lists read, held,
    and written to the changelog byte for byte, with rows that move and pools packed among them."""
    with mock.patch.object(columns, "FIRST_ROOM", 1), mock.patch.object(columns, "FIRST_POOL", 1):
        plain, fast = PartitionStore(LISTS, 0), PartitionStore(LISTS, 0)
        held: dict[str, tuple[list, list]] = {}
        for tag, rows in enumerate(batches, 1):
            keys = list(rows)
            _, seen, read = fast.lists_of(keys)
            for c, name in enumerate(("t", "v")):
                values, lengths = read[name]
                assert values.tolist() == [x for k in keys for x in held.get(k, ([], []))[c]]
                assert lengths.tolist() == [len(held.get(k, ([], []))[c]) for k in keys]
            assert (seen >= 0).tolist() == [k in held for k in keys]
            data = pd.DataFrame({name: pd.Series([rows[k][c] for k in keys], index=keys, dtype=object) for c, name in enumerate("tv")}, index=keys)
            plain.write(plain.prepare(data, keys, [tag] * len(keys), tag=tag), tag)
            new = {
                name: (np.array([x for k in keys for x in rows[k][c]], dtype=dtype), np.array([len(rows[k][c]) for k in keys], dtype=np.int64))
                for c, (name, dtype) in enumerate((("t", np.int64), ("v", np.float64)))
            }
            fast.write_lists(keys, fast.lists_of(keys)[0], np.full(len(keys), tag, dtype=np.int64), new, tag)
            held.update(rows)
            assert fast.snapshot() == plain.snapshot()
            assert fast.take_changes() == plain.take_changes()
