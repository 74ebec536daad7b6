"""What a data scientist writes: a function from a batch of records to a batch of detections.

    def detect(records: pd.DataFrame, config: Config) -> pd.DataFrame: ...
    DETECTOR = Detector(name="high-value-orders", detect=detect, config=Config, required_fields=("amount",))

`records` holds one parsed JSON record per row, with the fields as columns; a record lacking one of
`required_fields` (or holding null there) never reaches the function: it goes to the dead-letter
topic. The function returns one row per detection, indexed by the index of the record it came
from (filtering ``records`` keeps that index). `config` is an instance of the `config` dataclass,
its fields read from ``DETECTOR_<FIELD>`` environment variables.

A detector that remembers across batches declares its state (see `detectorkit.state.declaration`):

    def detect(records: pd.DataFrame, state: pd.DataFrame, config: Config) -> tuple[pd.DataFrame, pd.DataFrame]: ...
    DETECTOR = Detector(name="bursts", detect=detect, config=Config, state=State(columns=("recent_ms",), ttl_seconds=3600))
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from detectorkit.settings import config_from_env
from detectorkit.state.declaration import State

# What a data scientist writes, as types: a stateless detect, a stateful one (its third value: timers
# indexed like the records), and on_timer (its third value: timers indexed by key). See
# detectorkit.state.declaration for the whole contract.
Detect = Callable[[pd.DataFrame, Any], pd.DataFrame]
StatefulDetect = Callable[[pd.DataFrame, pd.DataFrame, Any], tuple[pd.DataFrame, pd.DataFrame] | tuple[pd.DataFrame, pd.DataFrame, pd.Series]]
OnTimer = Callable[[pd.DataFrame, Any], tuple[pd.DataFrame, pd.DataFrame] | tuple[pd.DataFrame, pd.DataFrame, pd.Series]]


@dataclasses.dataclass(frozen=True)
class NoConfig:
    """For a detector that needs no settings."""


@dataclasses.dataclass(frozen=True)
class Detector:
    name: str
    detect: Detect | StatefulDetect
    config: type = NoConfig
    required_fields: tuple[str, ...] = ()
    # Per-key state kept across batches; None: the detector sees each batch alone.
    state: State | None = None
    # Called with the keys whose timers fired (see detectorkit.state.declaration).
    on_timer: OnTimer | None = None
    # The field a record's event time comes from (epoch milliseconds or ISO 8601) instead of its
    # Kafka timestamp; a record where it cannot be read is a dead letter (bad_event_time).
    event_time_field: str | None = None
    # The field the state is keyed by, which must be the record's Kafka key (see `key_field` in the
    # README: a record whose field is another value is a dead letter, key_mismatch).
    key_field: str | None = None
    # detect gets each record's `partition_time` (the partition's event time there), fires what falls
    # due among a key's records itself and returns it as a fourth value (detections indexed by key,
    # each with its `deadline`); on_timer gets `partition_time` too. Its answers must depend on that
    # time only through which deadlines it has passed (a window closes once it has): then they are
    # one pass's, and a batch of records is one call. Window rules are such detectors.
    sees_partition_time: bool = False
    # With key_field: the job re-keys its input by that field through a topic of its own
    # (runtime.repartition) instead of dead-lettering a record whose Kafka key is another value.
    repartition: bool = False
    # For a rule: how many records it dropped as late since it was last asked (older than their
    # key's newest by more than the grace, or for windows already closed); the job counts them.
    take_late: Callable[[], int] | None = dataclasses.field(default=None, repr=False, compare=False)
    # A model detector's (detectorkit.models): the model's name and version, for detector_model_info;
    # and its scores since it was last asked, as bucket counts of metrics.registry.SCORE_BUCKETS
    # with their sum, which the job adds to detector_model_scores.
    model_info: tuple[str, str] | None = None
    take_scores: Callable[[], tuple[list[int], float]] | None = dataclasses.field(default=None, repr=False, compare=False)
    # A window rule's that runs on its store's columns itself (a sliding window emitted at every
    # record, compiled: windows.compiled), and a model's over such windows: (records, KeyColumns)
    # -> (detections, the keys' new columns, their newest times, records late), or None where
    # `detect` must run them. It answers as `detect` does.
    in_store: Callable[[Any, Any], Any] | None = dataclasses.field(default=None, repr=False, compare=False)
    # What a Python worker loads before its first batch rather than in it: a model's session, a
    # compiled window's code (numba's, from its cache or compiled). The job's start runs it.
    warm: Callable[[], None] | None = dataclasses.field(default=None, repr=False, compare=False)
    # Builds the detector for the config the job reads at start (a window sized by a setting); None:
    # this detector serves every config.
    configure: Callable[[Any], Detector] | None = dataclasses.field(default=None, repr=False, compare=False)
    # A model detector's: `configure`, but emitting every record it scores whatever the config's
    # threshold (a backtest with labels ranks every score).
    score_every: Callable[[Any], Detector] | None = dataclasses.field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("event_time_field", "key_field"):
            field = getattr(self, name)
            if field is None:
                continue
            if self.state is None:
                raise TypeError(f"Detector({name}=...) is about a detector's state: it needs state=State(...)")
            if field not in self.required_fields:
                object.__setattr__(self, "required_fields", (*self.required_fields, field))
        if self.state is not None and not isinstance(self.state, State):
            raise TypeError(f"Detector(state=...) takes a detectorkit.State, not {type(self.state).__name__}")
        if self.on_timer is not None and self.state is None:
            raise TypeError("Detector(on_timer=...) needs state=State(...): a timer belongs to a key's state")
        if self.repartition and self.key_field is None:
            raise TypeError("Detector(repartition=True) re-keys the input by key_field: name it, key_field=...")
        if self.sees_partition_time and self.state is None:
            raise TypeError("Detector(sees_partition_time=True) needs state=State(...): the time is a partition's, seen by keyed state")

    def configured(self, config: Any) -> Detector:
        """The detector to run with `config`: itself, unless it is built from its config."""
        return self if self.configure is None else self.configure(config)

    def load_config(self, environ: Mapping[str, str] | None = None) -> Any:
        """The config dataclass filled from DETECTOR_<FIELD> variables; SettingsError on a bad value."""
        return config_from_env(self.config, "DETECTOR_", environ)


def takes_config(function: Callable | None) -> bool:
    """Whether a rule's function (its `where`, a condition) takes the config as a second argument."""
    if function is None:
        return False
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in parameters)


def bound(function: Callable | None, config: Any) -> Callable | None:
    """A rule's function of the records alone: with `config` bound if it takes it."""
    if function is None or not takes_config(function):
        return function
    return lambda frame: function(frame, config)


def defaults_of(config: type, needed: bool, rule: str) -> Any:
    """The config's defaults, for a rule to be built with at import; None for a rule that does not
    depend on its config (`needed` False) and whose config has none. A rule built from its config
    needs a default for every field."""
    try:
        return config()
    except TypeError as exc:
        if not needed:
            return None
        raise TypeError(f"{rule}(config={config.__name__}): a rule built from its config needs a default for every field ({exc})") from None
