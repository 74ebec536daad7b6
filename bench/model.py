"""The model benchmark (issue 56): a detector that scores every record with a 100-tree
gradient-boosted classifier over 10 features, 3 of them the customer's window aggregates, beside
the template's stateless threshold service, on the same records in the same run, on the same broker.

    python bench/model.py                      # 1,000,000 records (make bench-model)
    python bench/model.py --records 200000     # a quick run
    python bench/model.py --repeat 1           # one round instead of three
    python bench/model.py --parts              # where a task's CPU goes, without Kafka or Spark (bench/parts.py)

Records are keyed by customer (100,000 customers, a rotating few hundred of them busy), carry seven
numeric fields and a merchant, and their event time as the Kafka timestamp, 2 ms apart. Four
contenders read them from the start, one after the other:

- the model detector (bench/contenders/scoring.py WINDOWED): amount, items, hour, account age,
  distance, failed logins and device risk, and the customer's orders, spending and distinct
  merchants in the last hour as of the record;
- the same with the customer's orders, spending and mean order (WINDOWED_ONE_FIELD: aggregates of
  one field, so one value held per record, and no distinct count);
- the same kind of model over the seven fields alone (FIELDS_ONLY, stateless): what the windows cost
  apart from the model;
- the template's default service (a threshold on the amount, stateless): the peer of the targets.

They run in rounds (`--repeat`, 3 by default), each round every contender once on fresh topics,
and the ratios are taken within each round: the machine's speed drifts over minutes, so a ratio of
two runs minutes apart measures the drift as much as the contenders. The tables give each figure's
median over the rounds, with the lowest and highest. Each run must give exactly the detections of
a single pass computed here (each customer's aggregates so far, scored by ONNX Runtime with the
same ONNX file). Then the model's own scoring cost alone, over the same feature matrix in batches
as a Python worker scores a task's records: the runtime's compiled trees (models.trees, which the
job uses), and ONNX Runtime on one thread, its peer; their scores must be equal bit for bit.

Printed, and written to bench/results/model.{json,md}: throughput and CPU per record of each, the
targets (the model detector's records/s at least 0.5x the stateless service's, its CPU per record
at most 2x), and the scoring cost.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import pathlib
import random
import statistics
import sys
import tempfile
import time
import uuid

import common
import numpy as np
import stateful

from detectorkit import models
from detectorkit.devtools.brokers import ENGINES
from detectorkit.kafka import clients

POPULATION = 100_000
MERCHANTS = 2_000
STEP_MS = 2
WINDOW_MS = 3_600_000
THRESHOLD = 0.5
TREES = 100
# A scoring call's rows in the cost alone: a poll of a partition's backlog during the run.
SCORE_BATCH = 10_000


def order_records(count: int, seed: int = 42, hot: int = 500, hot_share: float = 0.3) -> tuple[list, list[int], list[dict]]:
    """(key, value, amount above the threshold service's), event times and the records as dicts."""
    rng = random.Random(seed)
    first_ms = int(time.time() * 1000) - count * STEP_MS
    values, times, rows = [], [], []
    for i, customer in zip(range(count), stateful.busy_customers(rng, POPULATION, hot, hot_share), strict=False):
        high = rng.random() < 0.05
        t = first_ms + i * STEP_MS
        row = {
            "id": i,
            "customer": f"c{customer:05d}",
            "merchant": f"m{rng.randrange(MERCHANTS):04d}",
            "amount": round(rng.uniform(1000.01, 5000), 2) if high else round(rng.uniform(0, 1000), 2),
            "items": rng.randrange(1, 20),
            "hour": t // 3_600_000 % 24,
            "account_age_days": rng.randrange(0, 3650),
            "distance_km": round(rng.expovariate(1 / 50), 1),
            "failed_logins": min(int(rng.expovariate(1.5)), 9),
            "device_risk": round(rng.random(), 3),
        }
        values.append((row["customer"].encode(), json.dumps(row).encode(), high))
        times.append(t)
        rows.append(row)
    return values, times, rows


def features(rows: list[dict], times: list[int], aggregates: str | None, window_ms: int = WINDOW_MS) -> np.ndarray:
    """The model's features of every record in one pass: its fields and its customer's orders,
    spending and distinct merchants ("merchants") or mean order ("mean") over [t - window, t] as of
    the record (records come in time order); None: the fields alone. Sums as the rule's: correctly
    rounded."""
    import scoring

    fields = np.array([[r[f] for f in scoring.FIELDS] for r in rows], dtype=np.float64)
    if aggregates is None:
        return fields.astype(np.float32)
    held: dict[str, collections.deque] = collections.defaultdict(collections.deque)  # (time, amount, merchant)
    merchants: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    third = np.empty((len(rows), 3))
    for i, (r, t) in enumerate(zip(rows, times, strict=True)):
        c = r["customer"]
        window, seen = held[c], merchants[c]
        window.append((t, r["amount"], r["merchant"]))
        seen[r["merchant"]] += 1
        while window[0][0] < t - window_ms:
            _, _, gone = window.popleft()
            seen[gone] -= 1
            if not seen[gone]:
                del seen[gone]
        n, spent = len(window), math.fsum(a for _, a, _ in window)
        third[i] = (n, spent, len(seen) if aggregates == "merchants" else spent / n)
    return np.column_stack([fields, third]).astype(np.float32)


def labels(X: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """What the made-up history calls fraud: large far orders, many orders with failed logins, a
    spree of merchants, or a risky device; 2% of the labels flipped."""
    amount, distance, failed, risk = X[:, 0], X[:, 4], X[:, 5], X[:, 6]
    y = (amount > 900) & (distance > 120)
    if X.shape[1] > 7:  # the customer's orders and its third aggregate: distinct merchants, or its mean order
        y |= (X[:, 7] > 6) & (failed >= 2) | (X[:, 9] > (8 if X[:, 9].max() < 100 else 700)) & (amount > 1000)
    y |= risk > 0.995
    return (y ^ (rng.random(len(y)) < 0.02)).astype(int)


def train(X: np.ndarray, path: pathlib.Path, name: str) -> str:
    """A 100-tree gradient-boosted classifier on the first records' features, exported to ONNX."""
    from sklearn.ensemble import GradientBoostingClassifier

    rng = np.random.default_rng(1)
    sample = X[: min(len(X), 50_000)]
    model = GradientBoostingClassifier(n_estimators=TREES, max_depth=3, random_state=1).fit(sample, labels(sample, rng))
    models.export(model, path, name=name, version="1")
    return str(path)


SCORING_ROWS = (("windowed", "windowed (10 features)"), ("one_field", "windowed, one field (10 features)"), ("fields", "fields only (7 features)"))


def scoring_alone(uri: str, X: np.ndarray) -> dict:
    """The scoring's own cost over the features in batches: the model as a worker scores it
    (compiled trees where they apply), and ONNX Runtime's session, whose scores are the reference."""
    from detectorkit.models import scoring

    model = models.Model.load(uri)
    model.warm()  # the session made and the trees checked, as a worker's first task does
    session = scoring._session(model.digest, model.content)

    def timed(score) -> tuple[np.ndarray, dict]:
        cpu, wall = time.process_time(), time.perf_counter()
        scores = np.concatenate([score(X[i : i + SCORE_BATCH]) for i in range(0, len(X), SCORE_BATCH)])
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        return scores, {"records_per_s": len(X) / wall, "cpu_seconds_per_million": cpu / len(X) * 1_000_000}

    scores, runtime = timed(model.score)
    reference, onnx_runtime = timed(lambda rows: scoring._onnx_scores(session, rows).astype(np.float64))
    if not np.array_equal(scores, reference):
        raise SystemExit(f"{uri}: the runtime's scores are not ONNX Runtime's")
    compiled = scoring._TREES[model.digest] is not None
    return {"batch": SCORE_BATCH, "compiled": compiled, "runtime": runtime, "onnx_runtime": onnx_runtime, "scores": reference}


def model_service(target: str, name: str, uri: str, bootstrap: str, in_topic: str, prefix: str, slug: str, window_seconds: float) -> common.Contender:
    out, group = f"{prefix}.{slug}.out", f"{prefix}-{slug}"
    env = stateful.service_env(bootstrap, in_topic, out, group, f"{prefix}.metrics")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(common.HERE / "contenders"), os.environ.get("PYTHONPATH")) if p)
    env |= {"DETECTOR_MODEL_URI": uri, "DETECTOR_THRESHOLD": str(THRESHOLD), "BENCH_WINDOW_SECONDS": str(window_seconds)}
    return common.Contender(name, out, [sys.executable, "-m", "detectorkit", "run", "--detector", f"scoring:{target}"], env)


