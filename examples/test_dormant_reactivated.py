from .dormant_reactivated import DETECTOR, Config
from .history import answers, case, day, one_by_one, planted, records, score


def test_a_record_after_sixty_days_without_one_and_not_a_first_record():
    rows = [case("c-1", "-70 days 10:00:00"), case("c-1", "10:00:00"), case("c-1", "10:05:00")]
    rows += [case("c-2", "-59 days 10:00:00"), case("c-2", "10:00:00"), case("c-3", "10:00:00")]
    (found,) = answers(DETECTOR, [records(rows)])
    assert found == {"customer": "c-1"}


def test_a_late_record_does_not_make_the_next_one_dormant_and_answers_do_not_depend_on_batches():
    rows = records([case("c-1", "-70 days"), case("c-1", "-10 days"), case("c-1", "-70 days 00:00:01"), case("c-1", "00:00:00")])
    once = answers(DETECTOR, [rows])
    assert once == [{"customer": "c-1"}]  # only -10 days: the newest before today's is -10 days
    assert answers(DETECTOR, one_by_one(rows), restart=True) == once
    assert answers(DETECTOR, [rows], partitions=3) == once
    assert answers(DETECTOR, [rows], Config(dormant_days=61)) == []


def test_a_day_with_planted_returns_is_flagged_with_precision_and_recall_one():
    cases = [case("c-1", "-80 days 09:00:00"), case("c-2", "-61 days 12:00:00"), case("c-3", "-30 days 12:00:00")]
    s = score(DETECTOR, planted(day(), cases), ("key", {"c-1", "c-2"}), key_field="customer")
    assert (s.precision, s.recall) == (1.0, 1.0)
