"""A stateful detector run over batches without Kafka or Spark (the harness uses the runtime's runner,
store and changelog encoding): failures isolated with the state they leave, and what it refuses."""

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectorkit import Detector, State
from detectorkit.state import lists
from detectorkit.state.store import PartitionStore
from detectorkit.testing import DetectorError, DetectorHarness


@dataclass(frozen=True)
class Config:
    every: int = 3


def count(records, state, config):
    """Flag every `every`-th record of a key; records whose `bad` is set make it raise."""
    if "bad" in records and records["bad"].fillna(False).astype(bool).any():
        raise ValueError("a bad record")
    counts = state["count"].to_dict()
    hits, rows = [], {}
    for index, key in records["key"].items():
        counts[key] = counts.get(key, 0) + 1
        if counts[key] % config.every == 0:
            hits.append(index)
        rows[key] = counts[key]
    return pd.DataFrame({"n": [counts[records.at[i, "key"]] for i in hits]}, index=hits), pd.DataFrame({"count": rows})


COUNT = Detector(name="count", detect=count, config=Config, state=State(columns=("count",)))


def stream(keys, start="2026-01-01"):
    return pd.DataFrame({"key": keys, "event_time": pd.date_range(start, periods=len(keys), freq="s", tz="UTC")})


def test_state_carries_from_batch_to_batch_and_across_a_restart():
    run = DetectorHarness(COUNT)
    records = stream(["a", "b", "a", "a", "b", "b", "a", "a", "a"])
    found = []
    for i in range(0, len(records), 2):
        found.append(run.batch(records.iloc[i : i + 2]))
        run.restart()
    assert list(pd.concat(found).index) == [3, 5, 8]
    assert run.state() == {"a": {"count": 6}, "b": {"count": 3}}


def test_a_record_that_makes_the_detector_raise_leaves_the_others_and_their_state_alone():
    records = stream(["a", "a", "a", "a"]).assign(bad=[False, True, False, False])
    run = DetectorHarness(COUNT)
    with pytest.raises(DetectorError, match="a bad record"):
        run.batch(records)
    # In the job the bad record goes to the dead-letter topic; the others count in order.
    assert run.state() == {"a": {"count": 3}}


def append_in_place(records, state, config):
    """Appends each record's id to its key's list in the state it was handed (in place), then fails
    on a record whose `bad` is set."""
    held = state["ids"].to_dict()
    for index, key in records["key"].items():
        held.setdefault(key, []).append(int(records.at[index, "id"]))
    if records["bad"].fillna(False).astype(bool).any():
        raise ValueError("a bad record")
    return pd.DataFrame(index=records.index[:0]), pd.DataFrame({"ids": pd.Series(held, dtype=object)})


APPEND = Detector(name="append", detect=append_in_place, config=Config, state=State(columns=("ids",)))


def test_a_detector_that_changes_its_state_in_place_and_fails_leaves_the_state_as_it_was():
    run = DetectorHarness(APPEND)
    run.batch(stream(["a", "a"]).assign(id=[1, 2], bad=False))
    # The second record fails: the first is run alone (bisection) from the state before both.
    with pytest.raises(DetectorError, match="a bad record"):
        run.batch(stream(["a", "a"], start="2026-01-02").assign(id=[3, 4], bad=[False, True]))
    assert run.state() == {"a": {"ids": [1, 2, 3]}}
    run.restart()
    assert run.state() == {"a": {"ids": [1, 2, 3]}}


def append_and_time(records, state, config):
    """As append_in_place, and a timer 1.5 s after the batch's first record."""
    detections, new_state = append_in_place(records.assign(bad=False), state, config)
    first = records.index[0]
    return detections, new_state, pd.Series([records.at[first, "event_time"] + pd.Timedelta(seconds=1.5)], index=[first])


def fired_ids(fired, config):
    return pd.DataFrame({"ids": [list(ids) for ids in fired["ids"]]}, index=fired.index), fired[["ids"]]


TIMED = Detector(name="timed", detect=append_and_time, config=Config, state=State(columns=("ids",)), on_timer=fired_ids)