def markdown(result: dict) -> str:
    p, r, alone = result["params"], result["ratios"], result["scoring_alone"]
    lines = [
        f"# Model benchmark results ({result['machine']['date']})",
        "",
        f"{common.machine_line(result)} Every contender gets {p['cores']} cores. Command: `{result['command']}`.",
        "",
        f"## Throughput: {p['records']:,} records keyed by customer ({p['population']:,} customers), event time as the Kafka timestamp, "
        f"{p['partitions']} partitions",
        "",
        f"Model detector: a {p['trees']}-tree gradient-boosted classifier (depth 3, ONNX) over 10 features, the record's 7 fields and its "
        f"customer's orders, spending and distinct merchants in the last {p['window_seconds']:g} s as of the record "
        "(bench/contenders/scoring.py), or its "
        "orders, spending and mean order (aggregates of one field: one value held per record, no distinct count); "
        f"a detection at a score of {p['threshold']:g} or more. The fields-only model: {p['trees']} trees over the 7 fields, no state. "
        f"Threshold service: the template's default, amount above {common.THRESHOLD:g}. Expected detections: a single pass computed by "
        "the benchmark, scored with the same ONNX file.",
        "",
        "| contender | records/s | CPU s per 1M records (steady) | CPU s per 1M records (total) | peak memory (PSS) "
        "| first detection after launch | detections | complete |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for t in result["throughput"]:
        lines.append(
            f"| {t['name']} | {_spread(t, 'records_per_s', ',.0f')} | {_spread(t, 'steady_cpu_seconds_per_million', '.1f')} | "
            f"{_spread(t, 'cpu_seconds_per_million', '.1f')} | {t['peak_memory_bytes'] / 2**20:,.0f} MiB | {t['first_detection_s']:.1f} s | "
            f"{t['detections']:,}/{t['expected']:,} | {'yes' if t['complete'] else 'NO'} |"
        )
    lines += [
        "",
        f"## The model's scoring alone (one thread, batches of {alone['windowed']['batch']:,} rows, no Kafka or Spark; the same scores)",
        "",
        "| model | the runtime's (compiled trees): records/s | CPU s per 1M records | ONNX Runtime: records/s | CPU s per 1M records | CPU ratio |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| {label} | {alone[kind]['runtime']['records_per_s']:,.0f} | {alone[kind]['runtime']['cpu_seconds_per_million']:.2f} | "
            f"{alone[kind]['onnx_runtime']['records_per_s']:,.0f} | {alone[kind]['onnx_runtime']['cpu_seconds_per_million']:.2f} | "
            f"{common.ratio(alone[kind]['runtime']['cpu_seconds_per_million'], alone[kind]['onnx_runtime']['cpu_seconds_per_million']):.2f}× |"
            for kind, label in SCORING_ROWS
        ),
        "",
        f"## Targets (ratios within each of {len(result['rounds'])} rounds: the median, and the lowest and highest)",
        "",
        "| target | measured | met (median) |",
        "|---|---:|---|",
        f"| throughput, model detector / stateless service ≥ 0.5 | {_ratio(result, 'throughput_model_to_stateless')} | "
        f"{'yes' if r['throughput_model_to_stateless'] >= 0.5 else 'NO'} |",
        f"| CPU per record (steady), model detector / stateless service ≤ 2 | {_ratio(result, 'cpu_model_to_stateless')} | "
        f"{'yes' if r['cpu_model_to_stateless'] <= 2 else 'NO'} |",
        f"| the same, its aggregates of one field (count, sum, mean): throughput ≥ 0.5 | {_ratio(result, 'throughput_one_field_to_stateless')} | "
        f"{'yes' if r['throughput_one_field_to_stateless'] >= 0.5 else 'NO'} |",
        f"| the same, its aggregates of one field: CPU per record ≤ 2 | {_ratio(result, 'cpu_one_field_to_stateless')} | "
        f"{'yes' if r['cpu_one_field_to_stateless'] <= 2 else 'NO'} |",
        f"| the model's scoring alone, share of the model detector's steady CPU per record | {r['scoring_share_of_cpu']:.0%} | reported |",
        f"| throughput, fields-only model / stateless service | {_ratio(result, 'throughput_fields_to_stateless')} | reported |",
        "",
        "## How",
        "",
        "- Each round runs every contender once, in this order, on fresh output topics; each figure is the median of a contender's "
        "runs, with the lowest and highest in brackets, and each ratio the median of the rounds' ratios.",
        "- CPU is the whole process tree's (Spark's JVM and Python workers). Steady: the CPU spent after the first detection, per record "
        "processed after it; total: from launch. Records/s: from the first detection to the last.",
        "- Each contender reads the topic from the start at-least-once, with the runtime's defaults otherwise (slices, state flushed "
        "every 5 s for the windowed model).",
        "- The scoring alone is one process's CPU over the whole feature matrix; a Python worker per core scores during the run. "
        "The runtime scores a binary tree ensemble with compiled trees checked against ONNX Runtime (models.trees); ONNX Runtime "
        "scores any other model.",
    ]
    return "\n".join(lines) + "\n"


