"""`detectorkit produce`: a file's records on a topic, each keyed and timed by its fields."""

import json
import uuid

import pandas as pd

from detectorkit.cli.produce import produce_main
from detectorkit.testing import read_all

T0 = 1_795_000_000_000


def test_json_lines_and_parquet_go_on_a_topic_keyed_and_timed_by_their_fields(kafka_bootstrap_servers, tmp_path, capsys):
    rows = [{"id": f"r-{i}", "card": f"k-{i % 3}", "ts": pd.Timestamp(T0 + 1000 * i, unit="ms", tz="UTC").isoformat()} for i in range(5)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    pd.DataFrame(rows[3:]).to_parquet(tmp_path / "b.parquet")
    topic = f"produce.{uuid.uuid4().hex[:8]}"
    files = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.parquet")]
    argv = ["--files", *files, "--topic", topic, "--key-field", "card", "--time-field", "ts", "--bootstrap-servers", kafka_bootstrap_servers]
    assert produce_main([*argv, "--create", "--partitions", "1"]) == 0
    assert json.loads(capsys.readouterr().out) == {"topic": topic, "produced": 5, "files": files}
    got = read_all(kafka_bootstrap_servers, topic)
    assert [(m["key"], m["timestamp_ms"], json.loads(m["value"])["id"]) for m in got] == [(f"k-{i % 3}", T0 + 1000 * i, f"r-{i}") for i in range(5)]


def test_a_record_without_its_time_or_key_is_refused_in_one_line_before_anything_is_written(kafka_bootstrap_servers, tmp_path, capsys):
    (tmp_path / "a.jsonl").write_text(json.dumps({"card": "k-1", "ts": T0}) + "\n" + json.dumps({"card": "k-2", "ts": "yesterday"}) + "\n")
    topic = f"produce.{uuid.uuid4().hex[:8]}"
    base = ["--files", str(tmp_path / "a.jsonl"), "--topic", topic, "--bootstrap-servers", kafka_bootstrap_servers]
    assert produce_main([*base, "--time-field", "ts"]) == 2
    assert capsys.readouterr().err.strip() == "error: 1 record(s) have no time in 'ts' (epoch ms or ISO 8601), the first at record 2"
    assert produce_main([*base, "--key-field", "customer"]) == 2
    assert "have no 'customer', the first at record 1" in capsys.readouterr().err
