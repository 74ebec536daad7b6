"""A prototype of the window state engine issue 56's speed target needs (docs/benchmarks.md, "What
the target needs"), beside the runtime's own path on the same records, in one process.

    python bench/window_kernel.py                        # the model benchmark's 1,000,000 records
    python bench/window_kernel.py --window-seconds 60
    python bench/window_kernel.py --out bench/results/window-kernel.md   # appended to it too

The prototype keeps a sliding window's state per key in native arrays (compiled by numba) and
updates it record by record: the key's held records older than the window leave, the record joins,
and its count, exact sum (math.fsum's answer) and distinct count are read. It is not the runtime:
no savepoints, changelog or restore, and each key's times in order (the benchmark's are).

The runtime's path: the windowed model's window rule (`windows.Sliding`, `Every`, the customer's
orders, spending and distinct merchants) on each poll of each of one task's partitions, its state
read from and written to the partition's store, as the runner calls them (without the model, the
runner's checks, the changelog or the detections).

Printed: each path's CPU per record and their ratio, and whether the prototype's answers equal the
rule's and a single pass over the records (math.fsum and a set per key); it exits 1 if they do not.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
import time
import zlib
from collections import defaultdict, deque

import common
import model
import numpy as np
import pandas as pd
from numba import njit
from parts import TASK_PARTITIONS

from detectorkit import windows
from detectorkit.runtime.slices import STATEFUL_POLL_RECORDS
from detectorkit.state.declaration import EVENT_TIME, KEY
from detectorkit.state.store import PartitionStore

AGGREGATES = {"orders": windows.Count(), "spent": windows.Sum("amount"), "merchants": windows.DistinctCount("merchant")}
# fsum's partials of doubles never number more than about 40 (their exponents do not overlap).
PARTIALS = 128


@njit(cache=True)
def _fsum(values, lo, hi, partials):
    """math.fsum of values[lo:hi]: Shewchuk's partials, then CPython's rounding of them."""
    n = 0
    for k in range(lo, hi):
        x = values[k]
        i = 0
        for j in range(n):
            y = partials[j]
            if abs(x) < abs(y):
                x, y = y, x
            high = x + y
            low = y - (high - x)
            if low != 0.0:
                partials[i] = low
                i += 1
            x = high
        partials[i] = x
        n = i + 1
    total = 0.0
    if n > 0:
        n -= 1
        total = partials[n]
        low = 0.0
        while n > 0:
            x = total
            n -= 1
            y = partials[n]
            total = x + y
            low = y - (total - x)
            if low != 0.0:
                break
        # Half-way cases round to even as the exact sum would: CPython's correction.
        if n > 0 and ((low < 0.0 and partials[n - 1] < 0.0) or (low > 0.0 and partials[n - 1] > 0.0)):
            y = low * 2.0
            x = total + y
            if y == x - total:
                total = x
    return total


@njit(cache=True)
def _distinct(hashes, lo, hi, table):
    """How many distinct values hashes[lo:hi] holds: an open-addressing set (NaN: empty slot)."""
    size = 16
    while size < 2 * (hi - lo):
        size *= 2
    for k in range(size):
        table[k] = np.nan
    count = 0
    for k in range(lo, hi):
        x = hashes[k]
        h = np.int64(x) & (size - 1)
        while True:
            y = table[h]
            if y != y:
                table[h] = x
                count += 1
                break
            if y == x:
                break
            h = (h + 1) & (size - 1)
    return count


@njit(cache=True)
def _run(slots, t, v, m, size, base, off, lens, caps, pool_t, pool_v, pool_m, top, out):
    """Each record in order: its key's held records older than t - size leave, it joins, and its
    count, sum and distinct count go to out. A key's records lie in its own region of the pools
    (base, capacity), from an offset; a full region moves to the pools' end at twice the size."""
    partials = np.empty(PARTIALS)
    table = np.empty(16)
    for i in range(len(slots)):
        s = slots[i]
        now = t[i]
        b = base[s]
        while lens[s] > 0 and pool_t[b + off[s]] < now - size:
            off[s] += 1
            lens[s] -= 1
        if lens[s] == 0:
            off[s] = 0
        if off[s] + lens[s] == caps[s]:
            if off[s] > 0:
                for k in range(lens[s]):
                    pool_t[b + k] = pool_t[b + off[s] + k]
                    pool_v[b + k] = pool_v[b + off[s] + k]
                    pool_m[b + k] = pool_m[b + off[s] + k]
                off[s] = 0
            else:
                cap = max(4, 2 * caps[s])
                if top + cap > len(pool_t):
                    grown = max(2 * len(pool_t), top + cap)
                    new_t = np.empty(grown, np.int64)
                    new_t[:top] = pool_t[:top]
                    new_v = np.empty(grown)
                    new_v[:top] = pool_v[:top]
                    new_m = np.empty(grown)
                    new_m[:top] = pool_m[:top]
                    pool_t, pool_v, pool_m = new_t, new_v, new_m
                for k in range(lens[s]):
                    pool_t[top + k] = pool_t[b + k]
                    pool_v[top + k] = pool_v[b + k]
                    pool_m[top + k] = pool_m[b + k]
                base[s] = b = top
                caps[s] = cap
                top += cap
        at = b + off[s] + lens[s]
        pool_t[at], pool_v[at], pool_m[at] = now, v[i], m[i]
        lens[s] += 1
        lo, hi = b + off[s], at + 1
        out[i, 0] = lens[s]
        out[i, 1] = _fsum(pool_v, lo, hi, partials)
        need = 16
        while need < 2 * (hi - lo):
            need *= 2
        if len(table) < need:
            table = np.empty(need)
        out[i, 2] = _distinct(pool_m, lo, hi, table)
    return pool_t, pool_v, pool_m, top


