"""Sample customer records for demos and tests, with a known mix of good and bad ones."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass

# What each sample is meant to exercise; "valid" records reach the detector.
VALID = "valid"
KINDS = ("valid", "malformed_json", "not_an_object", "missing_field", "detector_error")


@dataclass(frozen=True)
class Sample:
    key: bytes
    value: bytes
    kind: str
    amount: float | None = None


def samples(count: int, seed: int = 7, bad_every: int = 50, high_share: float = 0.05) -> Iterator[Sample]:
    """`count` records; every `bad_every`-th is bad, cycling through the bad kinds. A valid record's
    amount is above 1000 with probability `high_share` (the example detector's default threshold)."""
    rng = random.Random(seed)
    bad_kinds = KINDS[1:]
    for i in range(count):
        key = f"customer-{rng.randrange(10_000):05d}".encode()
        if bad_every and i % bad_every == bad_every - 1:
            kind = bad_kinds[(i // bad_every) % len(bad_kinds)]
        else:
            kind = VALID
        amount = round(rng.uniform(1000.01, 5000), 2) if rng.random() < high_share else round(rng.uniform(0, 1000), 2)
        record = {"id": f"r-{i}", "customer": key.decode(), "amount": amount, "currency": "EUR"}
        if kind == "malformed_json":
            value = json.dumps(record)[:-7].encode()
        elif kind == "not_an_object":
            value = json.dumps([record["id"], amount]).encode()
        elif kind == "missing_field":
            del record["amount"]
            value = json.dumps(record).encode()
        elif kind == "detector_error":
            # A string where the detector compares numbers: it raises on the batch.
            record["amount"] = "n/a"
            value = json.dumps(record).encode()
        else:
            value = json.dumps(record).encode()
        yield Sample(key, value, kind, amount if kind == VALID else None)
