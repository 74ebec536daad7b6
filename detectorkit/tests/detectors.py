"""Detectors the runtime's tests run; importable by Spark's Python workers (conftest puts this
folder on PYTHONPATH before Spark starts)."""

import dataclasses
import os
import time
from dataclasses import dataclass

import pandas as pd

from detectorkit import Detector, State, models, windows


@dataclass(frozen=True)
class Config:
    threshold: float = 1000.0
    # Stretches each batch, so a test can act while a batch is half written.
    delay_seconds: float = 0.0


def above_threshold(records: pd.DataFrame, config: Config) -> pd.DataFrame:
    if config.delay_seconds:
        time.sleep(config.delay_seconds)
    hits = records[records["amount"] > config.threshold]
    return pd.DataFrame({"amount": hits["amount"]}, index=hits.index)


THRESHOLD = Detector(name="test-threshold", detect=above_threshold, config=Config, required_fields=("amount",))


class UnpickledMarker:
    """A config that writes the pid of every process that unpickles it to `path`."""

    def __init__(self, path: str):
        self.path = path

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")


@dataclass(frozen=True)
class CountConfig:
    every: int = 3
    # Stretches the calls that see this key (all when empty), so one task of a batch finishes well
    # before another and a test can act while the batch is half written.
    delay_seconds: float = 0.0
    slow_key: str = ""


def every_nth(records: pd.DataFrame, state: pd.DataFrame, config: CountConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Flag every `every`-th record of a key: any state lost, replayed twice or split between two
    owners shifts which records those are."""
    if config.delay_seconds and (not config.slow_key or (records["key"] == config.slow_key).any()):
        time.sleep(config.delay_seconds)
    counts = state["count"].to_dict()
    hits = []
    for index, key in records["key"].items():
        counts[key] = counts.get(key, 0) + 1
        if counts[key] % config.every == 0:
            hits.append((index, counts[key]))
    keys = records["key"].unique()
    detections = pd.DataFrame({"count": [n for _, n in hits]}, index=pd.Index([i for i, _ in hits], dtype=records.index.dtype))
    return detections, pd.DataFrame({"count": [counts[k] for k in keys]}, index=keys)


COUNT = Detector(name="test-count", detect=every_nth, config=CountConfig, state=State(columns=("count",)))
# The same changelog name with another shape: what a redeploy that changed the state meets.
RESHAPED = Detector(name="test-count", detect=every_nth, config=CountConfig, state=State(columns=("total",)))


def every_nth_reference(sent, every: int = CountConfig.every) -> set[tuple[int, int]]:
    """(partition, offset) of every `every`-th record of each key, in one pass over what was produced
    (counting what reaches the detector: every JSON object; it needs no field)."""
    counts: dict[bytes, int] = {}
    found = set()
    for s in sorted(sent, key=lambda s: (s.partition, s.offset)):
        if s.sample.kind in ("malformed_json", "not_an_object"):
            continue
        counts[s.sample.key] = counts.get(s.sample.key, 0) + 1
        if counts[s.sample.key] % every == 0:
            found.add((s.partition, s.offset))
    return found


@dataclass(frozen=True)
class SilenceConfig:
    silence_seconds: float = 10.0


SILENCE_STATE = State(columns=("last_ms",))


def quiet_keys(records: pd.DataFrame, state: pd.DataFrame, config: SilenceConfig):
    """Each record moves its key's timer to its time + the silence."""
    last = records.groupby("key")["event_time"].max()
    new_state = pd.DataFrame({"last_ms": last.astype("int64") // 1_000_000}, index=last.index)
    return pd.DataFrame(index=records.index[:0]), new_state, records["event_time"] + pd.Timedelta(seconds=config.silence_seconds)


def went_quiet(fired: pd.DataFrame, config: SilenceConfig):
    detections = pd.DataFrame({"last_ms": fired["last_ms"], "deadline_ms": fired["deadline"].astype("int64") // 1_000_000}, index=fired.index)
    return detections, SILENCE_STATE.deleted(fired.index)  # fired once: the key's state goes with it (left out, it would keep it)


SILENCE = Detector(name="test-silence", detect=quiet_keys, config=SilenceConfig, state=SILENCE_STATE, on_timer=went_quiet)
# The same with its column typed: the store keeps it as an array (state.columns).
SILENCE_TYPED = dataclasses.replace(SILENCE, state=State(columns={"last_ms": "int64"}))


# A window rule the backtest tests run live and over history: a customer's 3 records within 60 s.
BURST = windows.detector("test-burst", window=windows.Sliding(seconds=60), aggregate=windows.Count(), emit=windows.AtLeast(3))
# One detection per customer's session once it closes, from an event-time timer: a session's amount.
SESSIONS = windows.detector(
    "test-sessions",
    window=windows.Session(gap_seconds=30, grace_seconds=5),
    aggregate=windows.Sum("amount"),
    emit=windows.Final(),
    required_fields=("amount",),
)

# The same burst keyed and timed by the record's fields, as a backtest over files reads them.
FIELD_BURST = windows.detector(
    "test-field-burst",
    window=windows.Sliding(seconds=60),
    aggregate=windows.Count(),
    emit=windows.AtLeast(3),
    key_field="customer",
    event_time_field="ts",
)


def refusing(records: pd.DataFrame, config: Config) -> pd.DataFrame:
    if (records["amount"] < 0).any():
        raise ValueError("a negative amount")
    return records[["amount"]].iloc[:0]


# Raises on every record with a negative amount: they go to the dead letters, the others through.
REFUSING = Detector(name="test-refusing", detect=refusing, config=Config, required_fields=("amount",))

# Every `every`-th record of a customer, keyed by the record's `customer` field through a topic of
# the job's own (runtime.repartition): the input is keyed by something else.
COUNT_BY_CUSTOMER = Detector(
    name="test-count-by-customer", detect=every_nth, config=CountConfig, state=State(columns=("count",)), key_field="customer", repartition=True
)

# A model's score of the record's amount and its customer's orders and spending in the last hour
# (DETECTOR_MODEL_URI: models/spending.py trains one).
MODEL = models.detector(
    name="test-model",
    features=("amount",),
    window=windows.Sliding(3600),
    aggregates={"orders_1h": windows.Count(), "spent_1h": windows.Sum("amount")},
)
