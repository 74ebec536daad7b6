"""Backtests: a detector over history gives what the live service wrote for the same records."""

import collections
import json
import pathlib
import re
import subprocess
import sys
import time

import pandas as pd
import pytest

from detectorkit import backtest
from detectorkit.kafka import clients
from detectorkit.testing import DetectorHarness, Sample, create_test_topics, produce, read_all

from ..detectors import BURST, FIELD_BURST, REFUSING, SESSIONS, THRESHOLD, Config
from ..jobs import committed, job_env, run
from ..models.spending import one_pass, spending, spending_model

T0 = 1_795_000_000_000
# Where `python -m detectorkit` finds tests.detectors.
ROOT = pathlib.Path(__file__).resolve().parents[2]


def lines(tmp_path, rows, name="records.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_files_give_detections_dead_letters_and_the_labels_precision_and_recall(tmp_path):
    rows = [
        {"id": "r-0", "customer": "c-1", "amount": 5000.0},  # flagged, labelled
        {"id": "r-1", "customer": "c-2", "amount": 10.0},  # labelled, missed
        '{"id": "r-2", "amount": ',  # not JSON: a dead letter
        {"id": "r-3", "customer": "c-3"},  # no amount: a dead letter
        {"id": "r-4", "customer": "c-4", "amount": 2000.0},  # flagged, not labelled
        {"id": "r-5", "customer": "c-5", "amount": 3000.0},  # flagged, labelled
    ]
    history = backtest.from_files([lines(tmp_path, rows)], key_field="customer")
    result = backtest.run(THRESHOLD, history, Config())
    assert [(d["source"]["offset"], d["detection"]["amount"]) for d in result.detections] == [(0, 5000.0), (4, 2000.0), (5, 3000.0)]
    assert result.dead_letters == {"malformed_json": 1, "missing_field": 1}
    by_uri = backtest.run(THRESHOLD, backtest.from_files([pathlib.Path(tmp_path / "records.jsonl").as_uri()], key_field="customer"), Config())
    assert by_uri.detections == [{**d, "source": {**d["source"], "topic": by_uri.detections[0]["source"]["topic"]}} for d in result.detections]
    labels = tmp_path / "labels.txt"
    labels.write_text("id\nr-0\nr-1\nr-5\n")
    summary = backtest.summarise(result, backtest.read_labels(str(labels)))
    score = summary.score
    assert (score.labelled, score.flagged, score.both) == (3, 3, 2)
    assert score.precision == pytest.approx(2 / 3) and score.recall == pytest.approx(2 / 3)
    assert summary.records == 6 and summary.top_keys[0][1] == 1
    assert any("precision 0.667, recall 0.667" in line for line in summary.lines())


def test_a_window_rule_over_files_answers_as_the_harness_does_in_one_pass(tmp_path):
    rows = [{"id": f"r-{i}", "customer": f"c-{i % 3}", "ts": T0 + 7_000 * i} for i in range(60)]
    history = backtest.from_files([lines(tmp_path, rows)], key_field="customer", time_field="ts", partitions=2)
    result = backtest.run(BURST, history)
    found = sorted((d["source"]["key"], d["source"]["timestamp_ms"]) for d in result.detections)
    harness = DetectorHarness(BURST, partitions=2)
    frame = pd.DataFrame({"key": [r["customer"] for r in rows], "event_time": pd.to_datetime([r["ts"] for r in rows], unit="ms", utc=True)})
    one_pass = harness.run([frame.iloc[[i]] for i in range(len(frame))])
    assert found == sorted((row["key"], int(row["window_end_ms"])) for _, row in one_pass.iterrows())
    assert len(found) > 3  # the test means something: bursts of every customer


def test_a_dataframe_is_a_history_for_a_notebook():
    records = pd.DataFrame({"key": ["c-1"] * 4, "event_time": pd.to_datetime([T0, T0 + 1_000, T0 + 2_000, T0 + 3_000], unit="ms", utc=True)})
    result = backtest.run(BURST, backtest.from_frame(records))
    assert [d["source"]["offset"] for d in result.detections] == [2]  # the third record within 60 s
    assert backtest.summarise(result).detections == 1


def test_bad_input_is_one_line_each(tmp_path):
    with pytest.raises(backtest.HistoryError, match="cannot read .*missing.jsonl"):
        backtest.from_files([str(tmp_path / "missing.jsonl")])
    wrong = tmp_path / "labels.csv"
    wrong.write_text("record,label\nr-1,1\n")
    with pytest.raises(backtest.HistoryError, match="must begin with a header line 'id' or 'key'"):
        backtest.read_labels(str(wrong))
    wrong.write_text("id\nr-1,1\n")
    with pytest.raises(backtest.HistoryError, match="one value a line"):
        backtest.read_labels(str(wrong))


def cli(*args, env=None):
    done = subprocess.run(
        [sys.executable, "-m", "detectorkit", "backtest", *args], capture_output=True, text=True, timeout=300, env=env, cwd=str(ROOT)
    )
    return done.returncode, done.stdout, done.stderr


def test_the_command_writes_detections_and_prints_a_summary(tmp_path):
    rows = [{"id": f"r-{i}", "customer": "c-1", "amount": 500.0 * i} for i in range(5)]
    out = tmp_path / "found.parquet"
    code, stdout, stderr = cli(
        "--detector", "tests.detectors:THRESHOLD", "--files", lines(tmp_path, rows), "--key-field", "customer", "--out", str(out)
    )
    assert code == 0, stderr
    assert re.search(r"5 records read in [0-9.]+ s \([0-9,]+ records/s\), 2 detections, 0 dead letters", stdout), stdout
    assert "backtest: 5 of 5 records (100%)" in stderr  # not a terminal: progress as lines
    assert pd.read_parquet(out)["offset"].tolist() == [3, 4]
    code, _, stderr = cli("--detector", "tests.detectors:THRESHOLD", "--files", "nowhere.jsonl", "--out", str(out))
    assert code == 2 and stderr.count("\n") == 1 and "cannot read nowhere.jsonl" in stderr
    code, _, stderr = cli("--detector", "tests.detectors:THRESHOLD", "--files", "x.jsonl", "--out", str(tmp_path / "found.csv"))
    assert code == 2 and "--out must end in .parquet or .jsonl" in stderr


def records(count):
    """Twenty customers' records (every 25th not JSON), some above the threshold: bursts and amounts."""
    made = []
    for i in range(count):
        customer = f"c-{i % 20}"
        value = json.dumps({"id": f"r-{i}", "customer": customer, "amount": 400.0 * (i % 5)}).encode()
        made.append(Sample(customer.encode(), b'{"id": ' if i % 25 == 24 else value, "malformed_json" if i % 25 == 24 else "valid"))
    return made


def identity(d):
    """A detection by where it came from: a record's offset, or a timer's key and time."""
    source = d["source"]
    return (source["partition"], source.get("offset"), source.get("key"), source.get("timer_ms"), json.dumps(d["detection"], sort_keys=True))


def live_detections(bs, topics):
    return collections.Counter(identity(json.loads(m["value"])) for m in read_all(bs, topics.output))


@pytest.mark.parametrize("detector", ["THRESHOLD", "BURST"])
def test_a_backtest_over_a_kafka_range_equals_what_the_live_service_wrote_and_moves_no_offset(kafka_bootstrap_servers, tmp_path, detector):
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, f"backtest-{detector.lower()}", partitions=2)
    sent = produce(bs, topics.input, records(600))
    env = job_env(bs, topics, starting_offsets="earliest", stop_after_idle_seconds=3, max_records_per_batch=50)
    code, output = run(env, command=[sys.executable, "-m", "detectorkit", "run", "--detector", f"tests.detectors:{detector}"])
    assert code == 0, output
    live = live_detections(bs, topics)
    assert sum(live.values()) > 10  # the test means something
    before = committed(bs, topics, [0, 1])

    history = backtest.from_kafka(clients.base(bs), topics.input)
    assert history.records == len(sent)
    from .. import detectors

    result = backtest.run(getattr(detectors, detector), history)
    assert collections.Counter(identity(d) for d in result.detections) == live
    assert sum(result.dead_letters.values()) == len([s for s in sent if s.sample.kind != "valid"])
    assert committed(bs, topics, [0, 1]) == before

    # The command, over the first half of each partition, and past the end: one line.
    half = {p: (e - s) // 2 for p, (s, e) in history.ranges.items()}
    out = tmp_path / "half.jsonl"
    to = ",".join(f"{p}={o}" for p, o in half.items())
    code, stdout, stderr = cli("--detector", f"tests.detectors:{detector}", "--to", to, "--out", str(out), env=env)
    assert code == 0, stderr
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert {(d["source"]["partition"], d["source"]["offset"]) for d in written} == {(p, o) for p, o, *_ in live if o < half[p]}
    past = ",".join(f"{p}={e + 5}" for p, (_, e) in history.ranges.items())
    code, _, stderr = cli("--detector", f"tests.detectors:{detector}", "--to", past, "--out", str(out), env=env)
    assert code == 2 and stderr.count("\n") == 1 and "is past the end of" in stderr, stderr
    assert committed(bs, topics, [0, 1]) == before


def sessions(blocks=6, customers=20):
    """Each customer's records in blocks 10 s long and 120 s apart, a little out of order within the
    grace: a session per block, closed by the next block's records (an event-time timer). Then a
    record of each customer half an hour from now (brokers refuse more than an hour ahead): it closes
    the last block's sessions and opens one that neither live (the wall clock does not reach it in
    the test's time) nor the backtest closes."""
    made = []
    for block in range(blocks):
        for i in range(100):
            customer = f"c-{i % customers}"
            ms = T0 + block * 120_000 + i * 100 + (2_000 if i % 7 == 3 else 0)
            value = json.dumps({"id": f"r-{block}-{i}", "customer": customer, "amount": float(i % 9)}).encode()
            bad = i % 25 == 24
            made.append(Sample(customer.encode(), b"[" if bad else value, "malformed_json" if bad else "valid", timestamp_ms=ms))
    later = int(time.time() * 1000) + 1_800_000
    for c in range(customers):
        value = json.dumps({"id": f"last-{c}", "customer": f"c-{c}", "amount": 1.0}).encode()
        made.append(Sample(f"c-{c}".encode(), value, "valid", timestamp_ms=later))
    return made


def test_a_backtest_fires_the_event_time_timers_the_live_service_fired_and_names_the_rest(kafka_bootstrap_servers, tmp_path):
    """Session windows emitted when they close (Final): detections from timers, not from records."""
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "backtest-sessions", partitions=2)
    produce(bs, topics.input, sessions())
    env = job_env(bs, topics, starting_offsets="earliest", stop_after_idle_seconds=3, max_records_per_batch=40)
    code, output = run(env, command=[sys.executable, "-m", "detectorkit", "run", "--detector", "tests.detectors:SESSIONS"])
    assert code == 0, output
    live = live_detections(bs, topics)
    assert sum(live.values()) == 6 * 20 and all(offset is None for _, offset, *_ in live)  # every block's session, by timer

    result = backtest.run(SESSIONS, backtest.from_kafka(clients.base(bs), topics.input))
    assert collections.Counter(identity(d) for d in result.detections) == live
    assert result.pending_timers == 20  # the sessions opened half an hour from now: neither side closed them
    code, stdout, stderr = cli("--detector", "tests.detectors:SESSIONS", "--out", str(tmp_path / "found.jsonl"), env=env)
    assert code == 0, stderr
    assert "20 timer(s) were pending when the history ended" in stdout