def _spread(t: dict, name: str, spec: str) -> str:
    """A contender's figure: the median, with the lowest and highest of its runs when there were several."""
    return _with_range(t[name], *t.get("spread", {}).get(name, [t[name]] * 2), spec)


def _ratio(result: dict, name: str) -> str:
    median = result["ratios"][name]
    return _with_range(median, *result.get("ratio_spread", {}).get(name, [median] * 2), ".2f", "×")


def _with_range(median: float, low: float, high: float, spec: str, unit: str = "") -> str:
    return f"{median:{spec}}{unit}" if low == high else f"{median:{spec}}{unit} ({low:{spec}}–{high:{spec}})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--out", type=pathlib.Path, default=common.HERE / "results", help="where model.json and model.md go")
    parser.add_argument(
        "--window-seconds",
        type=float,
        default=WINDOW_MS / 1000,
        help="the window of the model's aggregates (3600; a short one holds few records per customer: what the windows cost apart from them)",
    )
    parser.add_argument("--engine", choices=ENGINES, default="kafka", help="the broker started for the run (KAFKA_BOOTSTRAP_SERVERS: a running one)")
    parser.add_argument("--parts", action="store_true", help="instead: each contender's CPU per record by part, in this process (model-parts.md)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the four contenders; the figures are medians over them (3)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat: at least 1 round")
    if args.window_seconds <= 0:
        parser.error("--window-seconds: a positive number of seconds")
    os.environ["BENCH_WINDOW_SECONDS"] = str(args.window_seconds)  # the contenders' window, read when scoring.py is imported

    threshold_cmd = None if args.parts else common.ensure_service()
    sys.path.insert(0, str(common.HERE / "contenders"))
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-model-"))
    values, times, rows = order_records(args.records)
    window_ms = int(args.window_seconds * 1000)
    kinds = {"windowed": "merchants", "one_field": "mean", "fields": None}
    X = {kind: features(rows, times, aggregates, window_ms) for kind, aggregates in kinds.items()}
    uris = {kind: train(X[kind], work / f"{kind}.onnx", f"bench-{kind}") for kind in X}
    alone = {kind: scoring_alone(uris[kind], X[kind]) for kind in X}
    expected = {kind: int((alone[kind].pop("scores") >= THRESHOLD).sum()) for kind in X}
    windowed_uri, fields_uri, expected_windowed, expected_fields = uris["windowed"], uris["fields"], expected["windowed"], expected["fields"]
    above = sum(1 for *_, high in values if high)
    print(
        f"reference: {expected_windowed:,} windowed-model detections, {expected_fields:,} fields-only, {above:,} above the threshold; "
        f"scoring alone {alone['windowed']['runtime']['records_per_s']:,.0f} records/s "
        f"(ONNX Runtime {alone['windowed']['onnx_runtime']['records_per_s']:,.0f})",
        flush=True,
    )

    if args.parts:
        return _parts(args, values, times, uris)
    broker, bootstrap, where = common.broker_for(args.engine)
    print(f"broker {bootstrap} ({where}); contender logs in {work}", flush=True)
    base = clients.base(bootstrap)
    run_id = uuid.uuid4().hex[:6]
    try:
        in_topic = f"bench.{run_id}.model.in"
        clients.create_topics(base, {in_topic: common.PARTITIONS})
        rate = stateful.produce(base, in_topic, values, times)
        print(f"produced {args.records:,} records at {rate:,.0f}/s", flush=True)
        windowed_name = "model detector, 10 features with 3 window aggregates (this project)"
        one_field_name = "model detector, 10 features with count, sum and mean of the amount (this project)"
        fields_name = "model detector, 7 fields, no state (this project)"
        rounds = []
        for n in range(args.repeat):
            # Fresh output topics and consumer groups each round: every run reads the topic from the start.
            prefix = f"bench.{run_id}.m{n}"
            window_s = args.window_seconds
            runs = [
                (model_service("WINDOWED", windowed_name, windowed_uri, bootstrap, in_topic, prefix, "windowed", window_s), expected_windowed),
                (
                    model_service("WINDOWED_ONE_FIELD", one_field_name, uris["one_field"], bootstrap, in_topic, prefix, "one-field", window_s),
                    expected["one_field"],
                ),
                (model_service("FIELDS_ONLY", fields_name, fields_uri, bootstrap, in_topic, prefix, "fields", window_s), expected_fields),
                (stateful.threshold_service(threshold_cmd, bootstrap, in_topic, prefix), above),
            ]
            throughput = []
            for c, expected_count in runs:
                clients.create_topics(base, common.topics_of(c))
                r = common.throughput_run(c, base, c.output_topic, args.records, expected_count, work)
                print(
                    f"round {n + 1}/{args.repeat} throughput {c.name}: {r['records_per_s']:,.0f} records/s, "
                    f"steady CPU {r['steady_cpu_seconds_per_million']:.1f} s per 1M, {r['detections']:,}/{r['expected']:,} detections",
                    flush=True,
                )
                throughput.append(r)
            rounds.append(throughput)
    finally:
        if broker is not None:
            broker.stop()

    per_round = [round_ratios(*throughput, alone["windowed"]) for throughput in rounds]
    ratios = {name: statistics.median(r[name] for r in per_round) for name in per_round[0]}
    spread = {name: [min(r[name] for r in per_round), max(r[name] for r in per_round)] for name in per_round[0]}
    throughput = [medians([rounds[n][i] for n in range(len(rounds))]) for i in range(len(rounds[0]))]
    result = {
        "machine": common.machine(),
        "broker": where,
        "command": " ".join(["python bench/model.py", *(sys.argv[1:] if argv is None else argv)]),
        "params": {
            "records": args.records,
            "population": POPULATION,
            "trees": TREES,
            "threshold": THRESHOLD,
            "window_seconds": args.window_seconds,
            "partitions": common.PARTITIONS,
            "cores": common.CORES,
        },
        "throughput": throughput,
        "scoring_alone": alone,
        "ratios": ratios,
        "ratio_spread": spread,
        "rounds": rounds,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "model.json").write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(result)
    (args.out / "model.md").write_text(table)
    print()
    print(table)
    return 0 if all(t["complete"] for t in throughput) else 1


