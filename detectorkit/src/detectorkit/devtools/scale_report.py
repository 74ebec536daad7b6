"""What `scripts/scale-demo.sh` prints: a service's progress through its input, and at the end the
metrics-aggregator's `records read` against the records produced, detections written twice and
each hand-over's time, from the instances' logs.

    python -m detectorkit.devtools.scale_report progress BOOTSTRAP SERVICE
    python -m detectorkit.devtools.scale_report wait BOOTSTRAP SERVICE RECORDS
    python -m detectorkit.devtools.scale_report result BOOTSTRAP SERVICE RECORDS AGGREGATOR_LOG INSTANCE_LOG...
"""

from __future__ import annotations

import collections
import json
import pathlib
import sys
import time
import urllib.request

from detectorkit.kafka import clients
from detectorkit.kafka.end_offsets import ListOffsetsEnds
from detectorkit.kafka.offset_store import OffsetStore
from detectorkit.kafka.topic_reader import read_topic

INPUT = "records.normalized"


def positions(bootstrap: str, service: str) -> tuple[int, int]:
    """The service's committed position and the input's end, summed over partitions."""
    base = clients.base(bootstrap)
    ends = ListOffsetsEnds(base, INPUT, 10)
    store = OffsetStore(clients.consumer(base, service), INPUT, 10)
    try:
        partitions = ends.topic_partitions()
        return sum(o or 0 for o in store.committed(partitions).values()), sum(ends.end_offsets(partitions).values())
    finally:
        store.close()
        ends.close()


def progress(bootstrap: str, service: str) -> None:
    done, end = positions(bootstrap, service)
    print(f"   committed {done:,} of {end:,} records produced so far (lag {end - done:,})", flush=True)


def wait(bootstrap: str, service: str, records: int, timeout: float = 1800) -> None:
    deadline = time.monotonic() + timeout
    shown = 0.0
    while positions(bootstrap, service)[0] < records:
        if time.monotonic() > deadline:
            raise SystemExit(f"the service did not commit {records} records within {timeout} s")
        if time.monotonic() - shown > 10:
            progress(bootstrap, service)
            shown = time.monotonic()
        time.sleep(0.5)
    progress(bootstrap, service)


def aggregated(endpoint: str, service: str, name: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(endpoint, timeout=5) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("service") == service:
                return sample.value
    return None


def result(bootstrap: str, service: str, records: int, aggregator_log: str, instance_logs: list[str]) -> int:
    endpoint = next(json.loads(line)["endpoint"] for line in pathlib.Path(aggregator_log).read_text().splitlines()
                    if '"aggregator started"' in line)
    # The stopped instances' last snapshots reach the aggregator within its polling.
    read, deadline = None, time.monotonic() + 30
    while time.monotonic() < deadline:
        read = aggregated(endpoint, service, "detector_records_read_total")
        if read == records:
            break
        time.sleep(1)
    found = collections.Counter((m["value"] and json.loads(m["value"])["source"]["partition"],
                                 m["value"] and json.loads(m["value"])["source"]["offset"])
                                for m in read_topic(clients.base(bootstrap), "detections"))
    twice = sum(n - 1 for n in found.values() if n > 1)
    print(f"records produced:                    {records:,}")
    print(f"aggregated records read:             {read:,.0f}")
    print(f"records read minus records produced: {read - records:,.0f}   (the talk's 'processed twice'; ours must be 0)")
    print(f"detections written:                  {sum(found.values()):,} ({twice} of them twice)")
    print("hand-overs (from a rebalance's start to the partitions released or read again):")
    for log in instance_logs:
        name = pathlib.Path(log).stem
        for line in pathlib.Path(log).read_text().splitlines():
            if line.startswith("{") and ('"partitions assigned"' in line or '"partitions released"' in line):
                entry = json.loads(line)
                print(f"   {name:<24} {entry['event']:<20} {str(entry['partitions']):<14} {entry['handover_seconds']:6.2f} s")
    return 0 if read == records and twice == 0 else 1


def main(argv: list[str]) -> int:
    command, bootstrap, service, *rest = argv
    if command == "progress":
        progress(bootstrap, service)
    elif command == "wait":
        wait(bootstrap, service, int(rest[0]))
    elif command == "result":
        return result(bootstrap, service, int(rest[0]), rest[1], rest[2:])
    else:
        raise SystemExit(f"unknown command {command!r}: progress, wait or result")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
