"""Dormant account reactivated: a customer's record after DETECTOR_DORMANT_DAYS or more without one.
Hand-written state: each customer's newest record time, kept 400 days."""

from dataclasses import dataclass

import pandas as pd

from detectorkit import Detector, State


@dataclass(frozen=True)
class Config:
    dormant_days: float = 60.0


def detect(records, state, config):
    t = records["event_time"].astype("int64") // 1_000_000
    newest_before = t.groupby(records["key"]).cummax().groupby(records["key"]).shift(1).fillna(records["key"].map(state["last_ms"]))
    hits = records[t - newest_before >= config.dormant_days * 86_400_000]
    newest = pd.concat([state["last_ms"], t.groupby(records["key"]).max()]).groupby(level=0).max()
    return hits[["customer"]], newest.to_frame("last_ms")


STATE = State(columns={"last_ms": "int64"}, ttl_seconds=400 * 86400)
DETECTOR = Detector(name="dormant-reactivated", detect=detect, config=Config, state=STATE, key_field="customer", event_time_field="ts")
