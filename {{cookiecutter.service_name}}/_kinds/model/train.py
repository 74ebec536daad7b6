"""Trains the {{ cookiecutter.service_name }} model and writes it beside the detector (`make train`).

The history here is made up: customers ordering now and then, some of whom go on a spree of large
orders in quick succession (the labelled ones). Replace `history()` with your own labelled records.
The features are computed by the window rule the service runs, so the model is trained on exactly
what it will be scored on.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from detectorkit import models, windows
from detectorkit.testing import DetectorHarness, event_times
from sklearn.ensemble import GradientBoostingClassifier
from sklearn.metrics import roc_auc_score

from {{ cookiecutter.package_name }}.detector import AGGREGATES, FIELDS, WINDOW

OUT = Path(__file__).parent / "src" / "{{ cookiecutter.package_name }}" / "model.onnx"
NAME, VERSION = "orders-last-hour", "1"
START = pd.Timestamp("2026-11-01T00:00:00Z")


def history(customers: int = 300, hours: int = 12, seed: int = 7) -> pd.DataFrame:
    """Records as the service reads them (customer, amount, time) with a label: 1 for a spree's."""
    rng = random.Random(seed)
    rows = []
    for c in range(customers):
        t = rng.uniform(0, 3600)
        while t < hours * 3600:
            rows.append((f"c-{c}", t, round(rng.lognormvariate(3.5, 0.8), 2), 0))
            t += rng.expovariate(1 / 1800)
        if c % 10 == 0:  # a spree: 3 to 8 large orders within minutes
            t = rng.uniform(0, hours * 3600)
            for _ in range(rng.randint(3, 8)):
                rows.append((f"c-{c}", t, round(rng.uniform(300, 2000), 2), 1))
                t += rng.uniform(20, 240)
    rows.sort(key=lambda r: r[1])
    return pd.DataFrame(
        {
            "key": [r[0] for r in rows],
            "event_time": event_times([START + pd.Timedelta(seconds=r[1]) for r in rows]),
            "amount": [r[2] for r in rows],
            "label": [r[3] for r in rows],
        }
    )


def features(records: pd.DataFrame) -> pd.DataFrame:
    """Each record's features as the service computes them: its fields, its customer's aggregates
    as of the record (a late record has none, and is not scored)."""
    every = windows.detector("features", window=WINDOW, aggregate=AGGREGATES, emit=windows.Every())
    found = DetectorHarness(every).batch(records)
    return records.loc[found.index, list(FIELDS)].join(found[list(AGGREGATES)])


def train(out: Path = OUT) -> float:
    """Trains on the first three quarters of the history, writes the model, returns the ROC AUC
    on the last quarter."""
    records = history()
    X = features(records)
    y = records.loc[X.index, "label"].to_numpy()
    cut = int(len(X) * 0.75)
    model = GradientBoostingClassifier(n_estimators=50, max_depth=3, random_state=0)
    model.fit(X.iloc[:cut].to_numpy(np.float32), y[:cut])
    auc = roc_auc_score(y[cut:], model.predict_proba(X.iloc[cut:].to_numpy(np.float32))[:, 1])
    models.export(model, out, name=NAME, version=VERSION)
    return auc


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    print(f"{NAME} {VERSION}: ROC AUC {train(out):.3f} on the held-out quarter; written to {out}")
