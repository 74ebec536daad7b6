"""A model detector the job tests run on a broker: its model, the records it reads, and what one
pass over them detects, computed here without the runtime's windows."""

import collections
import json
import pathlib
import random

import numpy as np
from sklearn.ensemble import GradientBoostingClassifier

from detectorkit import models
from detectorkit.samples import Sample

T0 = 1_700_000_000_000
UNSCORABLE_EVERY = 50


def spending_model(path: pathlib.Path, amount: float = 800, version: str = "7") -> str:
    """A classifier of (amount, orders in the last hour, spent in the last hour), as
    detectors.MODEL declares its features, flagging an order above `amount` from a customer who
    spent over 5,000 in the hour; returns the file's path."""
    rng = np.random.default_rng(3)
    orders = rng.integers(1, 40, 4000)
    X = np.column_stack([rng.uniform(0, 1000, 4000), orders, orders * rng.uniform(100, 900, 4000)]).astype(np.float32)
    y = ((X[:, 0] > amount) & (X[:, 2] > 5000)).astype(int)
    model = GradientBoostingClassifier(n_estimators=20, max_depth=3, random_state=3).fit(X, y)
    models.export(model, path, version=version)
    return str(path)


def spending(count: int, keys: int = 40, seed: int = 0):
    """Orders of a few customers 100 ms apart, so each has dozens within the hour; every
    UNSCORABLE_EVERY-th has an amount the model cannot score."""
    rng = random.Random(seed)
    for i in range(count):
        key = f"customer-{rng.randrange(keys):03d}"
        amount = "n/a" if i % UNSCORABLE_EVERY == UNSCORABLE_EVERY - 1 else round(rng.uniform(0, 1000), 2)
        value = json.dumps({"id": f"r-{i}", "customer": key, "amount": amount}).encode()
        scorable = not isinstance(amount, str)
        yield Sample(key.encode(), value, "valid" if scorable else "detector_error", amount if scorable else None, T0 + 100 * i)


def one_pass(sent, uri: str, threshold: float = 0.5) -> tuple[set, set]:
    """(partition, offset) of the detections and of the dead letters one pass over `sent` makes:
    each scorable record's features its key's count and sum so far (all within the hour), an
    unscorable record a dead letter that counts for nothing."""
    orders, spent = collections.Counter(), collections.Counter()
    rows, where, dead = [], [], set()
    for s in sorted(sent, key=lambda s: (s.partition, s.offset)):
        if s.sample.amount is None:
            dead.add((s.partition, s.offset))
            continue
        orders[s.sample.key] += 1
        spent[s.sample.key] += s.sample.amount
        rows.append((s.sample.amount, orders[s.sample.key], spent[s.sample.key]))
        where.append((s.partition, s.offset))
    scores = models.Model.load(uri).score(np.array(rows, dtype=np.float32))
    return {w for w, score in zip(where, scores, strict=True) if score >= threshold}, dead
