"""Where a job starts reading, without Spark or a broker."""

import pytest

from detectorkit.kafka.planning import (
    NoCommittedOffsetsError,
    resolve_start,
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
