"""A detector's detections as the runtime takes them from its DataFrame."""

import numpy as np
import pandas as pd
import pytest

from detectorkit.records import detection_json, detections_of

N = 6
NUMPY_TYPED = {
    "score": np.arange(N) / 3,
    "count": np.arange(N),
    "flag": np.arange(N) % 2 == 0,
    "single": np.arange(N, dtype=np.float32) / 7,
    "missing": [np.nan] * N,
    "anything": pd.Series([np.int64(3), np.float32(1.5), "x", None, np.bool_(True), np.datetime64("2026-01-01T00:00")], dtype=object),
    "text": list("abcdef"),
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
