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
import sys
import time

from detectorkit.kafka import clients
from detectorkit.kafka.access import KafkaAccess
from detectorkit.state import cache
from detectorkit.state.changelog import StateContext


def main(argv: list[str]) -> int:
    bootstrap, topic, target, *pairs = argv
    module, _, attribute = target.partition(":")
    state = getattr(importlib.import_module(module), attribute).state
    ctx = StateContext(topic, KafkaAccess(clients.base(bootstrap), "detectorkit-restore"))
    partitions = {}
    started = time.time()
    wanted = {int(p): (int(start), 0) for p, _, start in (pair.partition("=") for pair in pairs)}
    for p, opened in cache.open_stores(ctx, state, wanted).items():
        partitions[p] = {"records": opened.restored, "keys": len(opened.store), "bytes": opened.store.bytes, "seconds": opened.seconds}
    ended = time.time()
    print(json.dumps({"started": started, "ended": ended, "partitions": partitions, "peak_rss_bytes": peak_rss_bytes()}))
    return 0


def peak_rss_bytes() -> int:
    """This process's own peak RSS: the kernel's high-water mark of its memory map (VmHWM), which
    exec starts afresh. Not getrusage's ru_maxrss: Linux carries it over fork and exec, so a process
    started by the benchmark reported the benchmark's own peak (1,268 MiB "for a restore" on
    2026-11-25 01:31, while the restore itself peaked at 352 MiB by VmHWM in the next run)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
