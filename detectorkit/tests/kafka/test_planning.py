"""Offset planning of the Kafka source, without Spark or a broker."""

import pytest

from detectorkit.kafka.planning import (
    DataLossError,
    NoCommittedOffsetsError,
    PartitionRange,
    cap_end_offsets,
    from_spark,
    pack_ranges,
    plan_ranges,
    reconcile,
    resolve_start,
    to_spark,
)


class TestResolveStart:
    def test_committed_offsets_win_over_the_policy(self):
        assert resolve_start({0: 5, 1: 7}, {0: 0, 1: 0}, {0: 10, 1: 10}, "latest") == {0: 5, 1: 7}

    def test_latest_where_nothing_is_committed(self):
        assert resolve_start({0: 5, 1: None}, {}, {0: 10, 1: 12}, "latest") == {0: 5, 1: 12}

    def test_earliest_where_nothing_is_committed(self):
        assert resolve_start({0: None, 1: None}, {0: 3, 1: 0}, {0: 10, 1: 12}, "earliest") == {0: 3, 1: 0}

    def test_error_names_the_group_topic_and_partitions(self):
        with pytest.raises(NoCommittedOffsetsError, match=r"'g'.*'t' partition\(s\) 1, 2.*STARTING_OFFSETS=error"):
            resolve_start({0: 1, 1: None, 2: None}, {}, {0: 5, 1: 5, 2: 5}, "error", topic="t", group="g")

    def test_error_with_everything_committed_starts_there(self):
        assert resolve_start({0: 1}, {}, {0: 5}, "error") == {0: 1}

    def test_unknown_policy_is_refused(self):
        with pytest.raises(ValueError, match="one of latest, earliest, error"):
            resolve_start({}, {}, {0: 1}, "newest")


class TestCap:
    def test_no_cap_takes_everything(self):
        assert cap_end_offsets({0: 10, 1: 0}, {0: 110, 1: 50}, None) == {0: 110, 1: 50}

    def test_backlog_under_the_cap_takes_everything(self):
        assert cap_end_offsets({0: 10, 1: 0}, {0: 20, 1: 5}, 100) == {0: 20, 1: 5}

    def test_cap_is_spread_in_proportion_to_backlog_and_sums_exactly(self):
        end = cap_end_offsets({0: 0, 1: 0, 2: 0}, {0: 300, 1: 100, 2: 0}, 100)
        assert end == {0: 75, 1: 25, 2: 0}

    def test_remainders_go_to_the_largest_fractions(self):
        end = cap_end_offsets({0: 0, 1: 0, 2: 0}, {0: 10, 1: 10, 2: 10}, 10)
        assert sum(end.values()) == 10
        assert all(3 <= v <= 4 for v in end.values())

    def test_never_beyond_latest_nor_before_start(self):
        start, latest = {0: 5, 1: 9, 2: 1}, {0: 1000, 1: 10, 2: 7}
        end = cap_end_offsets(start, latest, 50)
        assert all(start[p] <= end[p] <= latest[p] for p in latest)
        assert sum(end[p] - start[p] for p in latest) == 50

    def test_cap_of_one_still_makes_progress(self):
        end = cap_end_offsets({0: 0, 1: 0}, {0: 5, 1: 5}, 1)
        assert sum(end.values()) == 1

    def test_new_partition_counts_from_zero(self):
        assert cap_end_offsets({0: 10}, {0: 10, 1: 4}, None) == {0: 10, 1: 4}


