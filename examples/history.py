"""A day of normalised customer records, and the cases a cookbook test plants in it: what each
example is backtested over, with the planted cases as labels.

Every record has the fields the normaliser writes: id, customer, card, merchant, country,
currency, amount, type (payment, login, transfer, password_reset) and ts (ISO 8601). The background
is drawn so that it holds no case of the example that uses it (each test says how: amounts below
a threshold, one country per customer, ...): what the detector flags in it is a false positive.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from detectorkit import backtest
from detectorkit.backtest import Score
from detectorkit.testing import DetectorHarness

START = pd.Timestamp("2026-11-02T00:00:00Z")


def day(
    records: int = 20_000, customers: int = 400, seed: int = 7, max_amount: float = 900.0, sigma: float = 1.0, types=None, countries=("FR",)
) -> pd.DataFrame:
    """Background records over 24 hours in time order: payments (lognormal amounts, median 33, of at
    most `max_amount`), or the `types` given with their weights; each customer with two cards and a
    home country drawn from `countries`, which all their records carry."""
    rng = np.random.default_rng(seed)
    customer = rng.integers(0, customers, records)
    types = types or {"payment": 1.0}
    kinds = rng.choice(list(types), records, p=np.array(list(types.values())) / sum(types.values()))
    offsets = np.sort(rng.integers(0, 24 * 3600 * 1000, records))
    home = np.array(countries)[np.arange(customers) % len(countries)]
    return pd.DataFrame(
        {
            "id": [f"r-{n}" for n in range(records)],
            "customer": [f"c-{c}" for c in customer],
            "card": [f"c-{c}-{k}" for c, k in zip(customer, rng.integers(0, 2, records), strict=True)],
            "merchant": [f"m-{m}" for m in rng.integers(0, 100, records)],
            "country": home[customer],
            "currency": "EUR",
            "amount": np.round(np.minimum(rng.lognormal(3.5, sigma, records), max_amount), 2),
            "type": kinds,
            "ts": _iso(pd.DatetimeIndex(START + pd.to_timedelta(offsets, unit="ms"))),
        }
    )


def case(customer: str, at: str, **fields) -> dict:
    """A planted record of `customer` at `at` after the day's start ("13:05:30"), its card the
    customer's first unless given, its other fields a payment's unless given."""
    record = {"customer": customer, "card": f"{customer}-0", "merchant": "m-0", "country": "FR", "currency": "EUR", "amount": 10.0, "type": "payment"}
    record.update(fields)
    record["ts"] = _iso(START + pd.Timedelta(at))
    return record


def planted(background: pd.DataFrame, cases: Iterable[dict]) -> pd.DataFrame:
    """The background with the cases in it, in time order (a case keeps its place among records of
    the same time); each case's id is p-<n>."""
    rows = pd.DataFrame(list(cases))
    rows["id"] = [f"p-{n}" for n in range(len(rows))]
    both = pd.concat([background, rows[background.columns]], ignore_index=True)
    return both.iloc[np.argsort(both["ts"].to_numpy(), kind="stable")].reset_index(drop=True)


def score(detector, history: pd.DataFrame, labels: tuple[str, set[str]], key_field: str, partitions: int = 4) -> Score:
    """The detector backtested over `history` (keyed by `key_field`, over `partitions`), scored
    against `labels` ("id" or "key", the values expected flagged)."""
    result = backtest.run(detector, backtest.from_frame(history, key_field=key_field, time_field="ts", partitions=partitions))
    assert not result.dead_letters, result.dead_letters
    return backtest.summarise(result, labels=labels).score


def records(rows: list[dict]) -> pd.DataFrame:
    """Planted rows as one batch of records, indexed from 0."""
    frame = pd.DataFrame(rows)
    frame["id"] = [f"p-{n}" for n in range(len(frame))]
    return frame


def answers(detector, batches: list[pd.DataFrame], config=None, partitions: int = 1, restart: bool = False, until: str | None = None) -> list:
    """What the detector answers over `batches` through the harness, restarting after each with
    `restart`, then with event time moved to `until` (timers fire): sorted rows of what it
    detected, by record and by key, without the index (which depends on the batches)."""
    run = DetectorHarness(detector, config, partitions=partitions)
    out = []
    for frame in batches:
        out += _rows(run.batch(frame))
        out += _rows(run.take_fired())
        if restart:
            run.restart()
    if until is not None:
        run.advance(START + pd.Timedelta(until))
        out += _rows(run.take_fired())
    return sorted(out, key=repr)


def one_by_one(frame: pd.DataFrame) -> list[pd.DataFrame]:
    return [frame.iloc[[i]] for i in range(len(frame))]


def _rows(found: pd.DataFrame) -> list[dict]:
    return [{k: v for k, v in row.items()} for row in found.reset_index(drop=True).to_dict(orient="records")]


def _iso(times: pd.Timestamp | pd.DatetimeIndex) -> str | list[str]:
    if isinstance(times, pd.Timestamp):
        return times.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    return [_iso(t) for t in times]
