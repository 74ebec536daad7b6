"""Restores state stores from their changelog as the service's tasks do (detectorkit.state.cache.open_stores,
in a fresh process: nothing cached), and prints what it took as one JSON line.

    restore_store.py BOOTSTRAP CHANGELOG_TOPIC DETECTOR PARTITION=START [PARTITION=START ...]

DETECTOR is module:attribute of the detector whose State the changelog holds; START is the group's
committed input offset of the partition (changes tagged past it are skipped, as on a real restore).
The partitions are read together, as one Spark task of a Python worker reads its partitions.
"""

from __future__ import annotations

import importlib
import json
import resource
import sys
import time

from detectorkit.kafka import clients
from detectorkit.state import cache
from detectorkit.state.changelog import StateContext


def main(argv: list[str]) -> int:
    bootstrap, topic, target, *pairs = argv
    module, _, attribute = target.partition(":")
    state = getattr(importlib.import_module(module), attribute).state
    ctx = StateContext(topic, clients.base(bootstrap))
    partitions = {}
    started = time.time()
    wanted = {int(p): (int(start), 0) for p, _, start in (pair.partition("=") for pair in pairs)}
    for p, opened in cache.open_stores(ctx, state, wanted).items():
        partitions[p] = {"records": opened.restored, "keys": len(opened.store), "bytes": opened.store.bytes, "seconds": opened.seconds}
    ended = time.time()
    # ru_maxrss is in KiB on Linux.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"started": started, "ended": ended, "partitions": partitions, "peak_rss_bytes": peak}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
