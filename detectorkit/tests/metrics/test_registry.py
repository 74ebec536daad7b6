"""Bucket counts, as the executors and a model's scores make them for the histograms."""

from bisect import bisect_left

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from detectorkit.metrics.registry import LATENCY_BUCKETS, SCORE_BUCKETS, bucket_counts

pytestmark = pytest.mark.unit


def _one_at_a_time(values, bounds):
    counts = [0] * (len(bounds) + 1)
    for v in values:
        counts[bisect_left(bounds, v)] += 1
    return counts


@given(st.lists(st.one_of(st.floats(allow_nan=True), st.sampled_from([*SCORE_BUCKETS, *LATENCY_BUCKETS, 0.0, -1.0]))))
def test_bucket_counts_are_one_values_at_a_time_bounds_nan_and_infinities_included(values):
    for bounds in (SCORE_BUCKETS, LATENCY_BUCKETS):
        expected = _one_at_a_time(values, bounds)
        assert bucket_counts(values, bounds) == expected
        assert bucket_counts(np.array(values, dtype=np.float64), bounds) == expected
        assert bucket_counts(iter(values), bounds) == expected


def test_a_value_on_a_bound_counts_in_that_bounds_bucket_and_none_counts_nothing():
    assert bucket_counts([0.1, 0.10000001, 1.0, 2.0], SCORE_BUCKETS) == [1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1]
    assert bucket_counts([], SCORE_BUCKETS) == [0] * 11
