"""The source's ticks: a detector with timers gets a batch now and then even when nothing arrives,
with an empty range for every partition that has nothing to read (their timers fire in it)."""

from detectorkit.kafka.source import CAUGHT_UP, TICK, KafkaStreamReader
from detectorkit.kafka.source_options import SourceOptions


def reader(tick_seconds):
    return KafkaStreamReader(SourceOptions(topic="in", client_conf={}, group="g", tick_seconds=tick_seconds, broker_kind="kafka"))


def ranges_of(parts):
    return sorted((r.partition, r.start, r.end) for p in parts for r in p.ranges)


def test_a_new_tick_plans_empty_ranges_for_the_partitions_with_nothing_to_read():
    start = {"in": {"0": 10, "1": 20}, TICK: 1}
    end = {"in": {"0": 15, "1": 20}, TICK: 2, CAUGHT_UP: [0, 1]}
    assert ranges_of(reader(10).partitions(start, end)) == [(0, 10, 15), (1, 20, 20)]


def test_a_ticks_ranges_carry_when_it_began_the_clock_its_quiet_partitions_fire_by():
    start = {"in": {"0": 10, "1": 20}, TICK: 1}
    end = {"in": {"0": 15, "1": 20}, TICK: 170_000_000, CAUGHT_UP: [0, 1]}
    assert {r.tick_ms for p in reader(10).partitions(start, end) for r in p.ranges} == {1_700_000_000_000}


def test_a_partition_whose_records_wait_behind_the_batch_cap_is_not_quiet():
    """Its event time must come from its records, not from the wall clock: seen firing a silence
    timer while the customer's next record waited in Kafka (MAX_RECORDS_PER_BATCH=5)."""
    start = {"in": {"0": 10, "1": 20}, TICK: 1}
    end = {"in": {"0": 15, "1": 20}, TICK: 2, CAUGHT_UP: [0]}
    assert ranges_of(reader(10).partitions(start, end)) == [(0, 10, 15)]


def test_within_one_tick_only_partitions_with_records_are_planned():
    start = {"in": {"0": 10, "1": 20}, TICK: 2}
    end = {"in": {"0": 15, "1": 20}, TICK: 2}
    assert ranges_of(reader(10).partitions(start, end)) == [(0, 10, 15)]


def test_without_timers_nothing_empty_is_planned():
    assert ranges_of(reader(None).partitions({"in": {"0": 10, "1": 20}}, {"in": {"0": 15, "1": 20}})) == [(0, 10, 15)]


def test_with_state_written_once_an_interval_each_range_says_whether_it_reads_to_the_end():
    """A stateful task writes a caught-up partition's changes at once (runtime.checkpoint)."""
    planner = KafkaStreamReader(SourceOptions(topic="in", client_conf={}, group="g", broker_kind="kafka", marks_caught_up=True))
    end = {"in": {"0": 15, "1": 30}, CAUGHT_UP: [0]}  # partition 1's records go on behind the cap
    ranges = [r for p in planner.partitions({"in": {"0": 10, "1": 20}}, end) for r in p.ranges]
    assert {r.partition: r.caught_up for r in ranges} == {0: True, 1: False}