class TestReconcile:
    def test_nothing_changed(self):
        assert reconcile({0: 4, 1: 5}, {0: 9, 1: 5}, True) == ({0: 4, 1: 5}, set(), [])

    def test_new_partitions_start_at_their_earliest_record(self):
        planned, from_earliest, problems = reconcile({0: 4}, {0: 9, 1: 3, 2: 0}, True)
        assert planned == {0: 4, 1: 0, 2: 0}
        assert from_earliest == {1, 2}
        assert problems == []

    def test_vanished_partition_is_data_loss(self):
        with pytest.raises(DataLossError, match="partition t-1 no longer exists.*FAIL_ON_DATA_LOSS=false"):
            reconcile({0: 4, 1: 8}, {0: 9}, True, topic="t")

    def test_vanished_partition_is_dropped_when_skipping(self):
        planned, _, problems = reconcile({0: 4, 1: 8}, {0: 9}, False, topic="t")
        assert planned == {0: 4}
        assert len(problems) == 1

    def test_offsets_going_backwards_is_data_loss(self):
        with pytest.raises(DataLossError, match="re-created"):
            reconcile({0: 40}, {0: 10}, True, topic="t")

    def test_offsets_going_backwards_restarts_from_earliest_when_skipping(self):
        planned, from_earliest, problems = reconcile({0: 40}, {0: 10}, False)
        assert planned == {0: 0} and from_earliest == {0} and problems


class TestRanges:
    def test_one_range_per_partition_with_data(self):
        assert plan_ranges("t", {0: 0, 1: 5, 2: 7}, {0: 3, 1: 5, 2: 9}) == [
            PartitionRange("t", 0, 0, 3),
            PartitionRange("t", 2, 7, 9),
        ]

    def test_new_partition_is_read_from_earliest(self):
        assert plan_ranges("t", {0: 3}, {0: 3, 1: 4}) == [PartitionRange("t", 1, 0, 4, from_earliest=True)]

    def test_end_before_start_reads_the_recreated_partition_from_earliest(self):
        assert plan_ranges("t", {0: 50}, {0: 6}) == [PartitionRange("t", 0, 0, 6, from_earliest=True)]

    def test_empty_batch_has_no_ranges(self):
        assert plan_ranges("t", {0: 3, 1: 4}, {0: 3, 1: 4}) == []

    def test_sizes_add_up_to_the_capped_batch(self):
        start = {0: 0, 1: 100, 2: 7}
        end = cap_end_offsets(start, {0: 500, 1: 900, 2: 8}, 321)
        assert sum(r.size for r in plan_ranges("t", start, end)) == 321


class TestPacking:
    def ranges(self, *sizes):
        return [PartitionRange("t", p, 0, size) for p, size in enumerate(sizes)]

    def test_never_more_groups_than_tasks(self):
        groups = pack_ranges(self.ranges(5, 5, 5, 5, 5, 5, 5, 5), 2)
        assert len(groups) == 2
        assert [sum(r.size for r in g) for g in groups] == [20, 20]

    def test_fewer_ranges_than_tasks_gives_one_range_per_task(self):
        assert pack_ranges(self.ranges(3), 4) == [[PartitionRange("t", 0, 0, 3)]]

    def test_every_range_is_planned_exactly_once(self):
        ranges = self.ranges(100, 1, 50, 49, 7, 3, 0, 8)
        groups = pack_ranges(ranges, 3)
        assert sorted((r for g in groups for r in g), key=lambda r: r.partition) == ranges

    def test_uneven_sizes_are_balanced_greedily(self):
        sizes = [sum(r.size for r in g) for g in pack_ranges(self.ranges(100, 60, 40, 30, 30), 2)]
        assert sorted(sizes) == [130, 130]

    def test_no_ranges_no_tasks(self):
        assert pack_ranges([], 2) == []

    def test_a_small_batch_goes_in_one_task(self):
        assert len(pack_ranges(self.ranges(600, 600, 600, 600), 2, min_records=5_000)) == 1

    def test_a_batch_under_backlog_uses_every_task(self):
        assert len(pack_ranges(self.ranges(3_000, 3_000, 3_000, 3_000), 2, min_records=5_000)) == 2
        assert len(pack_ranges(self.ranges(*[30_000] * 8), 4, min_records=5_000)) == 4


class TestSparkOffsets:
    def test_round_trip(self):
        offsets = {0: 5, 10: 7, 2: 1}
        assert from_spark("t", to_spark("t", offsets)) == offsets
        assert to_spark("t", offsets) == {"t": {"0": 5, "2": 1, "10": 7}}

    def test_no_offsets(self):
        assert from_spark("t", None) == {}

    def test_checkpoint_of_another_topic_is_refused(self):
        with pytest.raises(DataLossError, match="new checkpoint directory"):
            from_spark("t", {"other": {"0": 1}})
