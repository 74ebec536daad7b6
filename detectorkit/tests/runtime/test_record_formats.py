"""A detector job on Avro records through a Schema Registry, end to end on a broker: records written
with confluent-kafka's AvroSerializer give the detections their amounts call for, values that
cannot be read land in the dead-letter topic with the reason, and a backtest over the topic reads
it as the job did."""

import json

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from detectorkit.cli.run import run_detector
from detectorkit.runtime.job import StreamJob
from detectorkit.samples import Sample
from detectorkit.testing import create_test_topics, produce, read_all

from ..detectors import THRESHOLD, Config
from ..jobs import job_settings, wait_for

PAYMENT = {
    "type": "record",
    "name": "Payment",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "currency", "type": "string"},
    ],
}


def test_avro_records_reach_the_detector_and_undecodable_ones_the_dead_letters_and_a_backtest_reads_them_too(
    spark, kafka_bootstrap_servers, schema_registry, tmp_path, monkeypatch, capsys
):
    bs = kafka_bootstrap_servers
    topics = create_test_topics(bs, "avro", partitions=2)
    serialize = AvroSerializer(SchemaRegistryClient({"url": schema_registry, "timeout": 30}), json.dumps(PAYMENT))
    context = SerializationContext(topics.input, MessageField.VALUE)
    records = []
    for i in range(200):
        customer, amount = f"customer-{i % 7}", round((i * 37.5) % 2400, 2)
        value = serialize({"id": f"p-{i}", "customer": customer, "amount": amount, "currency": "EUR"}, context)
        records.append(Sample(customer.encode(), value, "valid", amount))
    plain_json = Sample(b"customer-1", b'{"customer": "customer-1", "amount": 5000}', "undecodable")
    unknown_id = Sample(b"customer-2", b"\x00" + (987_654).to_bytes(4, "big") + b"\x02", "undecodable")
    sent = produce(bs, topics.input, [*records[:100], plain_json, *records[100:], unknown_id])

    settings = job_settings(bs, topics, starting_offsets="earliest", record_format="avro", schema_registry_url=schema_registry)
    job = StreamJob.of(THRESHOLD, settings, spark)
    job.start()
    wait_for(lambda: job.stats.records >= len(sent) or job.terminated(0), what=f"{len(sent)} records")
    job.stop()
    assert job.error() is None

    detections = {(d["source"]["partition"], d["source"]["offset"]): d for d in (json.loads(m["value"]) for m in read_all(bs, topics.output))}
    high = {(s.partition, s.offset): s.sample.amount for s in sent if s.sample.kind == "valid" and s.sample.amount > Config().threshold}
    assert len(high) > 10 and set(detections) == set(high)
    assert all(detections[where]["detection"]["amount"] == amount for where, amount in high.items())

    dead = {m["headers"]["source_offset"]: m for m in read_all(bs, topics.dlq)}
    expected = {str(s.offset): s.sample for s in sent if s.sample.kind == "undecodable"}
    assert set(dead) == set(expected)
    for offset, message in dead.items():
        assert message["headers"]["error_type"] == "undecodable"
        assert message["value"] == expected[offset].value.decode(errors="replace")  # the value as it was read
    messages = sorted(m["headers"]["error_message"] for m in dead.values())
    assert "schema id 987654 is not in the schema registry" in messages[0] and "not in the Confluent wire format" in messages[1], messages
    assert job.stats.dead_letters == {"undecodable": 2}

    # The backtest over the topic, as `<service> backtest` runs with the live service's settings.
    live = {"KAFKA_BOOTSTRAP_SERVERS": bs, "INPUT_TOPIC": topics.input, "RECORD_FORMAT": "avro", "SCHEMA_REGISTRY_URL": schema_registry}
    for name, value in live.items():
        monkeypatch.setenv(name, value)
    labels = tmp_path / "labels.txt"
    labels.write_text("id\n" + "".join(f"p-{i}\n" for i, s in enumerate(records) if s.amount > Config().threshold))
    out = tmp_path / "found.jsonl"
    assert run_detector(THRESHOLD, ["backtest", "--out", str(out), "--labels", str(labels), "--no-progress"]) == 0
    labelled = sum(s.amount > Config().threshold for s in records)
    assert f"{labelled} labelled, {labelled} flagged, {labelled} both: precision 1.000, recall 1.000" in capsys.readouterr().out
    found = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(found, key=lambda d: (d["source"]["partition"], d["source"]["offset"])) == sorted(
        detections.values(), key=lambda d: (d["source"]["partition"], d["source"]["offset"])
    )
