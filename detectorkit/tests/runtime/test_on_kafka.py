"""What only Apache Kafka can show: security, transactions, DeleteRecords, offset retention, a broker
restart, and Kafka's own tools reading the job's group. Each scenario runs the job as a process."""

import collections
import json
import os
import re
import signal
import sys
import uuid
from types import SimpleNamespace

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

from detectorkit.devtools.kafka_broker import KafkaBroker, run_tool
from detectorkit.kafka import clients
from detectorkit.kafka.offset_store import OffsetStore
from detectorkit.pytest_plugin import _kafka_can_start
from detectorkit.samples import samples
from detectorkit.testing import CONTAINER, EXTERNAL, KAFKA, create_test_topics, produce, read_all

from ..jobs import Job, committed, job_env, job_settings, run, wait_for

needs_own_broker = pytest.mark.skipif(not _kafka_can_start(), reason="starting Apache Kafka needs Java and Maven (or the cached jars)")


@pytest.fixture
def real_kafka(kafka_broker):
    if kafka_broker[1] not in (KAFKA, CONTAINER, EXTERNAL):
        pytest.skip(f"needs Apache Kafka, the tests run on {kafka_broker[1]}")
    return kafka_broker[0]


def detections(bs, topic):
    values = [json.loads(m["value"]) for m in read_all(bs, topic)]
    return collections.Counter((v["source"]["partition"], v["source"]["offset"]) for v in values)


def expected(sent):
    return {(s.partition, s.offset) for s in sent if s.sample.kind == "valid" and s.sample.amount > 1000}


def error_lines(output):
    return [line for line in output.splitlines() if line.startswith("error:")]


# ---- security -----------------------------------------------------------------------------------

PASSWORD = f"pw-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def secured_kafka():
    """A second broker with ACLs on, a SASL/PLAIN listener (user "svc") and a TLS listener that
    requires a client certificate (its CA issues them); no user is granted anything."""
    if not _kafka_can_start():
        pytest.skip("starting Apache Kafka needs Java and Maven (or the cached jars)")
    with KafkaBroker(sasl_users={"svc": PASSWORD}, tls_clients=True, authorizer=True, heap="512m") as broker:
        yield broker


def sasl_env(broker, topics, password, **settings):
    env = job_env(broker.sasl_bootstrap_servers, topics, connect_timeout_seconds=10, **settings)
    env.update(
        {"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_MECHANISM": "PLAIN", "KAFKA_SASL_USERNAME": "svc", "KAFKA_SASL_PASSWORD": password}
    )
    return env


def test_wrong_password_is_one_clear_line_and_the_secret_is_nowhere(secured_kafka):
    topics = create_test_topics(secured_kafka.bootstrap_servers, "sasl", partitions=1)
    wrong = f"wrong-{uuid.uuid4().hex}"
    code, output = run(sasl_env(secured_kafka, topics, wrong), timeout=120)
    assert code == 2, output
    errors = error_lines(output)
    assert len(errors) == 1 and "Authentication failed" in errors[0], output
    assert wrong not in output and PASSWORD not in output
    assert "Traceback" not in output


def test_a_refused_topic_stops_the_job_and_is_never_taken_for_missing(secured_kafka):
    topics = create_test_topics(secured_kafka.bootstrap_servers, "acl", partitions=1)
    code, output = run(sasl_env(secured_kafka, topics, PASSWORD), timeout=120)
    assert code == 2, output
    errors = error_lines(output)
    assert len(errors) == 1 and "topic authorization failed" in errors[0].lower() and topics.input in errors[0], output
    assert "does not exist" not in output and "CREATE_TOPICS" not in output
    assert PASSWORD not in output