def test_a_services_own_command_takes_backtest_as_its_first_word(tmp_path, capsys):
    """`<service> backtest ...`: a baked service's script calls run_detector with its argv."""
    from detectorkit.cli.run import run_detector

    rows = [{"id": f"r-{i}", "customer": "c-1", "amount": 700.0 * i} for i in range(3)]
    out = tmp_path / "found.jsonl"
    assert run_detector(THRESHOLD, ["backtest", "--files", lines(tmp_path, rows), "--out", str(out)], defaults={"input_topic": "orders"}) == 0
    assert re.search(r"3 records read in .* 1 detections", capsys.readouterr().out)
    assert [json.loads(line)["detection"]["amount"] for line in out.read_text().splitlines()] == [1400.0]


def test_files_are_keyed_and_timed_by_the_detectors_own_fields_unless_told_otherwise(tmp_path, capsys):
    from detectorkit.cli.run import run_detector

    rows = [{"id": f"r-{i}", "customer": f"c-{i % 2}", "ts": T0 + 10_000 * i} for i in range(8)]
    out = tmp_path / "found.jsonl"
    assert run_detector(FIELD_BURST, ["backtest", "--files", lines(tmp_path, rows), "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "8 records read" in printed and ", 2 detections, 0 dead letters" in printed  # keyed by customer: no missing_field
    assert "per hour: 2026-11-18T11:00Z 2" in printed  # by ts, not a timestamp of 0 (1970)


def test_a_detector_that_raises_shows_its_first_traceback_once(tmp_path, capsys):
    from detectorkit.cli.run import run_detector

    rows = [{"id": f"r-{i}", "customer": "c-1", "amount": -1.0 if i % 3 == 0 else 1.0} for i in range(9)]
    assert run_detector(REFUSING, ["backtest", "--files", lines(tmp_path, rows), "--out", str(tmp_path / "f.jsonl"), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "the detector raised on 3 record(s) or timer(s) (dead letters, detector_error); the first:" in printed
    assert printed.count("Traceback (most recent call last)") == 1 and "ValueError: a negative amount" in printed


def test_diff_matches_windows_of_one_key_that_overlap_and_says_so():
    """A burst found one record sooner (a lower threshold) is the same burst: one in both, not one in each."""
    minute = 60_000

    def found(key, start, end, offset):
        return {
            "service": "s",
            "detection": {"key": key, "window_start_ms": start, "window_end_ms": end},
            "source": {"partition": 0, "offset": offset, "timestamp_ms": end, "key": key},
        }

    a = [found("c-1", T0, T0 + 10 * minute, 5), found("c-1", T0 + 60 * minute, T0 + 70 * minute, 40), found("c-2", T0, T0 + minute, 7)]
    b = [found("c-1", T0 - minute, T0 + 9 * minute, 4), found("c-2", T0 + 5 * minute, T0 + 6 * minute, 9), detection(0, 3, T0)]
    diff = backtest.compare(a, b)
    assert diff.totals() == {"only_a": 2, "only_b": 2, "both": 1}
    assert diff.lines()[-1] == "compared: 5 by key and overlapping window, 1 by source record or timer"


def detection(partition, offset, ms, timer_key=None):
    source = {"topic": "in", "partition": partition, "timestamp_ms": ms}
    source |= {"key": timer_key, "timer_ms": ms} if timer_key else {"offset": offset}
    return {"service": "s", "detection": {"rule": "r"}, "source": source}


def test_diff_of_two_known_detection_sets_counts_only_a_only_b_and_both_per_hour(tmp_path):
    hour = 3_600_000
    a = [detection(0, 1, T0), detection(0, 2, T0), detection(1, 7, T0 + hour), detection(0, -1, T0 + 2 * hour, timer_key="c-1")]
    b = [detection(0, 2, T0 + 5), detection(1, 7, T0 + hour), detection(1, 9, T0 + hour), detection(0, -1, T0 + 2 * hour, timer_key="c-2")]
    path_a = lines(tmp_path, a, "a.jsonl")
    # B as a backtest's Parquet table, A as its JSON lines: either reads back the same.
    table = backtest.Backtest("s", detections=b, record_ids=[None] * len(b)).frame()
    table.to_parquet(tmp_path / "b.parquet", index=False)
    found = backtest.compare(backtest.diff.load(path_a), backtest.diff.load(str(tmp_path / "b.parquet")))
    assert found.totals() == {"only_a": 2, "only_b": 2, "both": 2}
    hours = list(found.hours.values())
    assert hours == [{"only_a": 1, "only_b": 0, "both": 1}, {"only_a": 0, "only_b": 1, "both": 1}, {"only_a": 1, "only_b": 1, "both": 0}]
    png = tmp_path / "diff.png"
    done = subprocess.run(
        [sys.executable, "-m", "detectorkit", "diff", path_a, str(tmp_path / "b.parquet"), "--png", str(png)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("total")] == [["2", "2", "2"]]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    done = subprocess.run(
        [sys.executable, "-m", "detectorkit", "diff", path_a, str(tmp_path / "nothing.jsonl")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "cannot read detections from" in done.stderr


def test_a_candidate_model_shadows_the_live_one_and_diff_tells_them_apart(kafka_bootstrap_servers, tmp_path):
    """Version 2 of a model with window features as a shadow: its own group and topics, the live
    ones untouched, each version's detections those of one pass, told apart record by record."""
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "shadow", partitions=2)
    sent = produce(bs, topics.input, spending(400))
    live, candidate = spending_model(tmp_path / "live.onnx"), spending_model(tmp_path / "candidate.onnx", amount=500, version="2")
    command = [sys.executable, "-m", "detectorkit", "run", "--detector", "tests.detectors:MODEL"]
    env = job_env(bs, topics, starting_offsets="earliest", stop_after_idle_seconds=3, detector_model_uri=live)
    code, output = run(env, command=command)
    assert code == 0, output
    before = committed(bs, topics, [0, 1])
    code, output = run({**env, "SHADOW": "true", "CREATE_TOPICS": "true", "DETECTOR_MODEL_URI": candidate}, command=command)
    assert code == 0, output
    assert committed(bs, topics, [0, 1]) == before  # the live group's offsets: the shadow reads in <group>.shadow

    shadow = [json.loads(m["value"]) for m in read_all(bs, f"{topics.output}.shadow")]
    assert {d["service"] for d in shadow} == {"test-model-shadow"} and {d["detection"]["model_version"] for d in shadow} == {"2"}
    png = tmp_path / "diff.png"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "detectorkit",
            "diff",
            f"topic:{topics.output}",
            f"topic:{topics.output}.shadow",
            "--service",
            "test-model",
            "--png",
            str(png),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=str(ROOT),
    )
    assert done.returncode == 0, done.stderr
    total = next(line.split()[1:] for line in done.stdout.splitlines() if line.startswith("total"))
    (a, _), (b, _) = one_pass(sent, live), one_pass(sent, candidate)
    assert total == [str(len(a - b)), str(len(b - a)), str(len(a & b))] and len(b - a) > 0 and len(a & b) > 0


def test_a_backtest_on_spark_answers_as_one_in_this_process(kafka_bootstrap_servers, spark):
    """A task per partition, in Spark's Python workers: the same detections and dead letters."""
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "backtest-spark", partitions=3)
    produce(bs, topics.input, records(900))
    conf = clients.base(bs)
    here = backtest.run(BURST, backtest.from_kafka(conf, topics.input))
    history = backtest.from_kafka(conf, topics.input)
    there = backtest.run_on_spark(spark, BURST, history, kafka=(conf, "auto", 30.0))

    def found(result):
        return sorted((d["source"]["partition"], d["source"]["offset"], json.dumps(d["detection"], sort_keys=True)) for d in result.detections)

    assert found(there) == found(here) and len(found(here)) > 10
    assert (there.records, there.dead_letters) == (here.records, here.dead_letters) == (900, {"malformed_json": 36})


def test_files_read_by_spark_from_a_uri_answer_as_one_pass_in_this_process(tmp_path, spark):
    """Spark reads the files (a glob of JSON lines whose larger file Spark would take first, and a
    Parquet file of many row groups, all as file:// URIs), each split a task of its own; the
    partitions' records still run in file order: the same sessions, late records, dead letters,
    offsets and pending timers as `run` over the same files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from detectorkit.backtest.spark_files import run_files_on_spark

    def rows(count, first):
        # Ten customers, a second between records and two quiet minutes after every hundred (the
        # sessions close); every 7th record a minute late (past the grace).
        def ts(n):
            return T0 + 1_000 * n + 120_000 * (n // 100) - (60_000 if n % 7 == 6 else 0)

        return [{"id": f"r-{n}", "customer": f"c-{n % 10}", "amount": float(n % 13), "ts": ts(n)} for n in range(first, first + count)]

    folder = tmp_path / "history"
    folder.mkdir()
    small, large = rows(300, 0), rows(3_000, 300)
    lines(folder, small, "a.jsonl")
    lines(folder, [*large[:1_000], '{"id": "torn", "amount": ', *large[1_000:]], "b.jsonl")
    later = rows(2_000, 3_300)
    frame = pd.DataFrame(later).assign(ts=lambda f: pd.to_datetime(f["ts"], unit="ms", utc=True))
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp_path / "c.parquet", row_group_size=100, coerce_timestamps="ms")
    fields = {"key_field": "customer", "time_field": "ts", "partitions": 3}
    here = backtest.run(SESSIONS, backtest.from_files([str(folder / "a.jsonl"), str(folder / "b.jsonl"), str(tmp_path / "c.parquet")], **fields))

    spark.conf.set("spark.sql.files.maxPartitionBytes", "16384")
    try:
        there = run_files_on_spark(spark, SESSIONS, [f"file://{folder}/*.jsonl", f"file://{tmp_path}/c.parquet"], **fields)
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")

    def found(result):
        return sorted(
            (d["source"]["partition"], d["source"].get("offset", -1), d["source"].get("timer_ms", -1), json.dumps(d["detection"], sort_keys=True))
            for d in result.detections
        )

    assert found(there) == found(here) and len(found(here)) > 100
    assert (there.records, there.dead_letters, there.pending_timers) == (here.records, here.dead_letters, here.pending_timers)
    assert here.records == 5_301 and here.dead_letters == {"malformed_json": 1} and here.pending_timers == 10
    with pytest.raises(backtest.HistoryError, match=r"^cannot read file:///nowhere/\*\.jsonl: .*PATH_NOT_FOUND") as raised:
        run_files_on_spark(spark, SESSIONS, ["file:///nowhere/*.jsonl"])
    assert "\n" not in str(raised.value)
