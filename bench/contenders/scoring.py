"""The model detectors the model benchmark runs with `detectorkit run --detector scoring:NAME`: a
100-tree gradient-boosted classifier over 10 features, 3 of them the customer's window aggregates
(WINDOWED; WINDOWED_ONE_FIELD with aggregates of the amount alone), and the same kind of model over
the record's fields alone (FIELDS_ONLY, stateless), which tells the windows' cost from the model's.
bench/model.py trains them."""

import os

from detectorkit import models, windows

# bench/model.py --window-seconds sets it (an hour by default).
WINDOW = windows.Sliding(float(os.environ.get("BENCH_WINDOW_SECONDS", "3600")))

FIELDS = ("amount", "items", "hour", "account_age_days", "distance_km", "failed_logins", "device_risk")
AGGREGATES = {
    "orders_1h": windows.Count(),
    "spent_1h": windows.Sum("amount"),
    "merchants_1h": windows.DistinctCount("merchant"),
}

# The same with three aggregates of the amount alone (count, sum, mean): one value column held per
# record instead of two, and no distinct count.
ONE_FIELD_AGGREGATES = {"orders_1h": windows.Count(), "spent_1h": windows.Sum("amount"), "mean_1h": windows.Mean("amount")}

WINDOWED = models.detector(name="bench-windowed-model", features=FIELDS, window=WINDOW, aggregates=AGGREGATES)
WINDOWED_ONE_FIELD = models.detector(name="bench-windowed-one-field-model", features=FIELDS, window=WINDOW, aggregates=ONE_FIELD_AGGREGATES)
FIELDS_ONLY = models.detector(name="bench-fields-model", features=FIELDS)