def test_with_read_and_write_granted_the_secured_job_runs(secured_kafka):
    """The same user, once granted what a detector needs, processes everything: the refusal above
    was the ACLs, not the set-up."""
    bs = secured_kafka.bootstrap_servers
    topics = create_test_topics(bs, "granted", partitions=2)
    admin = clients.new_admin(clients.base(bs))
    acls = [
        AclBinding(kind, name, ResourcePatternType.LITERAL, "User:svc", "*", op, AclPermissionType.ALLOW)
        for kind, name, ops in (
            (ResourceType.TOPIC, topics.input, (AclOperation.READ, AclOperation.DESCRIBE)),
            (ResourceType.TOPIC, topics.output, (AclOperation.WRITE, AclOperation.DESCRIBE)),
            (ResourceType.TOPIC, topics.dlq, (AclOperation.WRITE, AclOperation.DESCRIBE)),
            (ResourceType.TOPIC, "metrics", (AclOperation.WRITE, AclOperation.DESCRIBE)),
            (ResourceType.GROUP, topics.group, (AclOperation.READ, AclOperation.DESCRIBE)),
            (ResourceType.BROKER, "kafka-cluster", (AclOperation.DESCRIBE_CONFIGS, AclOperation.IDEMPOTENT_WRITE)),
        )
        for op in ops
    ]
    for future in admin.create_acls(acls).values():
        future.result()
    clients.create_topics(clients.base(bs), {"metrics": 1})
    sent = produce(bs, topics.input, samples(500, seed=41, bad_every=0, high_share=0.3))
    code, output = run(sasl_env(secured_kafka, topics, PASSWORD, starting_offsets="earliest", stop_after_idle_seconds=3), timeout=300)
    assert code == 0, output
    assert PASSWORD not in output
    assert set(detections(bs, topics.output)) == expected(sent)

    # Exactly-once also needs the right to use the service's transactional ids, not granted here:
    # refused at start, in one line that says what it needs.
    code, output = run(sasl_env(secured_kafka, topics, PASSWORD, processing_guarantee="exactly-once"), timeout=120)
    assert code == 2, output
    errors = error_lines(output)
    assert len(errors) == 1 and "refused transaction" in errors[0] and "transactional id" in errors[0], output
    assert PASSWORD not in output and "Traceback" not in output


# Strimzi's names for what its simple authorization grants, as the Admin API names them.
STRIMZI_RESOURCES = {
    "topic": ResourceType.TOPIC,
    "group": ResourceType.GROUP,
    "transactionalId": ResourceType.TRANSACTIONAL_ID,
}
STRIMZI_PATTERNS = {"literal": ResourcePatternType.LITERAL, "prefix": ResourcePatternType.PREFIXED}


def strimzi_acls(kafka_user, principal):
    """A KafkaUser's ACLs as the AclBindings Strimzi's User Operator creates for them."""
    bindings = []
    for rule in kafka_user["spec"]["authorization"]["acls"]:
        resource = rule["resource"]
        kind, pattern = STRIMZI_RESOURCES[resource["type"]], STRIMZI_PATTERNS[resource["patternType"]]
        for operation in rule["operations"]:
            op = AclOperation[re.sub(r"(?<!^)(?=[A-Z])", "_", operation).upper()]
            bindings.append(AclBinding(kind, resource["name"], pattern, principal, rule.get("host", "*"), op, AclPermissionType.ALLOW))
    return bindings


