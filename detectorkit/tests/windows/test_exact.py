"""Exact sums as limbs (`windows.exact`): every sum is the correctly rounded sum of its values, as
math.fsum gives it, ties and cancellations included."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectorkit.windows.exact import Exact

pytestmark = pytest.mark.unit

VALUES = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, min_value=-1e200, max_value=1e200),
    st.sampled_from([0.0, -0.0, 0.1, 0.2, 0.3, -0.3, 19.99, 1e15, -1e15, 2.0**53, -(2.0**53), 1.0, 0.5, 2.0**-40, 3.0 * 2**-60, 1e-3]),
    st.integers(-(10**6), 10**6).map(lambda cents: cents / 100),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(VALUES, min_size=1, max_size=40), st.data())
def test_each_window_sum_is_the_correctly_rounded_sum_of_its_values(values, data):
    v = np.array(values, dtype=np.float64)
    exact = Exact.of(v)
    if exact is None:
        return  # the engine's: values too far apart or too large
    lo = np.array([data.draw(st.integers(0, i)) for i in range(len(v))])
    expected = [math.fsum(v[a : i + 1]) for i, a in enumerate(lo)]
    assert exact.window_sums(lo, np.arange(len(v))).tolist() == expected
    some = np.arange(len(v))[::2]
    assert exact.window_sums(lo, some)[some].tolist() == expected[::2]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), VALUES), min_size=1, max_size=40))
def test_running_sums_within_each_key_and_window_in_arrival_order(rows):
    code, starts, v = (np.array(c) for c in zip(*rows, strict=True))
    exact = Exact.of(v.astype(np.float64))
    if exact is None:
        return
    seen: dict[tuple[int, int], list[float]] = {}
    expected = []
    for c, s, x in rows:
        seen.setdefault((c, s), []).append(x)
        expected.append(math.fsum(seen[(c, s)]))
    assert exact.running_sums(code, starts, np.arange(len(v))).tolist() == expected
    some = np.arange(len(v))[1::2]
    assert exact.running_sums(code, starts, some)[some].tolist() == expected[1::2]


def test_ties_round_to_even_and_what_lies_below_a_tie_breaks_it():
    """2^53 + 1 lies halfway between two floats: alone it rounds to even (down); a tiny value
    below it, far under the float's last bit, moves it up. A float running sum gets both wrong."""
    v = np.array([2.0**53, 1.0, 2.0**-60, -(2.0**-60), 2.0**-60])
    sums = Exact.of(v).window_sums(np.zeros(len(v), dtype=np.int64), np.arange(len(v))).tolist()
    assert sums == [math.fsum(v[: i + 1]) for i in range(len(v))] == [2.0**53, 2.0**53, 2.0**53 + 2, 2.0**53, 2.0**53 + 2]


def test_a_column_whose_sums_could_pass_the_largest_float_goes_to_the_engine():
    assert Exact.of(np.array([1e308, 1e308])) is None
    assert Exact.of(np.array([1e300, 1e-300])) is None  # too far apart for small integers
    assert Exact.of(np.array([0.0, -0.0])).window_sums(np.array([0, 0]), np.arange(2)).tolist() == [0.0, 0.0]
