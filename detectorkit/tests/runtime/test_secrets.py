"""A Kafka password given to a job is nowhere to be read: not in logs, not in the repr of anything that
carries settings, not in Spark's progress, not in a failed job's error."""

import json
import uuid

import pytest
from pydantic import SecretStr

from detectorkit import settings as settings_mod
from detectorkit.kafka import clients
from detectorkit.runtime.job import StreamJob
from detectorkit.samples import samples
from detectorkit.testing import create_test_topics, produce

from ..detectors import THRESHOLD
from ..jobs import wait_for
from .test_job import settings

SECRET = f"s3cret-{uuid.uuid4().hex}"
# Ignored by librdkafka on a PLAINTEXT listener, so the job runs; carried everywhere all the same.
OPTIONS = {"sasl.username": "svc", "sasl.password": SECRET, "ssl.key.password": SECRET}

# Every librdkafka (2.16) property whose value is a secret, and the Java client's that users bring
# along (librdkafka refuses those, after the settings were logged).
SECRET_OPTIONS = [
    "sasl.password",
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.assertion.private.key.pem",
    "sasl.oauthbearer.assertion.private.key.passphrase",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl.keystore.password",
    "sasl.jaas.config",
    "ssl.truststore.password",
]
# Names, paths, URLs and public certificates: what a log must show to tell one setup from another.
NOT_SECRET_OPTIONS = [
    "bootstrap.servers",
    "security.protocol",
    "sasl.mechanism",
    "sasl.username",
    "sasl.kerberos.keytab",
    "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.token.endpoint.url",
    "sasl.oauthbearer.assertion.private.key.file",
    "ssl.key.location",
    "ssl.keystore.location",
    "ssl.ca.location",
    "ssl.ca.pem",
    "ssl.certificate.location",
    "ssl.certificate.pem",
    "ssl.endpoint.identification.algorithm",
    "key.serializer",
]


@pytest.mark.parametrize("key", SECRET_OPTIONS)
def test_every_secret_option_is_masked_by_the_one_list(key):
    conf = clients.base("b:9092", {key: SECRET})
    assert isinstance(conf[key], SecretStr) and SECRET not in repr(conf)
    assert clients.reveal(conf)[key] == SECRET  # only the client constructors see it
    assert settings_mod.redact({key: SECRET}) == {key: "***"}


@pytest.mark.parametrize("key", NOT_SECRET_OPTIONS)
def test_what_is_no_secret_stays_readable(key):
    assert clients.base("b:9092", {key: "shown"})[key] == "shown"
    assert settings_mod.redact({key: "shown"}) == {key: "shown"}


def test_the_password_is_nowhere_to_be_read(spark, kafka_bootstrap_servers, capfd):
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "secrets", partitions=2)
    produce(bs, topics.input, samples(50, bad_every=0))
    job = StreamJob.of(THRESHOLD, settings(bs, topics, starting_offsets="earliest", kafka_options=OPTIONS), spark)
    query = job.start()
    wait_for(lambda: job.stats.records >= 50 or job.terminated(0), what="the job to process records")
    options = job.source_options()
    carriers = [job.settings, options, job._source, job._task, job]
    texts = {f"repr({type(c).__name__})": repr(c) for c in carriers} | {f"str({type(c).__name__})": str(c) for c in carriers}
    texts["progress"] = json.dumps(query.recentProgress, default=str)  # progress objects and UUIDs, as text
    job.stop()
    assert job._source.client_conf["sasl.password"].get_secret_value() == SECRET  # still there for the tasks

    # A job that fails at start: the group has no offsets and STARTING_OFFSETS=error.
    no_offsets = type(topics)(topics.input, topics.output, topics.dlq, f"none-{uuid.uuid4().hex[:6]}")
    failing = StreamJob.of(THRESHOLD, settings(bs, no_offsets, starting_offsets="error", kafka_options=OPTIONS), spark)
    failing.start()
    wait_for(lambda: failing.terminated(0.2), what="the failing job to end")
    failing.close()
    texts["job error"] = failing.error()
    assert failing.error().startswith("NoCommittedOffsetsError")

    captured = capfd.readouterr()
    texts["logs"] = captured.out + captured.err
    leaks = [where for where, text in texts.items() if SECRET in text]
    assert not leaks, f"the secret is printed in: {', '.join(leaks)}"
    assert "svc" in texts["repr(SourceOptions)"]  # the rest of the configuration is still there to read
