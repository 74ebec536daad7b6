from .distinct_countries import DETECTOR, Config
from .history import answers, case, day, one_by_one, planted, records, score


def test_a_card_in_three_countries_within_an_hour_on_the_third():
    rows = [case("c-1", "10:00:00", country="FR"), case("c-1", "10:20:00", country="FR"), case("c-1", "10:30:00", country="DE")]
    rows += [case("c-1", "10:50:00", country="ES"), case("c-1", "10:55:00", country="IT")]
    (found,) = answers(DETECTOR, [records(rows)])
    assert found["countries"] == 3 and found["key"] == "c-1-0"


def test_three_countries_over_more_than_an_hour_or_on_two_cards_are_not():
    rows = [case("c-1", "10:00:00", country="FR"), case("c-1", "10:30:00", country="DE"), case("c-1", "11:01:00", country="ES")]
    rows += [case("c-2", "10:00:00", country="FR"), case("c-2", "10:01:00", country="DE"), case("c-2", "10:02:00", country="ES", card="c-2-1")]
    assert answers(DETECTOR, [records(rows)]) == []


def test_a_late_record_within_the_grace_counts_and_the_answers_do_not_depend_on_batches():
    rows = records([case("c-1", "10:00:30", country="FR"), case("c-1", "11:00:00", country="DE"), case("c-1", "10:59:40", country="ES")])
    once = answers(DETECTOR, [rows])
    assert [f["countries"] for f in once] == [3]  # ES at 10:59:40 came 20 s late: the hour up to 11:00 holds all three
    assert answers(DETECTOR, one_by_one(rows), restart=True) == once
    assert answers(DETECTOR, [rows], partitions=3) == once
    assert answers(DETECTOR, [rows], Config(min_countries=4)) == []


def test_a_day_with_planted_travellers_is_flagged_with_precision_and_recall_one():
    cases = [case("c-1", "09:00:00", country="FR"), case("c-1", "09:10:00", country="BE"), case("c-1", "09:40:00", country="NL")]
    cases += [case("c-2", "15:00:00", country="DE", card="c-2-1"), case("c-2", "15:59:00", country="AT", card="c-2-1")]
    cases += [case("c-2", "15:59:30", country="CH", card="c-2-1")]
    cases += [case("c-3", "12:00:00", country="US"), case("c-3", "14:00:00", country="CA")]  # two, two hours apart
    s = score(DETECTOR, planted(day(), cases), ("key", {"c-1-0", "c-2-1"}), key_field="card")
    assert (s.precision, s.recall) == (1.0, 1.0)
