"""The {{ cookiecutter.service_name }} detector: the one file to edit.

`detect` gets a batch of parsed records (one JSON object per row, its fields as columns) and returns
one row per detection, keeping the index of the record it came from. Records that are not JSON
objects, or that lack a field in REQUIRED_FIELDS, never reach it: they go to the dead-letter topic,
and so does any record on which `detect` raises. Everything else (Kafka, Spark, offsets, metrics, and
the state and timers it keeps between batches)
comes from detectorkit.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from detectorkit import Detector, State

# What the detector remembers of each customer between batches: the time of their newest record.
# No TTL: every customer with state has a pending timer, which keeps the state until it fires, and
# the firing drops it. The state thus holds the customers who sent a record within the last silence.
# Typed: kept as an array, not as JSON per customer.
STATE = State(columns={"last_ms": "int64"})

# A silence longer than this is out of reach anyway: pandas' timestamps end in 2262.
MAX_SILENCE_SECONDS = 366 * 24 * 3600


@dataclass(frozen=True)
class Config:
    """Settings of the detector, each read from DETECTOR_<NAME>, e.g. DETECTOR_SILENCE_SECONDS=3600."""

    silence_seconds: float = 3 * 3600.0

    def __post_init__(self):
        if not 0.001 <= self.silence_seconds <= MAX_SILENCE_SECONDS:  # also refuses NaN
            raise ValueError(f"DETECTOR_SILENCE_SECONDS must be at least 0.001 (1 ms), at most {MAX_SILENCE_SECONDS}")


# None: the customer is the Kafka key and the time the Kafka timestamp, both set by the normaliser.
REQUIRED_FIELDS = ()


def detect(records: pd.DataFrame, state: pd.DataFrame, config: Config) -> tuple[pd.DataFrame, pd.DataFrame, pd.Series]:
    """Remember each customer's newest record time and set their timer to it + `silence_seconds`:
    every record moves its customer's timer on. Flags nothing itself; `on_timer` does, for the
    customers whose timer the partition's event time reaches before a newer record of theirs.

    Stateful: `records` has the customer as `key` and the record's time as `event_time`, and `state`
    what the previous batches left for these customers (`last_ms`, indexed by customer). Returns no
    detections, the customers' new state, and one timer per record (the customer's after it)."""
    customers = records["key"]
    own_ms = records["event_time"].astype("int64") // 1_000_000
    before_ms = customers.map(state["last_ms"]).astype("float64")  # NaN: a customer without state
    # The newest time so far, record by record: a record stamped earlier than one before it (a late
    # one) does not move the customer's last time back.
    newest_ms = before_ms.where(before_ms > own_ms, own_ms).groupby(customers, sort=False).cummax().astype("int64")
    timers = pd.to_datetime(newest_ms + round(config.silence_seconds * 1000), unit="ms", utc=True)
    new_state = newest_ms.groupby(customers, sort=False).last().to_frame("last_ms")
    return pd.DataFrame(index=records.index[:0]), new_state, timers


def on_timer(fired: pd.DataFrame, config: Config) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The customers whose timer fired, indexed by customer, with their state and the timer's time
    (`deadline`): one detection each. Their state goes with the detection, so a customer is flagged
    once per silence, and again only if they come back and go quiet once more."""
    last_seen = pd.to_datetime(fired["last_ms"].astype("int64"), unit="ms", utc=True)
    detections = pd.DataFrame(
        {
            "rule": "silence",
            "customer": fired.index.to_numpy(),
            "last_seen": [t.isoformat(timespec="milliseconds") for t in last_seen],
            "silent_for_seconds": (fired["deadline"] - last_seen).dt.total_seconds(),
        },
        index=fired.index,
    )
    return detections, STATE.empty()


DETECTOR = Detector(
    name="{{ cookiecutter.service_name }}",
    detect=detect,
    config=Config,
    required_fields=REQUIRED_FIELDS,
    state=STATE,
    on_timer=on_timer,
)