def test_a_job_with_strimzis_tls_user_and_its_generated_rights_runs_stateful_and_exactly_once(secured_kafka, tmp_path):
    """`<service> kafka-manifests`' KafkaUser, granted as Strimzi's User Operator grants it, to the
    principal of the client certificate it makes (User:CN=<user>), in the files the Secret holds
    (user.crt, user.key; the cluster CA's ca.crt): a stateful job with exactly-once on topics made
    from its KafkaTopics (TOPICS_AS_CODE) runs, so every right it uses is there, the changelog's
    and the transactional ids' included."""
    from detectorkit import manifests
    from detectorkit.cli.manifests import service_of
    from detectorkit.runtime.stage import as_stage

    from ..detectors import COUNT, every_nth_reference
    from ..state.test_state_on_kafka import keyed
    from .test_exactly_once import COUNT_COMMAND, outputs

    bs = secured_kafka.bootstrap_servers
    topics = create_test_topics(bs, "strimzi", partitions=2)
    metrics_topic = f"metrics.{uuid.uuid4().hex[:8]}"
    settings = {"processing_guarantee": "exactly-once", "metrics_topic": metrics_topic, "topic_partitions": 2}
    docs = manifests.manifests(service_of(job_settings(bs, topics, **settings), COUNT.name, as_stage(COUNT).state), "test")
    for doc in docs:  # the Topic Operator makes these; the shared ones exist
        if doc["kind"] == "KafkaTopic":
            spec = doc["spec"]
            clients.create_topics(clients.base(bs), {spec["topicName"]: spec["partitions"]}, config=spec.get("config", {}))
    clients.create_topics(clients.base(bs), {metrics_topic: 1})
    (user,) = [doc for doc in docs if doc["kind"] == "KafkaUser"]
    assert user["spec"]["authentication"]["type"] == "tls"
    secret = tmp_path / "user-secret"
    secured_kafka.tls.issue(user["metadata"]["name"], secret)
    admin = clients.new_admin(clients.base(bs))
    for future in admin.create_acls(strimzi_acls(user, f"User:CN={user['metadata']['name']}")).values():
        future.result()
    sent = produce(bs, topics.input, keyed(600, seed=3))
    env = job_env(
        secured_kafka.ssl_bootstrap_servers, topics, starting_offsets="earliest", stop_after_idle_seconds=3, topics_as_code="true", **settings
    )
    env.update(
        KAFKA_SECURITY_PROTOCOL="SSL",
        KAFKA_SSL_CA_LOCATION=str(secured_kafka.tls.ca_location),
        KAFKA_SSL_CERTIFICATE_LOCATION=str(secret / "user.crt"),
        KAFKA_SSL_KEY_LOCATION=str(secret / "user.key"),
    )
    code, output = run(env, timeout=300, command=COUNT_COMMAND)
    assert code == 0, output
    assert "BEGIN PRIVATE KEY" not in output
    found = outputs(bs, topics)
    assert set(found) == every_nth_reference(sent) and set(found.values()) == {1}


