import os
import pathlib

import pytest

HERE = pathlib.Path(__file__).parent

# Spark's Python workers import the test detectors by name; they inherit this from the driver.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), os.environ.get("PYTHONPATH")) if p)

# The lanes, lightest first. A test's lane is the heaviest of what its fixtures start, what
# STARTS_ITS_OWN says and its own marker; `make test-fast` runs the unit lane alone, so a test
# left there by mistake costs every developer its broker or Spark.
LANES = ("unit", "kafka", "e2e")
# A Schema Registry is a server the tests start like a broker, and goes in the same lane.
BROKER_FIXTURES = {"kafka_broker", "kafka_bootstrap_servers", "kafka_broker_kind", "transactional_kafka", "schema_registry"}

# What the fixtures cannot tell: tests that start a broker, a Spark session or a job process
# themselves. "path" is every test of the module, "path::name" one test (all its parameters).
STARTS_ITS_OWN = {
    # Brokers: the embedded one and `detectorkit broker`.
    "devtools/test_broker.py::test_starts_on_a_free_loopback_port_and_stops": "kafka",
    "devtools/test_broker.py::test_two_brokers_side_by_side": "kafka",
    "devtools/test_broker.py::test_a_taken_port_is_a_clear_error": "kafka",
    "devtools/test_broker.py::test_command_prints_the_address_creates_topics_and_stops_on_sigterm": "kafka",
    "devtools/test_broker.py::test_kafka_engine_keeps_its_log_and_address_across_restarts_on_a_data_dir": "kafka",
    # Job and service processes (tests/jobs.py, `detectorkit diamond`, the scripts), a Spark
    # cluster, a service's Spark session in a process of its own.
    "backtest/test_backtest.py::test_a_backtest_over_a_kafka_range_equals_what_the_live_service_wrote_and_moves_no_offset": "e2e",
    "backtest/test_backtest.py::test_a_candidate_model_shadows_the_live_one_and_diff_tells_them_apart": "e2e",
    "backtest/test_backtest.py::test_a_backtest_fires_the_event_time_timers_the_live_service_fired_and_names_the_rest": "e2e",
    "devtools/test_cluster.py": "e2e",
    "devtools/test_diamond.py::test_the_diamond_reconciles_through_every_stage_and_the_metrics_agree": "e2e",
    "metrics/test_aggregator_service.py": "e2e",
    "metrics/test_metrics_e2e.py::test_two_instances_aggregate_across_stop_restart_and_aggregator_restart": "e2e",
    "metrics/test_metrics_e2e.py::test_every_dashboard_panel_returns_data_from_a_real_prometheus": "e2e",
    "roles/test_normaliser_job.py": "e2e",
    "roles/test_notifier_job.py": "e2e",
    "runtime/test_exactly_once.py": "e2e",
    "runtime/test_jvm.py::test_a_built_archive_is_mapped_by_a_services_jvm_and_a_broken_one_is_ignored": "e2e",
    "runtime/test_on_kafka.py": "e2e",
    "runtime/test_restart.py": "e2e",
    "runtime/test_repartition.py::test_a_rule_keyed_by_a_field_answers_exactly_once_through_kill_9s_in_either_reader": "e2e",
    "runtime/test_slices.py::test_a_rebalance_mid_slice_hands_partitions_over_after_the_slices_checkpoint": "e2e",
    "runtime/test_scaling.py": "e2e",
    "state/test_state_on_kafka.py::test_kill_9_replays_the_uncommitted_batch_from_the_state_the_offsets_reflect": "e2e",
}


def _check_starts_its_own(modules):
    """A renamed test or module would otherwise drop silently into the unit lane."""
    for key in STARTS_ITS_OWN:
        path, _, name = key.partition("::")
        if not (HERE / path).is_file():
            raise pytest.UsageError(f"conftest.STARTS_ITS_OWN names {path}, which is gone")
        module = modules.get(path)
        if name and module is not None and not hasattr(module, name):
            raise pytest.UsageError(f"conftest.STARTS_ITS_OWN names {key}, which is gone")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these markers
def pytest_collection_modifyitems(items):
    modules = {}
    for item in items:
        if not item.path.is_relative_to(HERE):
            continue
        path = item.path.relative_to(HERE).as_posix()
        if getattr(item, "module", None) is not None:
            modules.setdefault(path, item.module)
        fixtures = set(item.fixturenames)
        name = getattr(item, "originalname", item.name)
        reasons = {
            "the spark fixture": "e2e" if "spark" in fixtures else None,
            "a broker fixture": "kafka" if fixtures & BROKER_FIXTURES else None,
            "conftest.STARTS_ITS_OWN": STARTS_ITS_OWN.get(f"{path}::{name}", STARTS_ITS_OWN.get(path)),
        }
        marked = {m.name for m in item.iter_markers() if m.name in LANES}
        if len(marked) > 1:
            raise pytest.UsageError(f"{item.nodeid} is marked {' and '.join(sorted(marked))}: a test has one lane")
        lane = max([*marked, *(v for v in reasons.values() if v), "unit"], key=LANES.index)
        if marked and marked != {lane}:
            why = next(k for k, v in reasons.items() if v == lane)
            raise pytest.UsageError(f"{item.nodeid} is marked {marked.pop()}, but {why} puts it in {lane}")
        if not marked:
            item.add_marker(lane)
    _check_starts_its_own(modules)


@pytest.fixture(scope="session")
def spark():
    """One SparkSession for the whole run: starting one costs about 5 s."""
    from detectorkit.runtime.spark import session

    spark = session("local[2]", "detectorkit-tests")
    yield spark
    spark.stop()


@pytest.fixture
def transactional_kafka(kafka_broker):
    """The tests' broker, for a test of transactions: skipped on the embedded broker, whose
    read_committed shows aborted records (and where exactly-once is refused)."""
    from detectorkit.testing import TANSU

    bootstrap, kind = kafka_broker
    if kind == TANSU:
        pytest.skip("transactions are proven on Apache Kafka")
    return bootstrap
