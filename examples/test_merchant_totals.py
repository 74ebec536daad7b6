import pandas as pd

from .history import START, answers, case, day, one_by_one, planted, records, score
from .merchant_totals import DETECTOR, Config


def payments(merchant, start, count, amount=1000.0, every_seconds=4):
    first = pd.Timedelta(start)
    return [
        case(f"c-{n % 7}", str(first + pd.Timedelta(seconds=every_seconds * n)).split(" days ")[-1], merchant=merchant, amount=amount)
        for n in range(count)
    ]


def test_a_merchants_five_minutes_above_50_000_once_they_are_over_and_the_grace_too():
    rows = records(payments("m-7", "10:00:00", 60) + payments("m-8", "10:00:00", 40))
    (found,) = answers(DETECTOR, [rows], until="10:05:30")
    assert found["sum"] == 60_000.0 and found["deadline"] == START + pd.Timedelta("10:05:30")
    assert answers(DETECTOR, [rows], until="10:05:29") == []  # a late record may still come


def test_a_late_payment_within_the_grace_counts_and_one_after_the_window_closed_does_not():
    rows = payments("m-7", "10:00:00", 50)
    rows += [case("c-1", "10:04:50", merchant="m-7", amount=500.0), case("c-1", "10:05:20", merchant="m-9", amount=1.0)]
    rows += [case("c-1", "10:05:31", merchant="m-9", amount=1.0), case("c-1", "10:04:59", merchant="m-7", amount=9000.0)]
    (found,) = answers(DETECTOR, [records(rows)], until="11:00:00")
    assert found["sum"] == 50_500.0  # the 500 at 10:04:50 came before 10:05:30; the 9,000 after the window closed


def test_the_same_answers_whatever_the_batches_restarts_and_partitions():
    rows = records(payments("m-7", "10:00:00", 60) + payments("m-8", "10:02:00", 70, every_seconds=3) + payments("m-9", "10:04:00", 60))
    once = answers(DETECTOR, [rows], until="11:00:00")
    assert len(once) == 2  # m-9's payments fall into two windows
    assert answers(DETECTOR, one_by_one(rows), restart=True, until="11:00:00") == once
    assert answers(DETECTOR, [rows], partitions=3, until="11:00:00") == once
    assert len(answers(DETECTOR, [rows], Config(min_total=100_000), until="11:00:00")) == 0


def test_a_day_with_planted_totals_is_flagged_with_precision_and_recall_one():
    cases = payments("m-p0", "09:00:00", 60) + payments("m-p1", "14:30:00", 55, amount=1200.0) + payments("m-p2", "16:00:00", 45)
    cases += payments("m-p3", "18:03:00", 80)  # 320 s: across two windows, neither above
    s = score(DETECTOR, planted(day(), cases), ("key", {"m-p0", "m-p1"}), key_field="merchant")
    assert (s.precision, s.recall) == (1.0, 1.0)