def test_the_diamonds_shared_jobs_run_as_their_strimzi_users_with_only_their_generated_rights(secured_kafka, tmp_path):
    """The normaliser, the notifier (its relay too) and the metrics-aggregator, each with the
    KafkaUser its own `kafka-manifests` prints (deploy/strimzi/ holds them), granted as Strimzi grants
    it to its certificate's principal, over mutual TLS, with topics as code: all three run and do
    their work at once, the two jobs reporting their metrics to the aggregator's table."""
    from detectorkit import manifests
    from detectorkit.cli.manifests import service_of
    from detectorkit.metrics.aggregator_service import AggregatorService
    from detectorkit.roles.normaliser import NORMALISER
    from detectorkit.roles.notifier import Notifier
    from detectorkit.samples import raw_samples

    from ..metrics.test_aggregator_service import Aggregator
    from ..roles.test_notifier_job import T0, detection, per_window_keys, send

    bs = secured_kafka.bootstrap_servers
    run_id = uuid.uuid4().hex[:6]
    shared = {name: f"{name}.{run_id}" for name in ("raw", "normalized", "detections", "notifications", "metrics")}
    clients.create_topics(clients.base(bs), {**{t: 2 for t in shared.values()}, shared["metrics"]: 1})
    admin = clients.new_admin(clients.base(bs))

    def as_strimzi_would(docs):
        """Its KafkaTopics made, its KafkaUser's certificate issued and its rights granted: the user's
        client settings, as the pod reads the Secrets Strimzi makes."""
        for doc in docs:
            if doc["kind"] == "KafkaTopic":
                spec = doc["spec"]
                clients.create_topics(clients.base(bs), {spec["topicName"]: spec["partitions"]}, config=spec.get("config", {}))
        (user,) = [doc for doc in docs if doc["kind"] == "KafkaUser"]
        name = user["metadata"]["name"]
        secured_kafka.tls.issue(name, tmp_path / name)
        for future in admin.create_acls(strimzi_acls(user, f"User:CN={name}")).values():
            future.result()
        return {
            "KAFKA_BOOTSTRAP_SERVERS": secured_kafka.ssl_bootstrap_servers,
            "KAFKA_SECURITY_PROTOCOL": "SSL",
            "KAFKA_SSL_CA_LOCATION": str(secured_kafka.tls.ca_location),
            "KAFKA_SSL_CERTIFICATE_LOCATION": str(tmp_path / name / "user.crt"),
            "KAFKA_SSL_KEY_LOCATION": str(tmp_path / name / "user.key"),
            "TOPICS_AS_CODE": "true",
        }

    jobs = {}
    for stage, command, (source, sink) in (
        (NORMALISER, "normalise", ("raw", "normalized")),
        (Notifier(), "notify", ("detections", "notifications")),
    ):
        group = f"{stage.name}-{run_id}"
        topics = SimpleNamespace(input=shared[source], output=shared[sink], dlq=f"{group}.dlq", group=group)
        settings = job_settings(bs, topics, processing_guarantee="exactly-once", metrics_topic=shared["metrics"], topic_partitions=2)
        service = service_of(settings, stage.name, stage.state, stage.also_reads(settings))
        env = job_env(bs, topics, starting_offsets="earliest", stop_after_idle_seconds=3, processing_guarantee="exactly-once")
        env.update(METRICS_TOPIC=shared["metrics"], METRICS_INTERVAL_SECONDS="1")
        env.update(as_strimzi_would(manifests.manifests(service, "test")))
        jobs[stage.name] = (topics, env, [sys.executable, "-m", "detectorkit", command])

    wanted = AggregatorService(bs, shared["metrics"], f"{shared['metrics']}-agg")
    aggregator_env = {**os.environ, **as_strimzi_would(wanted.kafka_manifests("test", "tls", 1))}
    aggregator = Aggregator(secured_kafka.ssl_bootstrap_servers, shared["metrics"], env=aggregator_env)

    raw = list(raw_samples(300, seed=5, anomaly_share=0.05, malformed_share=0.05))
    producer = clients.new_producer(clients.producer(clients.base(bs)))
    for record in raw:
        producer.produce(shared["raw"], key=record.key, value=record.value)
    assert producer.flush(30) == 0
    found = [(f"c-{i % 7}", detection("threshold", i, T0 + i * 1000)) for i in range(40)]
    send(bs, shared["detections"], found)
    running = {name: Job(env, command) for name, (_, env, command) in jobs.items()}
    try:
        for job in running.values():
            assert job.wait(300) == 0, job.output()
        normalised = read_all(bs, shared["normalized"], committed_only=True)
        assert len(normalised) == sum(s.kind == "valid" for s in raw)
        notifications = read_all(bs, shared["notifications"], committed_only=True)
        assert len(notifications) == len(per_window_keys(found))
        # The relay, reading the notifications in a group of its own, delivered each one.
        delivered = [line for line in running["notifier"].output().splitlines() if '"event": "notification"' in line]
        assert len(delivered) == len(notifications), running["notifier"].output()
        read = lambda: {s: aggregator.scrape().get(("detector_records_read_total", s)) for s in ("normaliser", "notifier")}  # noqa: E731
        wait_for(lambda: read() == {"normaliser": len(raw), "notifier": len(found)}, timeout=30, what=f"the aggregated counts, {read()}")
    finally:
        for job in running.values():
            if job.process.poll() is None:
                job.signal_group(signal.SIGKILL)
        aggregator.stop()
    # The table went to the aggregator's own topics, which only its user may write.
    assert read_all(bs, f"{shared['metrics']}-agg") and read_all(bs, wanted.changelog_topic)


# ---- transactions and Kafka's own tools ---------------------------------------------------------