def test_records_cut_at_a_timer_are_run_again_from_the_state_they_started_from():
    run = DetectorHarness(TIMED)
    run.batch(stream(["a"], start="2026-01-01").assign(id=[0]))
    # Its timer fires before the next day's first record. Then the timer set at that record falls
    # due at its third: the records are run up to there, the timer fires, then the rest; the first
    # try over all four (which changed the state it was handed in place) is not written.
    run.batch(stream(["a"] * 4, start="2026-01-02").assign(id=[1, 2, 3, 4]))
    assert run.take_fired()["ids"].tolist() == [[0], [0, 1, 2]]
    assert run.state() == {"a": {"ids": [0, 1, 2, 3, 4]}}
    run.restart()
    assert run.state() == {"a": {"ids": [0, 1, 2, 3, 4]}}


def test_what_a_stateful_detector_returns_is_checked():
    def no_state(records, state, config):
        return pd.DataFrame(index=records.index[:0])

    def stray_key(records, state, config):
        return pd.DataFrame(index=records.index[:0]), pd.DataFrame({"count": [1]}, index=["not-in-batch"])

    def wrong_columns(records, state, config):
        return pd.DataFrame(index=records.index[:0]), pd.DataFrame({"total": [1]}, index=[records["key"].iloc[0]])

    for detect, message in ((no_state, "returns \\(detections, new_state\\)"), (stray_key, "not in the batch"), (wrong_columns, "declares")):
        run = DetectorHarness(Detector(name="x", detect=detect, config=Config, state=State(columns=("count",))))
        with pytest.raises(DetectorError, match=message):
            run.batch(stream(["a"]))


def test_records_need_the_key_and_event_time_the_runtime_adds():
    with pytest.raises(ValueError, match="event_time"):
        DetectorHarness(COUNT).batch(pd.DataFrame({"key": ["a"]}))


def test_a_state_declaration_with_no_columns_or_a_bad_name_is_refused():
    with pytest.raises(ValueError, match="columns"):
        State(columns=())
    with pytest.raises(ValueError, match="name"):
        State(columns=("a",), name="has space")
    with pytest.raises(ValueError, match="ttl"):
        State(columns=("a",), ttl_seconds=0)
    with pytest.raises(TypeError, match="detectorkit.State"):
        Detector(name="x", detect=count, state={"columns": ("a",)})


# ---- a key left out of the new state keeps its state (issue 36) ---------------------------------


def failed_logins(records, state, config, declared):
    """Flags a customer's 3rd failed login since their last password reset. Filters first: new
    state only for the customers with a failure or a reset in these records, as a data scientist
    would write it; a reset deletes the customer's state explicitly (`declared.deleted`)."""
    relevant = records[records["status"] != "ok"]
    counts = state["failures"].to_dict()
    hits = []
    for index, key, status in zip(relevant.index, relevant["key"], relevant["status"], strict=True):
        if status == "reset":
            counts.pop(key, None)
            continue
        counts[key] = counts.get(key, 0) + 1
        if counts[key] == 3:
            hits.append(index)
    keys = [k for k in relevant["key"].unique() if k in counts]
    gone = [k for k in relevant["key"].unique() if k not in counts]
    detections = pd.DataFrame({"failures": [3] * len(hits)}, index=pd.Index(hits, dtype=records.index.dtype))
    new_state = pd.DataFrame({"failures": np.array([counts[k] for k in keys], dtype=np.int64)}, index=pd.Index(keys, dtype=object))
    return detections, pd.concat([new_state, declared.deleted(gone)]) if gone else new_state


def failed_logins_detector(declared):
    return Detector(name="failed-logins", detect=functools.partial(failed_logins, declared=declared), config=Config, state=declared)


FAILED_LOGINS = failed_logins_detector(State(columns=("failures",)))
FAILED_LOGINS_TYPED = failed_logins_detector(State(columns={"failures": "int64"}))


