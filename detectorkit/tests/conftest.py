import os
import pathlib

import pytest

HERE = pathlib.Path(__file__).parent

# Spark's Python workers import the test detectors by name; they inherit this from the driver.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), os.environ.get("PYTHONPATH")) if p)


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
