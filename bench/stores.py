"""Where a partition's state lives (issue 19: "choose and measure"): the runtime's in-memory
columnar store (`detectorkit.state.store.PartitionStore`) beside RocksDB (through rocksdict, the
binding Quix Streams' own RocksDB store is built on) and SQLite (the standard library's), and the
same in-memory store with typed columns (`state/columns.py`, the template's burst detector), each as
a task's local store doing what a stateful batch does with it, without Kafka or Spark:

    python bench/stores.py                     # 1,000,000 records, restore of 1,000,000 keys
    python bench/stores.py --records 100000 --restore-keys 100000

A batch: the stateful benchmark's records (bench/stateful.py: 100,000 customers, a few hundred
busy), 250,000 a batch (MAX_RECORDS_PER_BATCH's default), split into 8 partitions by key; for each
partition, the state of the batch's keys is read into the frame a detector gets, then each key's
new state is encoded as its changelog value and written, and the changes are taken for the
changelog. The detector itself is left out (it is the same whatever the store); its new state
holds as much as the burst detector's (a list of times and a number). The JSON codec and the frame
are detectorkit's for all three, so what differs is the store. RocksDB and SQLite write to a
temporary directory, as a task's store would on the executor's disk (SQLite in WAL mode without
fsync; RocksDB with its write-ahead log off: the changelog is the truth).

Then the restore: 1,000,000 changelog values of distinct keys, as a task reads them back, into an
empty store of each kind (RocksDB and SQLite in one write batch a partition).

Printed, and written to bench/results/stores.{json,md}: CPU and wall seconds per 1M records of
each store, and their ratios to the in-memory store's.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import sqlite3
import sys
import tempfile
import time
import zlib

import common
import numpy as np
import orjson
import pandas as pd
import stateful
from rocksdict import AccessType, Options, Rdict, WriteBatch, WriteOptions

from detectorkit.runtime import gc_tuning
from detectorkit.state import codec, lists
from detectorkit.state.declaration import KEY, State
from detectorkit.state.store import PartitionStore

STATE = State(columns=("recent_ms", "flagged_ms"), ttl_seconds=3600)
TYPED = State(columns={"recent_ms": "list<int64>", "flagged_ms": "float64"}, ttl_seconds=3600)
PARTITIONS = 8
BATCH = 250_000


def batches(records: int) -> list[list[tuple[int, int, list[str], np.ndarray, pd.DataFrame, pd.DataFrame]]]:
    """Per batch, per partition: (partition, tag, distinct keys, their newest times, new state, the
    same new state as a typed detector returns it)."""
    values, times = stateful.burst_records(records)
    keys = [k.decode() for k, _, _ in values]
    parts = [zlib.crc32(k.encode()) % PARTITIONS for k in keys]
    out = []
    for b, start in enumerate(range(0, records, BATCH)):
        newest: dict[int, dict[str, int]] = {}
        for k, p, t in zip(keys[start : start + BATCH], parts[start : start + BATCH], times[start : start + BATCH], strict=True):
            newest.setdefault(p, {})[k] = t
        work = []
        for p, last in sorted(newest.items()):
            ks = list(last)
            ms = np.fromiter(last.values(), dtype=np.int64, count=len(ks))
            state = pd.DataFrame({"recent_ms": [[t - 2_000, t - 1_000, t] for t in ms.tolist()], "flagged_ms": b}, index=pd.Index(ks, name=KEY))
            typed = pd.DataFrame(
                {"recent_ms": lists((ms[:, None] + [-2_000, -1_000, 0]).ravel(), np.full(len(ms), 3)), "flagged_ms": float(b)},
                index=pd.Index(ks, name=KEY),
            )
            work.append((p, start + BATCH, ks, ms, state, typed))
        out.append(work)
    return out


# ---- the stores: read the batch's keys into a frame; write their new state ----------------------


def read_frame(keys: list[str], values: list[bytes | None], first_ms: np.ndarray) -> tuple[pd.DataFrame, np.ndarray]:
    """What PartitionStore.read and prepare take from the store: the state frame a detector gets
    (a key whose state expired before its first record here has none), and each key's newest
    time held (for its new `seen_ms`)."""
    ttl, loads = STATE.ttl_ms, orjson.loads
    held, seen = [], np.full(len(keys), np.iinfo(np.int64).min)
    for i, (k, v, first) in enumerate(zip(keys, values, first_ms.tolist(), strict=True)):
        if v is None:
            continue
        body = loads(v)
        seen[i] = body["seen_ms"]
        if body["seen_ms"] + ttl >= first:
            held.append((k, body["state"]))
    frame = pd.DataFrame(
        {c: [s[c] for _, s in held] for c in STATE.columns}, index=pd.Index([k for k, _ in held], dtype=object, name=KEY), columns=list(STATE.columns)
    )
    return frame, seen


def encoded(state: pd.DataFrame, ms: np.ndarray) -> list[bytes]:
    columns = [state[c].tolist() for c in STATE.columns]
    return codec.encode_many([dict(zip(STATE.columns, row, strict=True)) for row in zip(*columns, strict=True)], ms.tolist(), [None] * len(ms))


def checked(records: list[tuple[str, bytes, int, int]], where: str) -> None:
    """A restore checks every value's shape, as PartitionStore.restore does (a changed schema stops the job)."""
    codec.decode_many([v for _, v, *_ in records], STATE, where)