def logins(rows, first=0):
    """rows: (customer, status), a second apart from the `first`-th second, indexed from `first`."""
    frame = stream([k for k, _ in rows], start=pd.Timestamp("2026-01-01") + pd.Timedelta(seconds=first))
    return frame.assign(status=[s for _, s in rows]).set_axis(range(first, first + len(rows)))


def third_failures(rows) -> list[int]:
    """One pass: the position of each customer's 3rd failed login since their last reset."""
    failures, found = {}, []
    for i, (key, status) in enumerate(rows):
        if status == "reset":
            failures.pop(key, None)
        elif status == "failed":
            failures[key] = failures.get(key, 0) + 1
            if failures[key] == 3:
                found.append(i)
    return found


@st.composite
def login_batches(draw):
    rows = draw(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from(["failed", "failed", "ok", "ok", "reset"])), min_size=1, max_size=40))
    cuts = sorted(set(draw(st.lists(st.integers(1, len(rows)), max_size=8))))
    return rows, cuts, draw(st.integers(0, len(cuts)))


@pytest.mark.parametrize("detector", [FAILED_LOGINS, FAILED_LOGINS_TYPED], ids=["untyped", "typed"])
@settings(max_examples=150, deadline=None)
@given(login_batches())
def test_a_detector_that_filters_first_answers_as_one_pass_whatever_the_batches(detector, case):
    """A batch of a customer's successful logins only leaves their state out of the new state: they
    keep it, so their earlier failures still count, wherever the batches split; a reset forgets them."""
    rows, cuts, restart_after = case
    run = DetectorHarness(detector)
    bounds = [0, *cuts, len(rows)]
    found = []
    for i, (start, end) in enumerate(zip(bounds, bounds[1:], strict=False)):
        if end > start:
            found += run.batch(logins(rows[start:end], start)).index.tolist()
        if i == restart_after:
            run.restart()
    assert found == third_failures(rows)


def test_a_key_left_out_of_the_new_state_is_still_seen_by_its_records_for_the_ttl():
    """A customer's successful logins keep their failures alive (the TTL runs from their newest
    record, whatever the detector returned), also across a restart; a gap past the TTL forgets."""
    for gap, flagged in ((8, True), (12, False)):
        run = DetectorHarness(failed_logins_detector(State(columns={"failures": "int64"}, ttl_seconds=10)))
        at = 0
        for status in ("failed", "failed", "ok", "ok", "ok", "failed"):
            found = run.batch(logins([("a", status)], at))
            run.restart()
            at += gap
        assert found.index.tolist() == ([5 * gap] if flagged else []), gap


UNTYPED_HISTORY = State(columns=("t", "n", "f"))
TYPED_HISTORY = State(columns={"t": "list<int64>", "n": "int64", "f": "float64"})