def round_ratios(windowed: dict, one_field: dict, fields: dict, threshold: dict, alone: dict) -> dict:
    """The targets' ratios of one round's runs."""
    return {
        "throughput_model_to_stateless": common.ratio(windowed["records_per_s"], threshold["records_per_s"]),
        "cpu_model_to_stateless": common.ratio(windowed["steady_cpu_seconds_per_million"], threshold["steady_cpu_seconds_per_million"]),
        "cpu_total_model_to_stateless": common.ratio(windowed["cpu_seconds_per_million"], threshold["cpu_seconds_per_million"]),
        "throughput_one_field_to_stateless": common.ratio(one_field["records_per_s"], threshold["records_per_s"]),
        "cpu_one_field_to_stateless": common.ratio(one_field["steady_cpu_seconds_per_million"], threshold["steady_cpu_seconds_per_million"]),
        "throughput_fields_to_stateless": common.ratio(fields["records_per_s"], threshold["records_per_s"]),
        "scoring_share_of_cpu": common.ratio(alone["runtime"]["cpu_seconds_per_million"], windowed["steady_cpu_seconds_per_million"]),
    }


# A contender's figures that are measured, as medians over its runs (the others are the last run's).
MEASURED = ("records_per_s", "first_detection_s", "peak_memory_bytes", "cpu_seconds_per_million", "steady_cpu_seconds_per_million")


