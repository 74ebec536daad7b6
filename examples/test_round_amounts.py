from .history import answers, case, day, one_by_one, planted, records, score
from .round_amounts import DETECTOR, Config


def test_three_round_payments_in_a_day_on_the_third():
    rows = [case("c-1", "01:00:00", amount=500.0), case("c-1", "05:00:00", amount=1200.0), case("c-1", "06:00:00", amount=700.5)]
    rows += [case("c-1", "23:00:00", amount=3000.0), case("c-2", "01:00:00", amount=400.0), case("c-2", "02:00:00", amount=500.0)]
    (found,) = answers(DETECTOR, [records(rows)])
    assert (found["key"], found["count"]) == ("c-1", 3)


def test_the_same_answers_whatever_the_batches_restarts_and_partitions():
    rows = records([case(f"c-{n % 2}", f"{n:02d}:00:00", amount=500.0 + 100 * n) for n in range(8)] + [case("c-0", "07:59:30", amount=600.0)])
    once = answers(DETECTOR, [rows])
    assert len(once) == 2
    assert answers(DETECTOR, one_by_one(rows), restart=True) == once
    assert answers(DETECTOR, [rows], partitions=3) == once
    assert len(answers(DETECTOR, [rows], Config(min_payments=5))) == 1


def test_a_day_with_planted_round_payments_is_flagged_with_precision_and_recall_one():
    cases = [case("c-1", f"{h:02d}:00:00", amount=1000.0) for h in (2, 9, 20)]
    cases += [case("c-2", f"{h:02d}:30:00", amount=600.0) for h in (10, 11, 12, 13)]
    cases += [case("c-3", f"{h:02d}:00:00", amount=amount) for h, amount in ((1, 500.0), (2, 510.0), (3, 900.0))]
    s = score(DETECTOR, planted(day(max_amount=400), cases), ("key", {"c-1", "c-2"}), key_field="customer")
    assert (s.precision, s.recall) == (1.0, 1.0)