def history(state_decl, arrow_lists):
    """Each key's last 3 record seconds (`t`), its record count (`n`) and n / 2 once it has two
    records (`f`, NaN before). A key whose last record here says `forget` is deleted explicitly,
    `pd.concat([new_state, STATE.deleted(gone)])`; the others of the batch get their new state.
    `arrow_lists`: `t` as an Arrow list column (`lists`), or as Python lists (object)."""

    def detect(records, state, config):
        held = {k: (list(t), int(n)) for k, t, n in zip(state.index, state["t"].tolist(), state["n"].tolist(), strict=True)}
        last = {}
        for key, at, status in zip(records["key"], records["event_time"], records["status"], strict=True):
            t, n = held.get(key, ([], 0))
            held[key] = ((t + [at.value // 1_000_000_000])[-3:], n + 1)
            last[key] = status
        keep = [k for k, s in last.items() if s != "forget"]
        gone = [k for k, s in last.items() if s == "forget"]
        ts = [held[k][0] for k in keep]
        column = lists([x for t in ts for x in t], [len(t) for t in ts]) if arrow_lists else pd.Series(ts, dtype=object).to_numpy()
        n = np.array([held[k][1] for k in keep], dtype=np.int64)
        new_state = pd.DataFrame({"t": column, "n": n, "f": np.where(n >= 2, n / 2, np.nan)}, index=pd.Index(keep, dtype=object))
        return pd.DataFrame(index=records.index[:0]), pd.concat([new_state, state_decl.deleted(gone)])

    return Detector(name="history", detect=detect, config=Config, state=state_decl)


def seconds(rows, first):
    """rows: (key, status) at seconds first, first + 1, ..."""
    frame = stream([k for k, _ in rows], start=pd.Timestamp("1970-01-01") + pd.Timedelta(seconds=first))
    return frame.assign(status=[s for _, s in rows])


@pytest.mark.parametrize("arrow_lists", [True, False], ids=["arrow-lists", "python-lists"])
@pytest.mark.parametrize("state_decl", [UNTYPED_HISTORY, TYPED_HISTORY], ids=["untyped", "typed"])
def test_a_key_is_forgotten_only_when_its_state_is_deleted_explicitly(state_decl, arrow_lists):
    run = DetectorHarness(history(state_decl, arrow_lists))
    run.batch(seconds([("a", "ok"), ("a", "ok"), ("b", "ok")], 0))
    assert run.state() == {"a": {"t": [0, 1], "n": 2, "f": 1.0}, "b": {"t": [2], "n": 1, "f": None}}
    # a deleted with its record counted; c new; b, not in the batch, untouched.
    run.batch(seconds([("a", "forget"), ("c", "ok")], 3))
    assert run.state() == {"b": {"t": [2], "n": 1, "f": None}, "c": {"t": [4], "n": 1, "f": None}}
    # Only deletions: the new state is STATE.deleted(...) alone, concatenated with no rows.
    run.batch(seconds([("b", "forget")], 5))
    run.restart()
    assert run.state() == {"c": {"t": [4], "n": 1, "f": None}}
    run.batch(seconds([("a", "ok"), ("c", "ok"), ("c", "ok"), ("c", "ok")], 6))
    run.restart()
    assert run.state() == {"a": {"t": [6], "n": 1, "f": None}, "c": {"t": [7, 8, 9], "n": 4, "f": 2.0}}
    assert {k for k, v, _ in run.changelog[0] if v is None} == {"a", "b"}  # their tombstones


def test_deleted_rows_have_every_value_missing_and_concatenate_without_changing_the_declared_types():
    gone = TYPED_HISTORY.deleted(["x", "y"])
    assert list(gone.index) == ["x", "y"] and gone.index.name == "key" and list(gone.columns) == ["t", "n", "f"]
    assert gone.isna().all(axis=None)
    kept = pd.DataFrame({"t": lists([1, 2, 3], [1, 2]), "n": np.array([1, 2]), "f": [0.5, np.nan]}, index=pd.Index(["a", "b"], dtype=object))
    both = pd.concat([kept, gone])
    assert both["t"].dtype == kept["t"].dtype and both["f"].dtype == np.float64
    assert both["n"].iloc[:2].tolist() == [1, 2] and both["n"].isna().tolist() == [False, False, True, True]
    assert UNTYPED_HISTORY.deleted([]).empty and UNTYPED_HISTORY.deleted(["x"]).isna().all(axis=None)
    # Through the store: the deleted rows dropped, what is kept exact (an int64 past 2**53 too).
    store = PartitionStore(TYPED_HISTORY, 0)
    new_state = TYPED_HISTORY.completed(pd.concat([kept.assign(n=[2**62 + 1, 2]), gone]), None)
    store.write(store.prepare(new_state, ["a", "b", "x", "y"], [0] * 4, tag=1), 1)
    assert store.snapshot() == {"a": {"t": [1], "n": 2**62 + 1, "f": 0.5}, "b": {"t": [2, 3], "n": 2, "f": None}}


def remember_last(records, state, config):
    """Each key's newest second, and its timer 10 s after each record."""
    last = records.groupby("key")["event_time"].max()
    new_state = pd.DataFrame({"last": (last.astype("int64") // 1_000_000_000).to_numpy()}, index=pd.Index(last.index, dtype=object))
    return pd.DataFrame(index=records.index[:0]), new_state, records["event_time"] + pd.Timedelta(seconds=10)


def flag(fired):
    return pd.DataFrame({"last": fired["last"]}, index=fired.index)


def leave_out(fired, config):
    return flag(fired), fired.iloc[:0][["last"]]


def leave_out_and_time_again(fired, config):
    return flag(fired), fired.iloc[:0][["last"]], fired["deadline"] + pd.Timedelta(seconds=10)


def timed(on_timer, columns):
    return Detector(name="timed", detect=remember_last, config=Config, state=State(columns=columns), on_timer=on_timer)


def deleting(state_decl):
    def on_timer(fired, config):
        return flag(fired), state_decl.deleted(fired.index)

    return on_timer


@pytest.mark.parametrize("columns", [("last",), {"last": "int64"}], ids=["untyped", "typed"])
def test_on_timer_leaving_a_fired_key_out_keeps_its_state_and_deleting_it_forgets_it(columns):
    run = DetectorHarness(timed(leave_out, columns))
    run.batch(stream(["a", "b"], start="1970-01-01"))  # a at 0 s, b at 1 s: timers at 10 and 11
    run.advance(pd.Timestamp(10, unit="s", tz="UTC"))
    assert run.take_fired().index.tolist() == ["a"]
    run.restart()
    run.advance(pd.Timestamp(60, unit="s", tz="UTC"))
    assert run.take_fired().index.tolist() == ["b"]  # a fired once: its timer was spent
    assert run.state() == {"a": {"last": 0}, "b": {"last": 1}}

    run = DetectorHarness(timed(deleting(State(columns=columns)), columns))
    run.batch(stream(["a", "b"], start="1970-01-01"))
    run.advance(pd.Timestamp(10, unit="s", tz="UTC"))
    assert run.state() == {"b": {"last": 1}}
    run.restart()
    assert run.state() == {"b": {"last": 1}}


def test_a_key_left_out_of_the_new_state_may_get_a_timer_a_deleted_key_may_not():
    # on_timer: a key it leaves out keeps its state, so it may set the key's timer again.
    run = DetectorHarness(timed(leave_out_and_time_again, ("last",)))
    run.batch(stream(["a"], start="1970-01-01"))
    run.advance(pd.Timestamp(25, unit="s", tz="UTC"))
    assert run.take_fired().index.tolist() == ["a", "a"]  # at 10 and at 20
    assert run.state() == {"a": {"last": 0}}

    def time_deleted(fired, config):
        return flag(fired), State(columns=("last",)).deleted(fired.index), fired["deadline"] + pd.Timedelta(seconds=10)

    run = DetectorHarness(timed(time_deleted, ("last",)))
    run.batch(stream(["a"], start="1970-01-01"))
    with pytest.raises(DetectorError, match="a timer needs state"):
        run.advance(pd.Timestamp(10, unit="s", tz="UTC"))

    # detect: the same.
    def time_only(records, state, config):
        return pd.DataFrame(index=records.index[:0]), state.iloc[:0], records["event_time"] + pd.Timedelta(seconds=10)

    def time_and_delete(records, state, config):
        keys = records["key"].unique()
        return pd.DataFrame(index=records.index[:0]), State(columns=("last",)).deleted(keys), records["event_time"] + pd.Timedelta(seconds=10)

    run = DetectorHarness(timed(leave_out, ("last",)))
    run.batch(stream(["a"], start="1970-01-01"))
    run.detector = dataclasses.replace(run.detector, detect=time_only)
    run.batch(stream(["a"], start="1970-01-01 00:00:05"))  # a keeps its state; its timer moves to 15 s
    run.advance(pd.Timestamp(14, unit="s", tz="UTC"))
    assert run.take_fired().empty
    run.advance(pd.Timestamp(15, unit="s", tz="UTC"))
    assert run.take_fired().to_dict(orient="index") == {"a": {"last": 0, "deadline": pd.Timestamp(15, unit="s", tz="UTC")}}
    run.detector = dataclasses.replace(run.detector, detect=time_and_delete)
    with pytest.raises(DetectorError, match="a timer needs state"):
        run.batch(stream(["a"], start="1970-01-01 00:00:30"))
