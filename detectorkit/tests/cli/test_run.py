"""run_detector, the start path every service takes: its settings, then the job."""

import signal

import pytest
import structlog

from detectorkit.cli import run as run_mod
from detectorkit.runtime.job import StreamJob
from detectorkit.settings import Settings

from ..detectors import THRESHOLD


class Started(Exception):
    """Raised where the job would join its group: the start path is complete."""


class NoSpark:
    def stop(self):
        pass


def test_the_start_path_specialises_the_settings_once(monkeypatch):
    calls = []
    for_service = Settings.for_service

    def counted(self, service):
        calls.append(service)
        return for_service(self, service)

    jobs = []

    def start(job):
        jobs.append(job)
        raise Started

    monkeypatch.setattr(Settings, "for_service", counted)
    monkeypatch.setattr(StreamJob, "start", start)
    monkeypatch.setattr(run_mod, "check_kafka", lambda settings: None)
    # No Spark, and this process keeps its own logging and signal handlers.
    monkeypatch.setattr("detectorkit.runtime.spark.session", lambda *args, **kwargs: NoSpark())
    monkeypatch.setattr(run_mod, "_start_session", lambda detector, settings: None)
    monkeypatch.setattr("detectorkit.runtime.shipping.stage_packages", lambda stage: [])
    monkeypatch.setattr(run_mod.logs, "setup", lambda *args, **kwargs: structlog.get_logger("test"))
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9")

    with pytest.raises(Started):
        run_mod.run_detector(THRESHOLD, [])
    assert calls == [THRESHOLD.name]
    assert (jobs[0].settings.consumer_group, jobs[0].settings.dlq_topic) == (THRESHOLD.name, f"{THRESHOLD.name}.dlq")


def test_a_record_format_the_stage_cannot_read_stops_it_before_anything_starts(monkeypatch, capsys):
    from detectorkit.roles.notifier import Notifier

    monkeypatch.setattr(run_mod, "check_kafka", lambda settings: pytest.fail("the broker was checked"))
    monkeypatch.setattr(run_mod, "_start_session", lambda detector, settings: None)  # no JVM in the test's process
    monkeypatch.setenv("RECORD_FORMAT", "avro")
    monkeypatch.setenv("SCHEMA_REGISTRY_URL", "http://registry:8081")
    assert run_mod.run_detector(Notifier(), []) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == ["error: the notifier reads JSON records only: unset RECORD_FORMAT (or set it to json)"]


def test_a_local_session_starts_with_the_settings_before_the_broker_is_checked(monkeypatch):
    """The JVM and the session start on their own thread as soon as the settings are read, so the
    stage's imports and the Kafka checks run beside them; the job is handed that session."""
    order = []
    started = NoSpark()

    def start_session(detector, settings):
        order.append(("session", settings.spark_master))
        return started

    def start(job):
        order.append(("job", job._spark))
        raise Started

    monkeypatch.setattr(run_mod, "_start_session", start_session)
    monkeypatch.setattr(run_mod, "check_kafka", lambda settings: order.append(("check_kafka", None)))
    monkeypatch.setattr(StreamJob, "start", start)
    monkeypatch.setattr(run_mod.logs, "setup", lambda *args, **kwargs: structlog.get_logger("test"))
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9")
    with pytest.raises(Started):
        run_mod.run_detector(THRESHOLD, ["--spark-master", "local[1]"])
    assert order == [("session", "local[1]"), ("check_kafka", None), ("job", started)]


@pytest.mark.parametrize("master", ["spark://cluster:7077", None])
def test_a_clusters_session_and_spark_submits_are_not_started_early(monkeypatch, master):
    """A cluster's session ships the stage's packages, and spark-submit's runs already: both are
    left to the job's start."""
    monkeypatch.setattr(run_mod, "_spark_master", lambda settings: master)
    assert run_mod._start_session(THRESHOLD, Settings()) is None
