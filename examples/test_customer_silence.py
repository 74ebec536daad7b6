import numpy as np
import pandas as pd

from .customer_silence import DETECTOR, Config
from .history import START, answers, case, one_by_one, planted, records, score


def steady(customers=200, seed=3):
    """Every customer active all day, a record every 5-15 min: no silence of 30 min (the day ends before the last one could be)."""
    rng = np.random.default_rng(seed)
    rows = []
    for c in range(100, 100 + customers):
        minute = rng.integers(0, 10)
        while minute < 24 * 60 - 15:
            rows.append(case(f"c-{c}", f"{minute // 60:02d}:{minute % 60:02d}:{rng.integers(0, 60):02d}"))
            minute += rng.integers(5, 15)
    frame = pd.DataFrame(rows)
    frame["id"] = [f"r-{n}" for n in range(len(frame))]
    return frame.sort_values("ts", kind="stable").reset_index(drop=True)


def visits(customer, *times):
    return [case(customer, t) for t in times]


def test_three_records_within_an_hour_then_half_an_hour_without_one():
    rows = records(visits("c-1", "10:00:00", "10:20:00", "10:40:00") + visits("c-2", "10:00:00", "10:50:00"))
    (found,) = answers(DETECTOR, [rows], until="12:00:00")
    assert found["count"] == 3 and found["window_end_ms"] == (START + pd.Timedelta("10:40:00")).value // 1_000_000


def test_a_record_within_the_silence_moves_it_on_and_a_late_one_within_the_grace_counts():
    # 11:05 breaks the silence after 10:40; 10:39:30 comes late (within the 60 s grace) and counts.
    rows = records(visits("c-1", "10:00:00", "10:20:00", "10:40:00", "10:39:30", "11:05:00"))
    (found,) = answers(DETECTOR, [rows], until="13:00:00")
    assert found["count"] == 4 and found["window_end_ms"] == (START + pd.Timedelta("11:05:00")).value // 1_000_000


def test_the_same_answers_whatever_the_batches_restarts_and_partitions():
    # In time order: a partition's event time is its own, so a record as late as the one before it
    # (another key's) is late in one partition and not in another.
    rows = visits("c-1", "10:00:00", "10:20:00", "10:40:00") + visits("c-2", "10:00:00", "10:10:00", "10:20:00", "10:45:00", "11:30:00")
    rows = records(sorted(rows, key=lambda r: r["ts"]))
    once = answers(DETECTOR, [rows], until="13:00:00")
    assert len(once) == 2
    assert answers(DETECTOR, one_by_one(rows), restart=True, until="13:00:00") == once
    assert answers(DETECTOR, [rows], partitions=3, until="13:00:00") == once
    assert len(answers(DETECTOR, [rows], Config(min_records=4), until="13:00:00")) == 1


def test_a_day_with_planted_silences_is_flagged_with_precision_and_recall_one():
    quiet = ["c-1", "c-2", "c-3"]
    cases = visits("c-1", "08:00:00", "08:10:00", "08:20:00") + visits("c-2", "09:00:00", "09:30:00", "09:59:00", "10:00:00")
    cases += visits("c-3", "13:00:00", "13:30:00", "13:50:00", "15:00:00", "15:05:00")  # quiet after 13:50 and again after 15:05
    cases += visits("c-4", "11:00:00", "11:40:00") + visits("c-5", "12:00:00", "12:40:00", "13:30:00")  # never 3 within an hour
    s = score(DETECTOR, planted(steady(), cases), ("key", set(quiet)), key_field="customer")
    assert (s.precision, s.recall) == (1.0, 1.0)
