"""Records in Avro, Protobuf and JSON Schema through a real Schema Registry (Apicurio's, started for
the session): produced with confluent-kafka's serializers, read back as the dicts a detector sees,
and every way a value can fail to be one refused with the reason and a message that says why."""

import datetime as dt
import json
import pickle
import socket
import time
import uuid

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

from detectorkit import records as rec
from detectorkit.devtools.broker_net import free_port
from detectorkit.kafka import schema_registry as sr

ORDER_AVRO = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "items", "type": "long"},
        {"name": "paid", "type": "boolean"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}
ORDER_JSON_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order",
    "type": "object",
    "properties": {"id": {"type": "string"}, "amount": {"type": "number", "minimum": 0}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["id", "amount"],
}


@pytest.fixture(scope="module")
def client(schema_registry):
    return SchemaRegistryClient({"url": schema_registry, "timeout": 30})


def subject_context():
    """A topic of its own, so each test registers under its own subject."""
    return SerializationContext(f"orders-{uuid.uuid4().hex[:8]}", MessageField.VALUE)


def read(record_format, url, values, required=()):
    return rec.parse(values, required, sr.decoder(record_format, sr.client_conf(url, {})))


def order_classes():
    """Protobuf classes made at run time, as no .proto is compiled here: a file with two messages
    (the second one is what is sent: the wire format's message indexes must pick it) and a nested one."""
    F = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="shop/order.proto", package="shop", syntax="proto3")
    file.dependency.append("google/protobuf/timestamp.proto")
    file.message_type.add(name="Ping").field.add(name="n", number=1, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    order = file.message_type.add(name="Order")
    for number, (name, kind) in enumerate(
        [("order_id", F.TYPE_STRING), ("amount", F.TYPE_DOUBLE), ("items", F.TYPE_INT64), ("paid", F.TYPE_BOOL)], start=1
    ):
        order.field.add(name=name, number=number, type=kind, label=F.LABEL_OPTIONAL)
    order.field.add(name="tags", number=5, type=F.TYPE_STRING, label=F.LABEL_REPEATED)
    order.field.add(name="at", number=6, type=F.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp", label=F.LABEL_OPTIONAL)
    order.field.add(name="shipping", number=7, type=F.TYPE_MESSAGE, type_name=".shop.Order.Address", label=F.LABEL_OPTIONAL)
    address = order.nested_type.add(name="Address")
    address.field.add(name="country_code", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


def test_avro_records_read_back_as_they_were_written(client, schema_registry):
    serialize = AvroSerializer(client, json.dumps(ORDER_AVRO))
    at = dt.datetime(2026, 11, 26, 12, 30, tzinfo=dt.UTC)
    written = [
        {"id": "o-1", "customer": "c-1", "amount": 1234.5, "items": 2**40, "paid": True, "note": None, "at": at},
        {"id": "o-2", "customer": "c-2", "amount": 0.0, "items": 0, "paid": False, "note": "gift", "at": at},
    ]
    ctx = subject_context()
    frame, rejected = read("avro", schema_registry, [serialize(w, ctx) for w in written], required=("amount",))
    assert rejected == []
    assert frame.index.tolist() == [0, 1]
    assert frame.to_dict(orient="records") == written
    # An Avro timestamp is the detector's event time as it is (epoch ms).
    assert rec.event_times_ms(frame["at"])[0].tolist() == [int(at.timestamp() * 1000)] * 2


def test_protobuf_records_read_back_with_proto_names_numbers_and_defaults(client, schema_registry):
    Order = order_classes()
    serialize = ProtobufSerializer(Order, client, {"use.deprecated.format": False})
    full = Order(order_id="o-1", amount=1234.5, items=2**40, paid=True, tags=["a", "b"])
    full.at.FromMilliseconds(1_780_000_000_000)
    full.shipping.country_code = "FR"
    empty = Order(order_id="o-2")  # proto3: zero values are not on the wire, and read back as zeros
    ctx = subject_context()
    frame, rejected = read("protobuf", schema_registry, [serialize(full, ctx), serialize(empty, ctx)], required=("amount",))
    assert rejected == []
    first, second = frame.to_dict(orient="records")
    assert first == {
        "order_id": "o-1",
        "amount": 1234.5,
        "items": 2**40,  # a number, not proto3 JSON's string
        "paid": True,
        "tags": ["a", "b"],
        "at": "2026-05-28T20:26:40Z",
        "shipping": {"country_code": "FR"},
    }
    zeros = {"order_id": "o-2", "amount": 0.0, "items": 0, "paid": False, "tags": []}
    assert {k: second[k] for k in zeros} == zeros


def test_json_schema_records_read_back_as_they_were_written(client, schema_registry):
    serialize = JSONSerializer(json.dumps(ORDER_JSON_SCHEMA), client)
    written = [{"id": "o-1", "amount": 1500, "tags": ["x"]}, {"id": "o-2", "amount": 2.5}]
    ctx = subject_context()
    frame, rejected = read("json-schema", schema_registry, [serialize(w, ctx) for w in written], required=("amount",))
    assert rejected == []
    assert [{k: v for k, v in row.items() if v == v} for row in frame.to_dict(orient="records")] == written  # NaN: no tags


@pytest.fixture(scope="module")
def avro_order(client):
    """A valid Avro value, and its schema id."""
    value = AvroSerializer(client, json.dumps(ORDER_AVRO))(
        {"id": "o", "customer": "c", "amount": 1.0, "items": 1, "paid": True, "note": None, "at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC)},
        subject_context(),
    )
    return value, int.from_bytes(value[1:5], "big")


@pytest.mark.parametrize("record_format", sr.FORMATS)
def test_values_in_no_wire_format_are_undecodable_and_say_so(record_format, schema_registry):
    values = [b'{"amount": 1}', b"\x07\x00\x00\x00\x01payload", b"\x00\x00", b""]
    frame, rejected = read(record_format, schema_registry, values)
    assert frame.empty
    assert [(r.position, r.reason) for r in rejected] == [(i, rec.UNDECODABLE) for i in range(len(values))]
    assert all("not in the Confluent wire format" in r.message for r in rejected), rejected
    assert "magic byte" in rejected[1].message.lower()


@pytest.mark.parametrize("record_format", sr.FORMATS)
def test_an_id_the_registry_does_not_know_is_undecodable_and_named(record_format, schema_registry):
    unknown = 987_654
    header = b"\x00" + unknown.to_bytes(4, "big") + (b"\x00" if record_format == "protobuf" else b"")
    frame, rejected = read(record_format, schema_registry, [header + b"{}"])
    assert frame.empty and [r.reason for r in rejected] == [rec.UNDECODABLE]
    assert f"schema id {unknown} is not in the schema registry" in rejected[0].message


def test_a_payload_its_schema_cannot_read_is_undecodable(schema_registry, avro_order):
    value, schema_id = avro_order
    truncated = value[:8]
    frame, rejected = read("avro", schema_registry, [value, truncated])
    assert frame.index.tolist() == [0]
    assert [(r.position, r.reason) for r in rejected] == [(1, rec.UNDECODABLE)]
    assert f"payload is not avro of schema id {schema_id}" in rejected[0].message


def test_a_json_record_its_schema_refuses_is_undecodable_with_the_validators_words(client, schema_registry):
    serialize = JSONSerializer(json.dumps(ORDER_JSON_SCHEMA), client)
    valid = serialize({"id": "o-1", "amount": 5}, subject_context())
    invalid = valid[:5] + json.dumps({"id": "o-2", "amount": -1}).encode()  # what a producer that skips validation writes
    frame, rejected = read("json-schema", schema_registry, [valid, invalid])
    assert frame.index.tolist() == [0]
    assert [(r.position, r.reason) for r in rejected] == [(1, rec.UNDECODABLE)]
    assert "-1 is less than the minimum of 0" in rejected[0].message


def test_missing_fields_and_tombstones_are_refused_as_for_json(schema_registry, avro_order):
    value, _ = avro_order
    frame, rejected = read("avro", schema_registry, [value, None], required=("amount", "note"))
    assert frame.empty
    assert [(r.position, r.reason) for r in rejected] == [(0, rec.MISSING_FIELD), (1, rec.NOT_AN_OBJECT)]


def test_a_registry_that_cannot_be_reached_fails_the_batch_instead_of_dead_lettering_it(avro_order):
    value, _ = avro_order
    decode = sr.decoder("avro", sr.client_conf(f"http://127.0.0.1:{free_port()}", {"max.retries": "0"}))  # as from the environment
    with pytest.raises(Exception, match="Connection refused") as info:
        decode(value)
    assert not isinstance(info.value, rec.Refused)


def test_a_registry_that_never_answers_fails_the_batch_within_the_timeout_instead_of_holding_it(avro_order):
    value, _ = avro_order
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts connections, never answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        assert sr.client_conf(url, {})["timeout"] > 0  # unless told, a request is not waited for for ever
        decode = sr.decoder("avro", sr.client_conf(url, {"max.retries": "0", "timeout": "0.5"}))
        began = time.monotonic()
        with pytest.raises(Exception, match="timed out") as info:
            decode(value)
    assert time.monotonic() - began < 5 and not isinstance(info.value, rec.Refused)


def test_a_decoder_travels_to_the_workers_without_its_client(schema_registry, avro_order):
    value, _ = avro_order
    decode = sr.decoder("avro", sr.client_conf(schema_registry, {"basic.auth.user.info": "svc:hunter2"}))
    assert decode(value)["id"] == "o"  # this process's client and schema are made and kept
    again = pickle.loads(pickle.dumps(decode))
    assert again == decode and again(value)["id"] == "o"
    assert "hunter2" not in repr(again)
