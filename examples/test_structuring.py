from .history import answers, case, day, one_by_one, planted, records, score
from .structuring import DETECTOR, Config


def transfers(customer, *spec):
    return [case(customer, at, type="transfer", amount=amount) for at, amount in spec]


def test_three_transfers_below_the_limit_that_add_up_above_it_within_a_day():
    rows = transfers("c-1", ("01:00:00", 4000.0), ("06:00:00", 3000.0), ("12:00:00", 3500.0), ("13:00:00", 9000.0))
    rows += transfers("c-2", ("01:00:00", 6000.0), ("02:00:00", 6000.0)) + transfers(
        "c-3", ("01:00:00", 12000.0), ("02:00:00", 1.0), ("03:00:00", 1.0)
    )
    (found,) = answers(DETECTOR, [records(rows)])
    assert (found["key"], found["transfers"], found["total"]) == ("c-1", 3, 10_500.0)


def test_the_same_answers_whatever_the_batches_restarts_and_partitions():
    rows = records(transfers("c-1", ("01:00:00", 4000.0), ("02:00:00", 4000.0), ("01:59:30", 4000.0)) + transfers("c-2", ("03:00:00", 9999.0)))
    once = answers(DETECTOR, [rows])
    assert [f["total"] for f in once] == [12_000.0]  # the late one (within the grace) makes the third
    assert answers(DETECTOR, one_by_one(rows), restart=True) == once
    assert answers(DETECTOR, [rows], partitions=3) == once
    assert answers(DETECTOR, [rows], Config(limit=20_000)) == []


def test_a_day_with_planted_structuring_is_flagged_with_precision_and_recall_one():
    cases = transfers("pc-1", ("02:00:00", 5000.0), ("08:00:00", 4000.0), ("20:00:00", 2000.0))
    cases += transfers("pc-2", ("10:00:00", 3000.0), ("10:30:00", 3500.0), ("11:00:00", 3800.0), ("11:30:00", 3900.0))
    cases += transfers("pc-3", ("01:00:00", 9000.0), ("02:00:00", 900.0))  # two
    background = day(types={"payment": 0.9, "transfer": 0.1})  # transfers of at most 900
    s = score(DETECTOR, planted(background, cases), ("key", {"pc-1", "pc-2"}), key_field="customer")
    assert (s.precision, s.recall) == (1.0, 1.0)