class KernelPartition:
    """One partition's keys in slots (a Python dict from key to slot, looked up once per key a
    poll holds) and their held records in the pools."""

    def __init__(self, size_ms: int) -> None:
        self.size = size_ms
        self.slot: dict[str, int] = {}
        self.base, self.off, self.lens, self.caps = (np.zeros(1024, np.int64) for _ in range(4))
        self.pool_t, self.pool_v, self.pool_m, self.top = np.empty(1 << 16, np.int64), np.empty(1 << 16), np.empty(1 << 16), 0

    def poll(self, frame: pd.DataFrame) -> np.ndarray:
        """(count, sum, distinct count) as of each record of the poll."""
        codes, uniques = pd.factorize(frame[KEY].to_numpy())
        get, held = self.slot.setdefault, self.slot
        slots = np.fromiter((get(k, len(held)) for k in uniques.tolist()), np.int64, len(uniques))[codes]
        if len(held) > len(self.base):
            capacity = max(len(held), 2 * len(self.base))
            self.base, self.off, self.lens, self.caps = (_grown(a, capacity) for a in (self.base, self.off, self.lens, self.caps))
        t = frame[EVENT_TIME].astype("int64").to_numpy() // 1_000_000
        v = frame["amount"].to_numpy(dtype=np.float64)
        m = (pd.util.hash_array(frame["merchant"].to_numpy()) >> np.uint64(11)).astype(np.float64)  # as the rule hashes them
        out = np.empty((len(frame), 3))
        self.pool_t, self.pool_v, self.pool_m, self.top = _run(
            slots, t, v, m, self.size, self.base, self.off, self.lens, self.caps, self.pool_t, self.pool_v, self.pool_m, self.top, out
        )
        return out


def _grown(array: np.ndarray, capacity: int) -> np.ndarray:
    bigger = np.zeros(capacity, dtype=array.dtype)
    bigger[: len(array)] = array
    return bigger


def polls(rows: list[dict], times: list[int]) -> list[list[pd.DataFrame]]:
    """One task's records (its partitions of the benchmark's), as polls of the job's size, each
    split by partition as the runner gets them: frames with the key and event time columns."""
    partition = np.array([zlib.crc32(r["customer"].encode()) % common.PARTITIONS for r in rows])
    mine = np.flatnonzero(partition < TASK_PARTITIONS)
    frame = pd.DataFrame([rows[i] for i in mine.tolist()], index=np.arange(len(mine)))
    frame[KEY] = frame["customer"]
    frame[EVENT_TIME] = pd.to_datetime(np.asarray(times)[mine], unit="ms", utc=True).astype("datetime64[ns, UTC]")
    of = partition[mine]
    out = []
    for lo in range(0, len(mine), STATEFUL_POLL_RECORDS):
        poll, where = frame.iloc[lo : lo + STATEFUL_POLL_RECORDS], of[lo : lo + STATEFUL_POLL_RECORDS]
        out.append([poll[where == p] for p in range(TASK_PARTITIONS)])
    return out


