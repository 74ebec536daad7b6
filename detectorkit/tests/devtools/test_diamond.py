"""The whole diamond at small size, as `make diamond` runs it: raw records through the normaliser,
two detectors generated from the template, the notifier; counts reconciled through every stage
and equal to what the metrics-aggregator summed. Halfway, a third detector is deployed into the
running diamond (`--join-detector`): it starts at the end of its input and the others go on."""

import json
import pathlib
import subprocess
import sys

from detectorkit.samples import raw_samples

REPO = pathlib.Path(__file__).resolve().parents[3]


def test_the_diamond_reconciles_through_every_stage_and_the_metrics_agree(kafka_bootstrap_servers, tmp_path):
    records, seed = 2_000, 11
    command = [
        sys.executable,
        "-m",
        "detectorkit",
        "diamond",
        "--bootstrap-servers",
        kafka_bootstrap_servers,
        "--records",
        str(records),
        "--rate",
        "400",
        "--seed",
        str(seed),
        "--partitions",
        "2",
        "--no-live",
        "--work",
        str(tmp_path),
        "--template",
        str(REPO),
        "--timeout-seconds",
        "400",
        "--join-detector",
        "--slice-seconds",
        "5",
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["ok"], result["lines"]

    planted = list(raw_samples(records, seed=seed, anomaly_share=0.01, malformed_share=0.02, burst_share=0.002, customers=1_000_000))
    valid = sum(1 for s in planted if s.kind == "valid")
    m = result["metrics"]
    assert m["normaliser"]["detector_records_read_total"] == records
    assert m["normaliser"]["detector_dead_letters_total"] == records - valid
    for detector in ("high-value-orders", "order-bursts"):
        assert m[detector]["detector_records_read_total"] == valid
    assert m["high-value-orders"]["detector_detections_written_total"] == sum(s.anomaly for s in planted)
    assert m["order-bursts"]["detector_detections_written_total"] >= 1
    detections = m["high-value-orders"]["detector_detections_written_total"] + m["order-bursts"]["detector_detections_written_total"]
    assert m["notifier"]["detector_records_read_total"] == detections
    assert result["notifications"] >= 1

    # The third detector read exactly the records normalised after it joined (the feed held at the
    # middle of the planted records), and the first two every record, without a stop.
    valid_after_join = sum(1 for s in planted[records // 2 :] if s.kind == "valid")
    assert m["late-orders"]["detector_records_read_total"] == valid_after_join
    assert m["late-orders"]["detector_detections_written_total"] == sum(s.anomaly for s in planted[records // 2 :])
    assert any("late-orders deployed halfway" in line and line.endswith("yes") for line in result["lines"]), result["lines"]
    assert not result["failed_jobs"]
    # Each job ran as asked: in slices of 5 s.
    for job in ("normaliser", "high-value-orders", "order-bursts", "late-orders", "notifier"):
        started = [json.loads(line) for line in (tmp_path / f"{job}.log").read_text().splitlines() if '"job started"' in line]
        assert started and started[0]["slice_seconds"] == 5.0, (job, started)


def test_the_live_table_shows_each_jobs_counts_and_a_job_that_exited(tmp_path):
    from types import SimpleNamespace

    from rich.console import Console

    from detectorkit.devtools.diamond import Job, summary_table

    def job(name, returncode):
        j = Job(name, [], {}, tmp_path / f"{name}.log")
        j.process = SimpleNamespace(poll=lambda: returncode, returncode=returncode)
        return j

    jobs = [job("aggregator", None), job("normaliser", None), job("high-value-orders", 1)]
    table = {
        "normaliser": {"detector_records_read_total": 12_345, "detector_dead_letters_total": 7, "detector_consumer_lag_records": 3},
        "high-value-orders": {"detector_records_read_total": 100, "detector_detections_written_total": 4},
    }
    console = Console(record=True, width=120)
    console.print(summary_table(table, jobs))
    rows = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
        for line in console.export_text().splitlines()
        if line.count("│") > 2 and "job" not in line
    }
    assert rows["normaliser"] == ["yes", "12,345", "0", "7", "3"]
    assert rows["high-value-orders"] == ["exited 1", "100", "4", "0", "0"]
    assert "aggregator" not in rows  # it serves the table; it is not a row of it
