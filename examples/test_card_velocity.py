from .card_velocity import DETECTOR, Config
from .history import answers, case, day, one_by_one, planted, records, score


def burst(card, start_minute, minutes, amount=1500.0, currency="EUR"):
    return [case(card.rsplit("-", 1)[0], f"10:{start_minute + m:02d}:00", card=card, amount=amount, currency=currency) for m in minutes]


def test_five_payments_within_ten_minutes_late_ones_included_are_one_detection():
    # Times 0, 100, 300, 250, 270 s: the two late ones (within the 60 s grace) count in the window up to 300 s.
    rows = [case("c-1", f"10:{s // 60:02d}:{s % 60:02d}", amount=1500.0) for s in (0, 100, 300, 250, 270)]
    (found,) = answers(DETECTOR, [records(rows)], until="11:00:00")
    assert found["windows"] == 1 and found["count"] == 5


def test_a_burst_of_29_minutes_is_one_detection_with_its_start_end_and_peak():
    (found,) = answers(DETECTOR, [records(burst("c-1-0", 0, range(0, 30)))], until="12:00:00")
    assert found["count"] == 11 and found["windows"] == 26
    assert found["window_end_ms"] - found["window_start_ms"] == (29 + 10 - 4) * 60_000


def test_four_payments_other_currencies_and_small_amounts_are_not_a_burst():
    rows = burst("c-1-0", 0, range(4)) + burst("c-1-0", 0, [5], currency="USD") + burst("c-1-0", 0, [6], amount=1000.0)
    assert answers(DETECTOR, [records(rows)], until="12:00:00") == []


def test_the_same_answers_whatever_the_batches_restarts_and_partitions():
    rows = burst("c-1-0", 0, range(0, 12, 2)) + burst("c-2-1", 1, range(0, 20, 2)) + burst("c-3-0", 0, range(3))
    rows = records(sorted(rows, key=lambda r: r["ts"]))
    once = answers(DETECTOR, [rows], until="12:00:00")
    assert len(once) == 2
    assert answers(DETECTOR, one_by_one(rows), restart=True, until="12:00:00") == once
    assert answers(DETECTOR, [rows], partitions=3, until="12:00:00") == once
    assert answers(DETECTOR, [rows], Config(min_amount=2000), until="12:00:00") == []


def test_a_day_with_planted_bursts_is_flagged_with_precision_and_recall_one():
    bursts = ["c-1-0", "c-2-1", "c-3-0", "c-4-1", "c-5-0"]
    cases = [r for n, card in enumerate(bursts) for r in burst(card, 5 * n, range(0, 2 * (5 + n), 2))]
    cases += burst("c-6-0", 30, range(0, 40, 10))  # one every 10 min: never 5 within 10
    history = planted(day(max_amount=900), cases)  # no background payment is above 1,000
    s = score(DETECTOR, history, ("key", set(bursts)), key_field="card")
    assert (s.precision, s.recall) == (1.0, 1.0)