def runtime_path(batches: list[list[pd.DataFrame]], window_s: float) -> tuple[float, np.ndarray]:
    """CPU seconds of the window rule with its stores over the polls, and its answers by record."""
    detector = windows.detector(
        "window-kernel-peer", window=windows.Sliding(window_s), aggregate=AGGREGATES, emit=windows.Every(), required_fields=("amount", "merchant")
    )
    config = detector.load_config()
    stores = [PartitionStore(detector.state, p) for p in range(TASK_PARTITIONS)]
    answers = np.full((sum(len(f) for poll in batches for f in poll), 3), np.nan)
    cpu = 0.0
    for tag, poll in enumerate(batches, 1):
        for store, frame in zip(stores, poll, strict=True):
            if frame.empty:
                continue
            started = time.process_time()
            keys = pd.unique(frame[KEY].to_numpy()).tolist()
            found, new_state = detector.detect(frame, store.read(keys), config)
            last = frame.groupby(KEY, sort=False)[EVENT_TIME].max().loc[keys].astype("int64").to_numpy() // 1_000_000
            store.write(store.prepare(new_state, keys, last, tag=tag), tag)
            cpu += time.process_time() - started
            answers[found.index.to_numpy()] = found[list(AGGREGATES)].to_numpy(dtype=np.float64)
    return cpu, answers


def kernel_path(batches: list[list[pd.DataFrame]], window_s: float) -> tuple[float, np.ndarray]:
    parts = [KernelPartition(int(window_s * 1000)) for _ in range(TASK_PARTITIONS)]
    answers = np.full((sum(len(f) for poll in batches for f in poll), 3), np.nan)
    cpu = 0.0
    for poll in batches:
        for part, frame in zip(parts, poll, strict=True):
            if frame.empty:
                continue
            started = time.process_time()
            out = part.poll(frame)
            cpu += time.process_time() - started
            answers[frame.index.to_numpy()] = out
    return cpu, answers


def single_pass(batches: list[list[pd.DataFrame]], window_s: float) -> np.ndarray:
    """Each record's count, math.fsum and distinct merchants over its key's window, one record at a time."""
    frame = pd.concat([f for poll in batches for f in poll]).sort_index()
    size = int(window_s * 1000)
    held: dict[str, deque] = defaultdict(deque)
    t = (frame[EVENT_TIME].astype("int64") // 1_000_000).tolist()
    answers = np.empty((len(frame), 3))
    for i, (key, at, amount, merchant) in enumerate(zip(frame[KEY].tolist(), t, frame["amount"].tolist(), frame["merchant"].tolist(), strict=True)):
        window = held[key]
        while window and window[0][0] < at - size:
            window.popleft()
        window.append((at, amount, merchant))
        answers[i] = (len(window), math.fsum(a for _, a, _ in window), len({m for _, _, m in window}))
    return answers


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--window-seconds", type=float, default=model.WINDOW_MS / 1000)
    parser.add_argument("--out", type=pathlib.Path, help="a file to write the results to as well (bench/results/window-kernel.md)")
    args = parser.parse_args(argv)
    _, times, rows = model.order_records(args.records)
    batches = polls(rows, times)
    count = sum(len(f) for poll in batches for f in poll)
    KernelPartition(1000).poll(batches[0][0].iloc[:3])  # compiled (or read from numba's cache) before it is timed
    runtime_cpu, runtime_answers = runtime_path(batches, args.window_seconds)
    kernel_cpu, kernel_answers = kernel_path(batches, args.window_seconds)
    expected = single_pass(batches, args.window_seconds)
    same_as_rule = np.array_equal(kernel_answers, runtime_answers)
    same_as_pass = np.array_equal(kernel_answers, expected)
    us = 1e6 / count
    text = (
        f"window {args.window_seconds:g} s, {count:,} records of one task's {TASK_PARTITIONS} partitions "
        f"in {len(batches)} polls ({common.machine()['date']})\n"
        f"  the runtime's window rule with its store: {runtime_cpu * us:.2f} µs per record\n"
        f"  the prototype (numba), key lookup included: {kernel_cpu * us:.2f} µs per record, "
        f"{common.ratio(kernel_cpu, runtime_cpu):.2f}x the runtime's\n"
        f"  its answers equal the rule's: {'yes' if same_as_rule else 'NO'}; a single pass's: {'yes' if same_as_pass else 'NO'}"
    )
    print(text)
    if args.out is not None:
        command = " ".join(["python bench/window_kernel.py", *(sys.argv[1:] if argv is None else argv)])
        with args.out.open("a") as out:
            out.write(f"`{command}`\n\n```\n{text}\n```\n\n")
    return 0 if same_as_rule and same_as_pass else 1


if __name__ == "__main__":
    sys.exit(main())
