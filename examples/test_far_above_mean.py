from .far_above_mean import DETECTOR, Config
from .history import answers, case, day, one_by_one, planted, records, score


def history_of(customer, count, amount=40.0, start_hour=8):
    return [case(customer, f"{start_hour + n // 60:02d}:{n % 60:02d}:00", amount=amount) for n in range(count)]


def test_a_payment_five_times_the_customers_mean_once_there_are_ten():
    rows = history_of("c-1", 11) + [case("c-1", "09:00:00", amount=500.0)]  # mean (440 + 500) / 12 = 78.3
    rows += history_of("c-2", 5) + [case("c-2", "09:00:00", amount=5000.0)]  # 6 payments: too few to judge
    (found,) = answers(DETECTOR, [records(rows)])
    assert (found["key"], found["payments"], found["amount"]) == ("c-1", 12, 500.0)


def test_a_late_payment_counts_where_it_belongs_and_the_answers_do_not_depend_on_batches():
    rows = history_of("c-1", 12) + [case("c-1", "09:00:00", amount=600.0), case("c-1", "08:59:30", amount=40.0)]
    once = answers(DETECTOR, [records(rows)])
    assert [f["amount"] for f in once] == [600.0]
    assert answers(DETECTOR, one_by_one(records(rows)), restart=True) == once
    assert answers(DETECTOR, [records(rows)], partitions=3) == once
    assert answers(DETECTOR, [records(rows)], Config(factor=20)) == []


def test_a_day_with_planted_outliers_is_flagged_with_precision_and_recall_one():
    cases = [case("c-1", "14:00:00", amount=2000.0), case("c-2", "18:00:00", amount=900.0), case("c-3", "19:00:00", amount=120.0)]
    background = day(sigma=0.2)  # amounts close to 33: none five times a customer's mean
    s = score(DETECTOR, planted(background, cases), ("id", {"p-0", "p-1"}), key_field="customer")
    assert (s.precision, s.recall) == (1.0, 1.0)
