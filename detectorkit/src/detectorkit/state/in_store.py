"""What a detector that runs on its store's columns itself (`Detector.in_store`: a sliding window
emitted at every record, a model's window features) is given and gives back: its batch's keys' list
columns as arrays, not frames of state in and out of `detect`.

Such a detector answers one pass over the records, as `detect` does, and judges its keys' expiry
itself (the state of a key whose newest record is more than the TTL before the partition's event
time at its next record is gone by then). It changes nothing it is given: the runner writes what it
gives back once the whole batch has answered, so a call that raises leaves the store as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class KeyColumns:
    """The batch's keys' state: `codes`, each record's key (a position in `keys`, which are in the
    order of their first record); `seen`, each key's newest record time (NEVER: none held);
    `columns`, each list column's values end to end with each key's length; `marks`, the partition's
    event time at each record; `ttl_ms`, None for none."""

    codes: np.ndarray
    keys: list[str]
    seen: np.ndarray
    columns: dict[str, tuple[np.ndarray, np.ndarray]]
    marks: np.ndarray
    ttl_ms: int | None