class Memory:
    name = "in memory, columnar (this project)"
    state = STATE

    def __init__(self, where: pathlib.Path):
        self.stores = {p: PartitionStore(self.state, p) for p in range(PARTITIONS)}

    def batch(self, p: int, tag: int, keys: list[str], ms: np.ndarray, state: pd.DataFrame) -> int:
        store = self.stores[p]
        store.read(keys, ms)
        store.write(store.prepare(state, keys, ms, tag=tag), tag)
        return len(store.take_changes())

    def restore(self, p: int, records: list[tuple[str, bytes, int, int]]) -> None:
        self.stores[p].restore(records, until=len(records))

    def close(self) -> None:
        pass


class TypedMemory(Memory):
    """Typed columns (state.columns): the detector's arrays kept as arrays; JSON made when the changes
    are taken, here every batch as for the others."""

    name = "in memory, typed columns (this project)"
    state = TYPED


class Rocks:
    name = "RocksDB (rocksdict)"

    def __init__(self, where: pathlib.Path):
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self.dbs = {p: Rdict(str(where / f"rocks-{p}"), options=options, access_type=AccessType.read_write()) for p in range(PARTITIONS)}
        self.write_options = WriteOptions()
        self.write_options.disable_wal = True

    def batch(self, p: int, tag: int, keys: list[str], ms: np.ndarray, state: pd.DataFrame) -> int:
        db = self.dbs[p]
        raw = [k.encode() for k in keys]
        _, seen = read_frame(keys, db.get(raw), ms)
        values = encoded(state, np.maximum(ms, seen))
        self._put(db, raw, values)
        return len(list(zip(keys, values, strict=True)))  # the changes for the changelog

    def _put(self, db: Rdict, keys: list[bytes], values: list[bytes]) -> None:
        batch = WriteBatch(raw_mode=True)
        for k, v in zip(keys, values, strict=True):
            batch.put(k, v)
        db.write(batch, write_opt=self.write_options)

    def restore(self, p: int, records: list[tuple[str, bytes, int, int]]) -> None:
        checked(records, f"rocksdb {p}")
        self._put(self.dbs[p], [k.encode() for k, *_ in records], [v for _, v, *_ in records])

    def close(self) -> None:
        for db in self.dbs.values():
            db.close()