def medians(runs: list[dict]) -> dict:
    """One contender's runs as one: each measured figure's median, with its lowest and highest
    under "spread"; complete only if every run was."""
    out = dict(runs[-1])
    out["complete"] = all(r["complete"] for r in runs)
    out["spread"] = {}
    for name in MEASURED:
        values = [r[name] for r in runs]
        out[name] = statistics.median(values)
        out["spread"][name] = [min(values), max(values)]
    return out


def _parts(args, values: list, times: list[int], uris: dict[str, str]) -> int:
    import parts

    table = parts.main(values, times, uris)
    text = (
        f"# Where a task's CPU goes ({common.machine()['date']})\n\n"
        f"Command: `python bench/model.py --parts{'' if args.window_seconds == WINDOW_MS / 1000 else f' --window-seconds {args.window_seconds:g}'}"
        f"{'' if args.records == 1_000_000 else f' --records {args.records}'}`. {args.records:,} records, one task's "
        f"{parts.TASK_PARTITIONS} partitions of {common.PARTITIONS}, window {args.window_seconds:g} s; a task's work in one process "
        "without Kafka, Spark or the JVM (bench/parts.py). Each part with what it calls, from a profile of the same run.\n\n" + table + "\n"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "model-parts.md").write_text(text)
    print()
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