def produce_transactions(bs, topic, batches):
    """[(records, commit?)] in transactions; aborted ones are flushed first, so they are in the log."""
    producer = clients.new_producer(clients.producer(clients.base(bs), **{"transactional.id": f"upstream-{uuid.uuid4().hex[:6]}"}))
    producer.init_transactions(30)
    for records, commit in batches:
        producer.begin_transaction()
        for s in records:
            producer.produce(topic, key=s.key, value=s.value, partition=int(s.key[-1:]) % 2)
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)


def describe_group(bs, group):
    """kafka-consumer-groups --describe, as rows {column: value}."""
    done = run_tool("consumer-groups", ["--bootstrap-server", bs, "--describe", "--group", group], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.split() for line in done.stdout.splitlines() if line.strip()]
    header = next(i for i, cells in enumerate(lines) if cells[:2] == ["GROUP", "TOPIC"])
    return [dict(zip(lines[header], cells, strict=False)) for cells in lines[header + 1 :]]


def test_only_committed_transactions_are_detected_and_lag_reaches_zero(real_kafka):
    bs = real_kafka
    topics = create_test_topics(bs, "txn", partitions=2)
    good1 = list(samples(300, seed=51, bad_every=0, high_share=0.5))
    aborted = list(samples(300, seed=52, bad_every=0, high_share=0.5))
    good2 = list(samples(300, seed=53, bad_every=0, high_share=0.5))
    produce_transactions(bs, topics.input, [(good1, True), (aborted, False), (good2, True)])

    code, output = run(job_env(bs, topics, starting_offsets="earliest", stop_after_idle_seconds=3), timeout=300)
    assert code == 0, output
    found = collections.Counter(json.loads(m["value"])["detection"]["amount"] for m in read_all(bs, topics.output))
    assert found == collections.Counter(s.amount for s in good1 + good2 if s.amount > 1000)
    assert not set(found) & {s.amount for s in aborted}
    stopped = [json.loads(line) for line in output.splitlines() if '"job stopped"' in line][0]
    assert stopped["records"] == len(good1) + len(good2)

    # The position is past the last transaction marker: Kafka's own tool shows lag 0.
    rows = describe_group(bs, topics.group)
    assert {int(r["PARTITION"]) for r in rows} == {0, 1}
    for row in rows:
        assert row["LAG"] == "0" and row["CURRENT-OFFSET"] == row["LOG-END-OFFSET"], rows
    ends = clients.new_consumer(clients.consumer(clients.base(bs), "probe"))
    assert committed(bs, topics, [0, 1]) == {p: ends.get_watermark_offsets(TopicPartition(topics.input, p), timeout=10)[1] for p in (0, 1)}
    ends.close()


def test_consumer_groups_tool_shows_the_offsets_of_a_job_that_caught_up(real_kafka):
    bs = real_kafka
    topics = create_test_topics(bs, "describe", partitions=3)
    sent = produce(bs, topics.input, samples(900, seed=54, bad_every=30))
    code, output = run(job_env(bs, topics, starting_offsets="earliest", stop_after_idle_seconds=3), timeout=300)
    assert code == 0, output
    rows = describe_group(bs, topics.group)
    per_partition = collections.Counter(s.partition for s in sent)
    assert {int(r["PARTITION"]): int(r["CURRENT-OFFSET"]) for r in rows} == dict(per_partition)
    assert all(r["LAG"] == "0" and r["TOPIC"] == topics.input for r in rows)


# ---- records gone -------------------------------------------------------------------------------