class Sqlite:
    name = "SQLite (sqlite3, WAL, no fsync)"
    CHUNK = 30_000  # host parameters a statement (SQLite's limit: 32,766)

    def __init__(self, where: pathlib.Path):
        self.dbs = {}
        for p in range(PARTITIONS):
            db = sqlite3.connect(where / f"sqlite-{p}.db", isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=OFF")
            db.execute("CREATE TABLE state (key TEXT PRIMARY KEY, value BLOB) WITHOUT ROWID")
            self.dbs[p] = db

    def batch(self, p: int, tag: int, keys: list[str], ms: np.ndarray, state: pd.DataFrame) -> int:
        db = self.dbs[p]
        found: dict[str, bytes] = {}
        for i in range(0, len(keys), self.CHUNK):
            part = keys[i : i + self.CHUNK]
            found.update(db.execute(f"SELECT key, value FROM state WHERE key IN ({','.join('?' * len(part))})", part).fetchall())
        _, seen = read_frame(keys, [found.get(k) for k in keys], ms)
        values = encoded(state, np.maximum(ms, seen))
        changes = list(zip(keys, values, strict=True))  # for the changelog
        self._put(db, changes)
        return len(changes)

    @staticmethod
    def _put(db: sqlite3.Connection, rows) -> None:
        db.execute("BEGIN")
        db.executemany("INSERT OR REPLACE INTO state VALUES (?, ?)", rows)
        db.execute("COMMIT")

    def restore(self, p: int, records: list[tuple[str, bytes, int, int]]) -> None:
        checked(records, f"sqlite {p}")
        self._put(self.dbs[p], ((k, v) for k, v, *_ in records))

    def close(self) -> None:
        for db in self.dbs.values():
            db.close()


KINDS = (Memory, TypedMemory, Rocks, Sqlite)


def timed(fn) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--restore-keys", type=int, default=1_000_000)
    parser.add_argument("--out", type=pathlib.Path, default=common.HERE / "results")
    args = parser.parse_args(argv)

    work = batches(args.records)
    # The collector as the Python workers set it (runtime/gc_tuning.py): with the defaults it walks
    # the benchmark's own inputs (millions of lists) over and over, and that is what it measured.
    gc_tuning.tune_once()
    # Changelog values of distinct keys, as a restore reads them: (key, value, tag, offset) per partition.
    keys = [f"k{i:07d}" for i in range(args.restore_keys)]
    values = encoded(pd.DataFrame({"recent_ms": [[i] for i in range(len(keys))], "flagged_ms": None}, index=keys), np.arange(len(keys)))
    changelog: dict[int, list] = {}
    for k, v in zip(keys, values, strict=True):
        part = changelog.setdefault(zlib.crc32(k.encode()) % PARTITIONS, [])
        part.append((k, v, 0, len(part)))

    rows = []
    for kind in KINDS:
        where = pathlib.Path(tempfile.mkdtemp(prefix="bench-stores-"))
        try:
            store = kind(where)
            written = 0

            def run_batches(store=store, kind=kind):
                nonlocal written
                for batch in work:
                    for p, tag, ks, ms, state, typed in batch:
                        written += store.batch(p, tag, ks, ms, typed if kind is TypedMemory else state)

            cpu, wall = timed(run_batches)
            store.close()
            fresh = kind(pathlib.Path(tempfile.mkdtemp(prefix="bench-stores-", dir=where)))
            r_cpu, r_wall = timed(lambda fresh=fresh: [fresh.restore(p, records) for p, records in changelog.items()])
            fresh.close()
        finally:
            shutil.rmtree(where, ignore_errors=True)
        row = {
            "store": kind.name,
            "cpu_seconds_per_million": cpu / args.records * 1e6,
            "wall_seconds_per_million": wall / args.records * 1e6,
            "changelog_records": written,
            "restore_cpu_seconds": r_cpu,
            "restore_wall_seconds": r_wall,
        }
        rows.append(row)
        print(
            f"{kind.name}: {row['cpu_seconds_per_million']:.2f} CPU-s per 1M records ({row['wall_seconds_per_million']:.2f} s wall), "
            f"restore of {args.restore_keys:,} keys {r_wall:.2f} s",
            flush=True,
        )
    base = rows[0]
    for row in rows:
        row["cpu_ratio"] = row["cpu_seconds_per_million"] / base["cpu_seconds_per_million"]
        row["restore_ratio"] = row["restore_wall_seconds"] / base["restore_wall_seconds"]
    command = " ".join(["python bench/stores.py", *(sys.argv[1:] if argv is None else argv)])
    result = {"machine": common.machine(), "command": command, "params": {"records": args.records, "restore_keys": args.restore_keys}, "stores": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "stores.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    lines = [
        f"# Where state lives: the store's work per batch ({result['machine']['date']})",
        "",
        f"Machine: {result['machine']['cpus']} CPUs, {result['machine']['platform']}, Python {result['machine']['python']}. "
        f"Command: `{result['command']}`. {args.records:,} records of the stateful benchmark in batches of {BATCH:,}, "
        f"{PARTITIONS} partitions; the store reads the batch's keys into a detector's frame and writes their new state "
        "(detectorkit's codec for all); no Kafka, no Spark, no detector.",
        "",
        f"| store | CPU s per 1M records | × in memory | wall s per 1M | restore of {args.restore_keys:,} keys (s) | × in memory |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['store']} | {row['cpu_seconds_per_million']:.2f} | {row['cpu_ratio']:.2f}× | {row['wall_seconds_per_million']:.2f} | "
            f"{row['restore_wall_seconds']:.2f} | {row['restore_ratio']:.2f}× |"
        )
    (args.out / "stores.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
