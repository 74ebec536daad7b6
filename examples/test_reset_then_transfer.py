from .history import answers, case, day, one_by_one, planted, records, score
from .reset_then_transfer import DETECTOR, Config


def test_a_reset_then_a_transfer_above_the_limit_within_ten_minutes():
    rows = [case("c-1", "09:00:00", type="password_reset"), case("c-1", "09:04:00", type="transfer", amount=900.0)]
    rows += [case("c-1", "09:05:00", type="transfer", amount=5000.0), case("c-1", "09:06:00", type="transfer", amount=7000.0)]
    rows += [case("c-2", "09:00:00", type="password_reset"), case("c-2", "09:10:01", type="transfer", amount=5000.0)]
    (found,) = answers(DETECTOR, [records(rows)])
    assert found["key"] == "c-1" and found["then_ms"] - found["first_ms"] == 5 * 60_000  # once: the reset is matched


def test_a_reset_that_arrives_late_within_the_grace_is_matched_on_itself_whatever_the_batches():
    rows = records([case("c-3", "09:30:30", type="transfer", amount=5000.0), case("c-3", "09:30:00", type="password_reset")])
    once = answers(DETECTOR, [rows])
    assert len(once) == 1 and once[0]["then_ms"] - once[0]["first_ms"] == 30_000
    assert answers(DETECTOR, one_by_one(rows), restart=True) == once
    assert answers(DETECTOR, [rows], partitions=3) == once
    assert answers(DETECTOR, [rows], Config(min_amount=5000)) == []


def test_a_day_with_planted_takeovers_is_flagged_with_precision_and_recall_one():
    cases = [case("pc-1", "08:00:00", type="password_reset"), case("pc-1", "08:09:59", type="transfer", amount=3000.0)]
    cases += [case("pc-2", "13:00:00", type="password_reset"), case("pc-2", "13:00:20", type="transfer", amount=2500.0)]
    cases += [case("pc-3", "17:00:20", type="transfer", amount=9000.0), case("pc-3", "17:00:00", type="password_reset")]  # the reset late
    cases += [case("pc-4", "10:00:00", type="password_reset"), case("pc-4", "10:11:00", type="transfer", amount=9000.0)]  # too late
    cases += [case("pc-5", "11:00:00", type="transfer", amount=9000.0), case("pc-5", "11:01:00", type="password_reset")]  # the other way round
    background = day(types={"payment": 0.8, "login": 0.1, "transfer": 0.08, "password_reset": 0.02})  # transfers of at most 900
    s = score(DETECTOR, planted(background, cases), ("key", {"pc-1", "pc-2", "pc-3"}), key_field="customer")
    assert (s.precision, s.recall) == (1.0, 1.0)