# Lost records reach a slice's reader as the broker's errors: they stop the job, or skip to what is
# there, as FAIL_ON_DATA_LOSS says.
@pytest.mark.parametrize("skip", [False, True], ids=["fails", "skips"])
def test_records_deleted_before_they_were_read(real_kafka, skip):
    bs = real_kafka
    topics = create_test_topics(bs, f"deleterecords-{skip}", partitions=1)
    produce(bs, topics.input, samples(200, seed=61, bad_every=0, high_share=0.5))
    env = job_env(bs, topics, starting_offsets="earliest", stop_after_idle_seconds=3, fail_on_data_loss=str(not skip).lower(), slice_seconds=5)
    # The group's position after an earlier run that read those 200 (set directly: a job run
    # here would cost half a minute and prove nothing more).
    store = OffsetStore(clients.consumer(clients.base(bs), topics.group), topics.input)
    store.commit({0: 200})
    store.close()
    # While the job is away, records arrive and the first 150 of them are deleted.
    later = produce(bs, topics.input, samples(300, seed=62, bad_every=0, high_share=0.5))
    admin = clients.new_admin(clients.base(bs))
    for future in admin.delete_records([TopicPartition(topics.input, 0, 350)]).values():
        future.result()

    code, output = run(env, timeout=300)
    if not skip:
        assert code == 1, output
        errors = error_lines(output)
        assert len(errors) == 1 and "DataLossError" in errors[0] and "FAIL_ON_DATA_LOSS=false" in errors[0], output
        assert committed(bs, topics, [0]) == {0: 200}  # nothing skipped
        assert not detections(bs, topics.output)  # nothing read past the gap either
    else:
        assert code == 0, output
        assert "skipping lost records" in output
        assert set(detections(bs, topics.output)) == {x for x in expected(later) if x[1] >= 350}
        assert committed(bs, topics, [0]) == {0: 500}


@pytest.mark.parametrize("skip", [False, True], ids=["fails", "skips"])
def test_input_topic_deleted_while_the_job_runs(real_kafka, skip):
    bs = real_kafka
    topics = create_test_topics(bs, f"deletetopic-{skip}", partitions=2)
    env = job_env(bs, topics, starting_offsets="earliest", fail_on_data_loss=str(not skip).lower(), create_topics="false", slice_seconds=5)
    job = Job(env)
    try:
        first = produce(bs, topics.input, samples(200, seed=63, bad_every=0, high_share=0.5))
        wait_for(
            lambda: set(detections(bs, topics.output)) == expected(first) or job.process.poll() is not None, timeout=180, what="the first records"
        )
        admin = clients.new_admin(clients.base(bs))
        admin.delete_topics([topics.input])[topics.input].result()
        if not skip:
            assert job.wait(180) == 1, job.output()
            errors = error_lines(job.output())
            # Seen by the planner ("deleted") or by a task mid-read ("no longer exists"): a data-loss error either way.
            assert len(errors) == 1 and "DataLossError" in errors[0] and "FAIL_ON_DATA_LOSS=false" in errors[0], job.output()
            return
        # Skipping: the job goes on, and reads the topic again from its start once it is back.
        wait_for(
            lambda: "skipping lost records" in job.output() or job.process.poll() is not None, timeout=120, what="the job to notice the deletion"
        )
        clients.create_topics(clients.base(bs), {topics.input: 2})
        again = produce(bs, topics.input, samples(200, seed=64, bad_every=0, high_share=0.5))
        high_again = sum(1 for s in again if s.sample.kind == "valid" and s.sample.amount > 1000)
        wait_for(
            lambda: sum(detections(bs, topics.output).values()) == len(expected(first)) + high_again or job.process.poll() is not None,
            timeout=180,
            what="the re-created topic's records",
        )
        assert job.process.poll() is None, job.output()
    finally:
        if job.process.poll() is None:
            job.process.send_signal(signal.SIGTERM)
            assert job.wait(120) == 0, job.output()


# ---- offsets that must not expire ---------------------------------------------------------------


