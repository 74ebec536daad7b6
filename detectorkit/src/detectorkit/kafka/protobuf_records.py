"""Protobuf records of any schema as dicts, with no generated class of their messages at hand.

confluent-kafka's ProtobufDeserializer parses into a message class given up front: a detector
service reads whatever its topic's producers registered. So the class is built here from the
writer's schema in the registry (its file descriptor, and the files it imports), once per schema
and message, and the message turned into a dict as proto3's JSON mapping has it, keeping field
names as written in the .proto and 64-bit integers as numbers (the mapping's strings are for
JavaScript; a detector compares amounts).
"""

from __future__ import annotations

from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, SchemaRegistryError, dual_schema_id_deserializer

# The library's own helpers for the same job: the well-known types' files and the imported schemas.
from confluent_kafka.schema_registry.protobuf import _init_pool, _resolve_named_schema, _str_to_proto
from confluent_kafka.schema_registry.serde import SchemaId
from google.protobuf import json_format
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message_factory import GetMessageClass

SCHEMA_TYPE = "PROTOBUF"


class ProtobufRecords:
    """Protobuf values in the Confluent wire format (schema id, message indexes, payload) as dicts."""

    def __init__(self, client: SchemaRegistryClient):
        self._client = client
        self._classes: dict[tuple[Any, tuple[int, ...]], type] = {}

    def prepare(self, schema_id: SchemaId) -> None:
        """Build the message class a value's header names, once: SchemaRegistryError as the registry
        answers, ValueError or TypeError for a schema that names no such message or does not build."""
        key = _key(schema_id)
        if key not in self._classes:
            self._classes[key] = self._message_class(schema_id)

    def read(self, value: bytes) -> dict:
        schema_id = SchemaId(SCHEMA_TYPE)
        payload = dual_schema_id_deserializer(value, None, schema_id)
        self.prepare(schema_id)
        message = self._classes[_key(schema_id)]()
        message.ParseFromString(payload.read())
        return json_format.MessageToDict(
            message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True, unquote_int64_if_possible=True
        )

    def _message_class(self, schema_id: SchemaId) -> type:
        schema = self._schema(schema_id)
        pool = DescriptorPool()
        _init_pool(pool)
        _resolve_named_schema(schema, self._client, pool)
        file = _str_to_proto(f"schema-{schema_id.id or schema_id.guid}.proto", schema.schema_str)
        pool.Add(file)
        return GetMessageClass(pool.FindMessageTypeByName(_message_name(file, schema_id.message_indexes or [0])))

    def _schema(self, schema_id: SchemaId) -> Schema:
        fetch = self._client.get_schema if schema_id.guid is None else self._client.get_schema_by_guid
        which = schema_id.id if schema_id.guid is None else str(schema_id.guid)
        try:
            return fetch(which, fmt="serialized")  # Confluent's registry keeps .proto text: this asks for the descriptor
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise
            # Apicurio keeps a schema registered as a serialized descriptor (as Python producers
            # register them) as it came, and fails to serialize it again: what it keeps is the descriptor.
            return fetch(which)


def _key(schema_id: SchemaId) -> tuple[Any, tuple[int, ...]]:
    return (schema_id.id if schema_id.guid is None else schema_id.guid, tuple(schema_id.message_indexes or ()))


def _message_name(file, indexes: list[int]) -> str:
    """The full name of the message the wire format's indexes point at: the first a top-level
    message of the file, each next one a message nested in the last."""
    names, messages = [], file.message_type
    for index in indexes:
        if not 0 <= index < len(messages):
            raise ValueError(f"message index {index} is not in the schema, which has {len(messages)} message(s) there")
        names.append(messages[index].name)
        messages = messages[index].nested_type
    return ".".join([file.package, *names] if file.package else names)
