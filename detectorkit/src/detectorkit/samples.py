"""Sample customer records for demos and tests, with a known mix of good and bad ones."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

# What each sample is meant to exercise; "valid" records reach the detector.
VALID = "valid"
KINDS = ("valid", "malformed_json", "not_an_object", "missing_field", "detector_error")


@dataclass(frozen=True)
class Sample:
    key: bytes
    value: bytes
    kind: str
    amount: float | None = None
    # The record's Kafka timestamp (ms); None: the time it is produced.
    timestamp_ms: int | None = None


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


# ---- raw records, as source systems send them to the upstream normaliser ----------------------

RAW_BAD_KINDS = ("malformed_json", "not_an_object", "missing_field", "bad_amount", "bad_timestamp", "bad_currency")
_SYMBOL = {"EUR": "€", "USD": "$", "GBP": "£"}
_SPELLINGS = {
    "id": ("id", "record_id", "recordId"),
    "customer": ("customer", "customer_id", "customerId", "client"),
    "amount": ("amount", "amt", "total"),
    "currency": ("currency", "ccy"),
    "timestamp": ("timestamp", "ts", "created_at"),
}
# Whole seconds, so every timestamp format can carry the same moment.
_START_S = 1_795_000_000


BURST_RECORDS = 6  # a burst: this many records of one customer in as many seconds at most


@dataclass(frozen=True)
class RawSample:
    key: bytes
    value: bytes
    kind: str  # "valid" or one of RAW_BAD_KINDS
    # What the normaliser must make of it (valid records only): the one schema detectors read.
    normalised: dict | None = None
    anomaly: bool = False  # an amount above 1000, the example detector's default threshold
    burst: bool = False  # one of BURST_RECORDS records of one customer within seconds


def raw_samples(
    count: int,
    seed: int = 7,
    anomaly_share: float = 0.02,
    malformed_share: float = 0.02,
    customers: int = 1_000,
    burst_share: float = 0.0,
    start_s: int = _START_S,
    per_second: float = 1.0,
) -> Iterator[RawSample]:
    """`count` raw records in the spellings of several source systems (field names, amounts with
    symbols, thousands separators and decimal commas, four timestamp formats); a `malformed_share`
    cannot be normalised (each bad kind in turn), an `anomaly_share` of the rest has an amount
    above 1000, and a `burst_share` of them starts a burst. Record i happened at `start_s` +
    i / `per_second` (whole seconds, which every format carries). The same arguments give the
    same records."""
    rng = random.Random(seed)
    bad = 0
    burst_left, burst_customer = 0, ""
    for i in range(count):
        if not burst_left and burst_share and rng.random() < burst_share and count - i >= BURST_RECORDS:
            burst_left, burst_customer = BURST_RECORDS, f"customer-{rng.randrange(customers):05d}"
        in_burst = burst_left > 0
        if in_burst:
            customer, burst_left = burst_customer, burst_left - 1
        else:
            customer = f"customer-{rng.randrange(customers):05d}"
        anomaly = not in_burst and rng.random() < anomaly_share
        amount = round(rng.uniform(1000.01, 5000), 2) if anomaly else round(rng.uniform(0.01, 1000), 2)
        currency = rng.choice(("EUR", "EUR", "USD", "GBP"))
        seconds = start_s + int(i / per_second)
        truth = {
            "id": f"raw-{seed}-{i}",
            "customer": customer,
            "amount": amount,
            "currency": currency,
            "timestamp": datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        }
        raw = {rng.choice(_SPELLINGS["id"]): truth["id"], rng.choice(_SPELLINGS["customer"]): customer}
        amount_text, says_currency = _render_amount(rng, amount, currency)
        raw[rng.choice(_SPELLINGS["amount"])] = amount_text
        if not says_currency or rng.random() < 0.5:
            raw[rng.choice(_SPELLINGS["currency"])] = currency if rng.random() < 0.7 else currency.lower()
        raw[rng.choice(_SPELLINGS["timestamp"])] = _render_time(rng, seconds)
        kind = "valid"
        if not in_burst and rng.random() < malformed_share:  # a burst stays whole
            kind = RAW_BAD_KINDS[bad % len(RAW_BAD_KINDS)]
            bad += 1
        value = _spoil(raw, kind)
        yield RawSample(customer.encode(), value, kind, truth if kind == "valid" else None, anomaly and kind == "valid", in_burst)


def _render_amount(rng: random.Random, amount: float, currency: str) -> tuple[object, bool]:
    """The amount as one source system or another writes it, and whether that names the currency."""
    style = rng.randrange(5)
    if style == 0:
        return amount, False
    if style == 1:
        return f"{amount:.2f}", False
    if style == 2:  # decimal comma, dot for thousands
        return f"{amount:,.2f}".replace(",", "X").replace(".", ",").replace("X", "."), False
    if style == 3:
        return f"{_SYMBOL[currency]}{amount:,.2f}", True
    return f"{amount:,.2f} {currency}", True


def _render_time(rng: random.Random, seconds: int) -> object:
    moment = datetime.fromtimestamp(seconds, UTC)
    style = rng.randrange(4)
    if style == 0:
        return moment.isoformat().replace("+00:00", "Z")
    if style == 1:
        return seconds
    if style == 2:
        return seconds * 1000
    return moment.strftime("%d/%m/%Y %H:%M:%S")


def _spoil(raw: dict, kind: str) -> bytes:
    if kind == "malformed_json":
        return json.dumps(raw)[:-5].encode()
    if kind == "not_an_object":
        return json.dumps(list(raw.values())).encode()
    raw = dict(raw)
    amount_field = next(k for k in raw if k in _SPELLINGS["amount"])
    if kind == "missing_field":
        del raw[amount_field]
    elif kind == "bad_amount":
        raw[amount_field] = "n/a"
    elif kind == "bad_timestamp":
        raw[next(k for k in raw if k in _SPELLINGS["timestamp"])] = "soon"
    elif kind == "bad_currency":
        for name in _SPELLINGS["currency"]:
            raw.pop(name, None)
        raw["currency"] = "euros"
    return json.dumps(raw).encode()
