from .first_seen_merchant import DETECTOR, Config
from .history import answers, case, day, one_by_one, planted, records, score


def test_a_large_payment_to_a_merchant_the_customer_never_paid():
    rows = [case("c-1", "09:00:00", merchant="m-1", amount=20.0), case("c-1", "09:10:00", merchant="m-2", amount=800.0)]
    rows += [case("c-1", "09:20:00", merchant="m-2", amount=900.0), case("c-1", "09:30:00", merchant="m-3", amount=100.0)]
    rows += [case("c-2", "09:00:00", merchant="m-9", amount=5000.0)]  # a customer's very first record
    (found,) = answers(DETECTOR, [records(rows)])
    assert found == {"merchant": "m-2", "amount": 800.0}


def test_the_same_answers_whatever_the_batches_restarts_and_partitions():
    rows = records(
        [case("c-1", "09:00:00", merchant="m-1"), case("c-1", "09:01:00", merchant="m-2", amount=600.0), case("c-2", "09:02:00", merchant="m-1")]
        + [case("c-1", "09:03:00", merchant="m-2", amount=700.0), case("c-2", "09:04:00", merchant="m-4", amount=999.0)]
    )
    once = answers(DETECTOR, [rows])
    assert [f["merchant"] for f in once] == ["m-2", "m-4"]
    assert answers(DETECTOR, one_by_one(rows), restart=True) == once
    assert answers(DETECTOR, [rows], partitions=3) == once
    assert answers(DETECTOR, [rows], Config(min_amount=650)) == [{"merchant": "m-4", "amount": 999.0}]


def test_a_day_with_planted_new_merchants_is_flagged_with_precision_and_recall_one():
    cases = [case("c-1", "12:00:00", merchant="m-p1", amount=700.0), case("c-2", "15:00:00", merchant="m-p2", amount=2000.0)]
    cases += [case("c-1", "12:05:00", merchant="m-p1", amount=700.0)]  # known by then
    cases += [case("c-3", "16:00:00", merchant="m-p3", amount=300.0)]  # not above the amount
    s = score(DETECTOR, planted(day(max_amount=400), cases), ("id", {"p-0", "p-1"}), key_field="customer")
    assert (s.precision, s.recall) == (1.0, 1.0)
