"""First-seen merchant: a payment above DETECTOR_MIN_AMOUNT to a merchant the customer has not paid
in 90 days (a customer's very first record is not one). Hand-written state, a few lines: the
merchants each customer paid, kept 90 days after the customer's last record."""

from dataclasses import dataclass

import pandas as pd

from detectorkit import Detector, State


@dataclass(frozen=True)
class Config:
    min_amount: float = 500.0


def detect(records, state, config):
    known = set(state["merchants"].explode().dropna().items())  # (customer, merchant) pairs
    first = ~records.duplicated(["key", "merchant"]) & ~pd.MultiIndex.from_frame(records[["key", "merchant"]]).isin(list(known))
    hits = records[first & (records["key"].isin(state.index) | records.duplicated("key")) & (records["amount"] > config.min_amount)]
    merchants = pd.concat([state["merchants"].explode(), records.set_index("key")["merchant"]]).dropna().groupby(level=0).unique().map(sorted)
    return hits[["merchant", "amount"]], merchants.to_frame("merchants")


STATE = State(columns=("merchants",), ttl_seconds=90 * 86400)
DETECTOR = Detector(name="first-seen-merchant", detect=detect, config=Config, state=STATE, key_field="customer", event_time_field="ts")