@needs_own_broker
def test_quiet_partitions_keep_their_committed_offsets_past_the_retention():
    """Kafka drops a member-less group's offsets once older than offsets.retention.minutes. A job on
    a topic where nothing arrives must keep its position: otherwise a restart on `latest` skips
    what arrived while it was away."""
    retention = {"offsets.retention.minutes": "1", "offsets.retention.check.interval.ms": "1000"}
    with KafkaBroker(overrides=retention, heap="512m") as broker:
        bs = broker.bootstrap_servers
        topics = create_test_topics(bs, "retention", partitions=2)
        produce(bs, topics.input, samples(100, seed=71, bad_every=0))
        # A group committed once, never again: when its offsets are gone, the retention has passed.
        control = type(topics)(topics.input, topics.output, topics.dlq, f"control-{uuid.uuid4().hex[:6]}")
        store_conf = clients.consumer(clients.base(bs), control.group)
        control_store = OffsetStore(store_conf, topics.input)
        control_store.commit({0: 1, 1: 1})
        control_store.close()

        env = job_env(bs, topics, starting_offsets="latest", commit_refresh_seconds=10, metrics_interval_seconds=2)
        job = Job(env)
        try:
            start = {0: None, 1: None}
            wait_for(
                lambda: None not in committed(bs, topics, [0, 1]).values() or job.process.poll() is not None,
                timeout=120,
                what="the job's starting position",
            )
            start = committed(bs, topics, [0, 1])
            wait_for(lambda: committed(bs, control, [0, 1]) == {0: None, 1: None}, timeout=240, what="the control group's offsets to expire")
            assert job.process.poll() is None, job.output()
            assert committed(bs, topics, [0, 1]) == start
            assert '"positions committed again"' in job.output()
        finally:
            job.process.send_signal(signal.SIGTERM)
            assert job.wait(120) == 0, job.output()
        # Records arriving while the job is away are all read by the next run.
        away = produce(bs, topics.input, samples(300, seed=72, bad_every=0, high_share=0.5))
        code, output = run({**env, "STOP_AFTER_IDLE_SECONDS": "3"}, timeout=300)
        assert code == 0, output
        assert set(detections(bs, topics.output)) == expected(away)


# ---- the broker goes away -----------------------------------------------------------------------


@needs_own_broker
def test_broker_killed_mid_stream_and_restarted_loses_nothing(tmp_path):
    data = tmp_path / "kafka"
    broker = KafkaBroker(data_dir=str(data), heap="512m").start()
    try:
        bs = broker.bootstrap_servers
        topics = create_test_topics(bs, "brokerkill", partitions=4)
        sent = produce(bs, topics.input, samples(20_000, seed=81, bad_every=100, high_share=0.2))
        env = job_env(bs, topics, starting_offsets="earliest", max_records_per_batch=1_000, connect_timeout_seconds=20)
        job = Job(env)
        wait_for(
            lambda: 0 < sum(o or 0 for o in committed(bs, topics, range(4)).values()) or job.process.poll() is not None,
            timeout=180,
            what="a first committed batch",
        )
        broker.kill()
        broker = KafkaBroker(data_dir=str(data), heap="512m").start()
        assert broker.bootstrap_servers == bs  # the same address, from the data directory
        more = produce(bs, topics.input, samples(2_000, seed=82, bad_every=100, high_share=0.2))

        def caught_up():
            return job.process.poll() is not None or sum(o or 0 for o in committed(bs, topics, range(4)).values()) == len(sent) + len(more)

        wait_for(caught_up, timeout=300, what="the job to catch up or exit")
        if job.process.poll() is None:
            outcome = "rode out the broker restart"
            job.process.send_signal(signal.SIGTERM)
            assert job.wait(120) == 0, job.output()
        else:
            code = job.process.returncode
            assert code != 0
            errors = error_lines(job.output())
            assert len(errors) == 1, job.output()
            outcome = f"exited {code} with: {errors[0]}; restarted"
            code, output = run({**env, "STOP_AFTER_IDLE_SECONDS": "3"}, timeout=300)
            assert code == 0, output
        found = detections(bs, topics.output)
        assert set(found) == expected(sent + more)  # nothing lost
        duplicated = sum(n - 1 for n in found.values())
        print(f"broker killed mid-stream: the job {outcome}; {duplicated} duplicate detection(s)")
    finally:
        broker.stop()
