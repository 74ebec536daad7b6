"""Idle density: how many detector services fit in this machine's memory, against Kafka Streams
applications doing the same detection.

A platform runs tens of detectors, most of them idle most of the time, each its own job. This starts
`instances` of one contender, one after another (each ready when its first detection came out), each
with a consumer group and an output topic of its own on one shared input topic, as a platform's
detectors are. Once the last one is ready it waits `settle_s` (Spark ends Python workers idle for a
minute; the figure is what an idle job holds, not what its start-up did), then samples every
process tree at once for `sample_s`: PSS splits the pages the instances share (the Python and Java
libraries, Spark's class archive) among them, as on a machine that runs them side by side.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable

import psutil
from confluent_kafka import Producer

from detectorkit.kafka import clients


def density_run(
    name: str,
    make: Callable[[int], object],
    base: dict,
    in_topic: str,
    instances: int,
    logs: pathlib.Path,
    *,
    launch,
    stop,
    until_ready,
    tail_of,
    sampler_of,
    topics_of,
    settle_s: float = 75.0,
    sample_s: float = 10.0,
) -> dict:
    """`make(i)`: the i-th instance's contender (reading `in_topic`). The bench's own helpers are
    passed in (launch, stop, until_ready, its output tail, its process-tree sampler, topics_of), so
    every contender is started, watched and measured as in the other runs."""
    contenders = [make(i) for i in range(instances)]
    for c in contenders:
        clients.create_topics(base, topics_of(c))
    producer = Producer(clients.producer(base, **{"linger.ms": 1}))
    procs, tails = [], []
    try:
        for i, c in enumerate(contenders):
            tail = tail_of(base, c.output_topic)
            tail.start()
            tails.append(tail)
            proc = launch(c, logs / f"density-{name.split()[0].lower()}-{i}.log")
            procs.append(proc)
            until_ready(producer, in_topic, tail, proc, f"{name} #{i}")
        time.sleep(settle_s)  # idle on purpose: what an idle job holds is the figure
        samplers = [sampler_of(p.pid) for p in procs]
        cpu_before = []
        for s in samplers:
            s.sample()
            cpu_before.append(s.cpu)
        pss = [[] for _ in procs]
        first: list[dict[str, tuple[int, int]]] = []  # the first instance, per kind of process
        began = time.monotonic()
        while time.monotonic() - began < sample_s:
            for k, s in enumerate(samplers):
                s.sample()
                pss[k].append(s.pss)
            first.append(samplers[0].pss_by_kind)
            time.sleep(1.0)
        elapsed = time.monotonic() - began
        for s in samplers:
            s.sample()
    finally:
        for proc in procs:
            stop(proc)
        for tail in tails:
            tail.stop()
    per_instance = sum(sum(v) / len(v) for v in pss) / instances
    cpu_share = sum(s.cpu - before for s, before in zip(samplers, cpu_before, strict=True)) / elapsed / instances
    memory = psutil.virtual_memory().total
    return {
        "name": name,
        "instances": instances,
        "idle_pss_bytes": per_instance,
        "idle_cpu_cores": cpu_share,
        "fit_in_memory": int(memory // per_instance) if per_instance else 0,
        # Where an idle instance's memory is: each kind of process, its mean PSS over the samples.
        "idle_pss_by_process": {
            kind: {"pss_bytes": sum(f.get(kind, (0, 0))[0] for f in first) / len(first), "processes": max(f.get(kind, (0, 0))[1] for f in first)}
            for kind in sorted({k for f in first for k in f})
        }
        if first
        else {},
        "memory_bytes": memory,
    }
