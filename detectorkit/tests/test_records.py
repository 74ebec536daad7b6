"""A detector's detections as the runtime takes them from its DataFrame."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from detectorkit.records import detection_json, detections_of, utc_times

N = 6
NUMPY_TYPED = {
    "score": np.arange(N) / 3,
    "count": np.arange(N),
    "flag": np.arange(N) % 2 == 0,
    "single": np.arange(N, dtype=np.float32) / 7,
    "missing": [np.nan] * N,
    "anything": pd.Series([np.int64(3), np.float32(1.5), "x", None, np.bool_(True), np.datetime64("2026-01-01T00:00")], dtype=object),
    "text": list("abcde") + [np.str_("f")],  # NumPy's own text too, which to_dict leaves as it is
    "naive": pd.to_datetime(np.arange(N) * 1000, unit="ms"),
    "took": pd.to_timedelta(np.arange(N), unit="s"),
}
EXTENSION_TYPED = {
    "at": pd.to_datetime(np.arange(N) * 1000, unit="ms", utc=True),
    "nullable": pd.array([1, None, 3, 4, 5, 6], dtype="Int64"),
    "arrow": pd.array([1.5, None, 3, 4, 5, 6], dtype="float64[pyarrow]"),
    "strings": pd.array(["x", None, "y", "z", "w", "v"], dtype="string"),
    "kind": pd.Categorical(list("aabbcc")),
}


@pytest.mark.parametrize("columns", [NUMPY_TYPED, NUMPY_TYPED | EXTENSION_TYPED], ids=["numpy", "with extension types"])
def test_detections_hold_the_values_and_types_to_dict_gives_and_write_the_same_json(columns):
    out = pd.DataFrame(columns).set_axis([5, 7, 9, 11, 13, 15])
    found = detections_of(out, pd.Index(range(20)))
    expected = out.to_dict(orient="records")
    assert [p for p, _ in found] == out.index.tolist()
    for (_, fields), want in zip(found, expected, strict=True):
        assert list(fields) == list(want)
        assert {k: type(v) for k, v in fields.items()} == {k: type(v) for k, v in want.items()}
        assert detection_json(fields) == detection_json(want)


def test_a_detections_keys_of_any_type_are_written_as_strings_and_text_keys_as_before():
    """A DataFrame's column names may be numbers, and a field may hold a dict keyed by anything:
    both are written with their keys as text (orjson's option for that, which the first try leaves
    out, as it slows every dict)."""
    import orjson

    everything = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME
    [(_, numbered)] = detections_of(pd.DataFrame({0: [1.5], "score": [0.25]}, index=[3]), pd.Index([3]))
    nested = {"service": "s", "detection": {"by_hour": {13: 2, 14: np.int64(1)}, "at": pd.Timestamp("2026-01-01", tz="UTC")}}
    texts = {"service": "s", "detection": {"amount": np.float64(1.5), "n": np.int64(3), "missing": float("nan")}, "source": {"key": "k"}}
    assert detection_json(numbered) == b'{"0":1.5,"score":0.25}'
    assert detection_json(nested) == b'{"service":"s","detection":{"by_hour":{"13":2,"14":1},"at":"2026-01-01 00:00:00+00:00"}}'
    for value in (numbered, nested, texts):
        assert detection_json(value) == orjson.dumps(value, default=str, option=everything)


@given(st.lists(st.integers(min_value=-((2**63 - 1) // 1_000_000), max_value=(2**63 - 1) // 1_000_000), max_size=20))
def test_epoch_milliseconds_become_the_utc_times_pandas_conversion_gives(ms):
    times = utc_times(np.array(ms, dtype=np.int64))
    expected = pd.to_datetime(np.array(ms, dtype=np.int64), unit="ms", utc=True).astype("datetime64[ns, UTC]")
    pd.testing.assert_index_equal(times, expected)


@pytest.mark.parametrize("ms", [2**62, -(2**62)])
def test_epoch_milliseconds_beyond_nanoseconds_range_are_refused_as_pandas_refuses_them(ms):
    with pytest.raises(pd.errors.OutOfBoundsDatetime):
        utc_times(np.array([0, ms], dtype=np.int64))
