"""Records in the Confluent wire format (RECORD_FORMAT avro, protobuf or json-schema): each value is
a magic byte, the id of its writer's schema in a Schema Registry, and the payload, decoded with
confluent-kafka's deserializers into the dict a detector sees, or refused as `undecodable`.

A decoder travels to Spark's Python workers inside the stage, pickled with every batch, so it
carries only the format and the client's settings: each worker makes its registry client and
deserializer on its first record and keeps them, with the schemas they fetched, for its life (an id
names one schema forever, so nothing cached goes stale).

A record is refused for what is wrong with it: no wire format, an id the registry does not know, a
payload its schema does not read (or, JSON Schema, does not validate). A registry that cannot be
reached or refuses the credentials is no fault of the record: that fails the batch, which the job
retries as it does any failed batch (QUERY_RESTART_ATTEMPTS), instead of dead-lettering the topic.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from detectorkit.kafka import clients
from detectorkit.kafka.secrets import is_secret
from detectorkit.records import NOT_AN_OBJECT, UNDECODABLE, Refused

FORMATS = ("avro", "protobuf", "json-schema")
# What each format needs beyond confluent-kafka: its extras, which detectorkit[schema-registry] brings.
_LIBRARIES = {"avro": "fastavro", "protobuf": "google.protobuf", "json-schema": "jsonschema"}
_SCHEMA_TYPES = {"avro": "AVRO", "protobuf": "PROTOBUF", "json-schema": "JSON"}
WIRE_FORMAT = "the Confluent wire format (a 0 byte, a 4-byte schema id, the payload)"
# The client's settings it takes as numbers only; from the environment they come as text.
DEFAULT_TIMEOUT_SECONDS = 30
_NUMBERS = frozenset({"timeout", "cache.capacity", "cache.latest.ttl.sec", "max.retries", "retries.wait.ms", "retries.max.wait.ms"})


def client_conf(url: str, options: Mapping[str, str]) -> dict[str, Any]:
    """SchemaRegistryClient's settings; secrets (basic.auth.user.info, ...) as SecretStr, revealed
    only to the client; ValueError for a number that is none."""
    # confluent-kafka's client waits for an answer for ever unless told: a registry that accepts and
    # never answers would hold the batch, where an error fails it, to be retried.
    conf: dict[str, Any] = {"url": url, "timeout": DEFAULT_TIMEOUT_SECONDS}
    for key, value in options.items():
        if key in _NUMBERS and isinstance(value, str):
            try:
                value = float(value) if "." in value else int(value)
            except ValueError:
                raise ValueError(f"schema registry setting {key} must be a number, not {value!r}") from None
        conf[key] = SecretStr(value) if is_secret(key) else value
    return conf


def check(record_format: str, conf: Mapping[str, Any]) -> None:
    """At start: ValueError in one line for a library the format needs and lacks, or settings the
    client refuses (asks the registry nothing)."""
    try:
        __import__(_LIBRARIES[record_format])
        client = _client(conf)
    except ImportError as exc:
        raise ValueError(f"RECORD_FORMAT={record_format} needs {exc.name}: pip install 'detectorkit[schema-registry]'") from None
    except (ValueError, TypeError) as exc:
        raise ValueError(f"the schema registry client refuses its settings: {exc}") from None
    client.close()


@dataclass(frozen=True)
class RegistryDecoder:
    """One Kafka value of `record_format` as a dict, or Refused: what `records.parse` takes."""

    record_format: str
    conf: Mapping[str, Any]  # SchemaRegistryClient's, secrets as SecretStr
    key: str  # the worker's cache entry: the format and the settings, secrets hashed

    def __call__(self, value: bytes | None) -> dict:
        if value is None:
            raise Refused(NOT_AN_OBJECT, f"value is null (a tombstone), not a {self.record_format} record")
        reader = _reader(self)
        schema_id = _header(value, self.record_format)
        which = f"schema id {schema_id.id}" if schema_id.guid is None else f"schema guid {schema_id.guid}"
        try:
            reader.prepare(schema_id)
        except Exception as exc:
            raise _refusal(exc, which) from None
        try:
            record = reader.read(value)
        except Exception as exc:  # noqa: BLE001 - the schema is at hand: what fails now is the payload's fault
            raise Refused(UNDECODABLE, f"payload is not {self.record_format} of {which}: {exc or type(exc).__name__}") from None
        if not isinstance(record, dict):
            raise Refused(NOT_AN_OBJECT, f"value is {self.record_format} {type(record).__name__}, not a record")
        return record


def _refusal(exc: Exception, which: str) -> Exception:
    """Why a value's schema cannot be had: Refused for the record's fault, else the error itself
    (the registry is unreachable or refuses the job: the batch fails and is retried)."""
    from confluent_kafka.schema_registry import SchemaRegistryError
    from confluent_kafka.serialization import SerializationError

    if isinstance(exc, SchemaRegistryError):
        return Refused(UNDECODABLE, f"{which} is not in the schema registry: {exc.error_message}") if exc.http_status_code == 404 else exc
    if isinstance(exc, SerializationError | ValueError | TypeError):  # a schema that does not build, a message it lacks
        return Refused(UNDECODABLE, f"{which} cannot be used: {exc}")
    return exc


def decoder(record_format: str, conf: Mapping[str, Any]) -> RegistryDecoder:
    if record_format not in FORMATS:
        raise ValueError(f"no registry format {record_format!r}: one of {', '.join(FORMATS)}")
    return RegistryDecoder(record_format, dict(conf), f"{record_format}:{clients.conf_key(conf)}")


def _header(value: bytes, record_format: str):
    from confluent_kafka.schema_registry.serde import SchemaId

    schema_id = SchemaId(_SCHEMA_TYPES[record_format])
    try:
        schema_id.from_bytes(io.BytesIO(value))
    except Exception as exc:  # noqa: BLE001 - too short, a wrong magic byte, broken message indexes: all say "not this format"
        raise Refused(UNDECODABLE, f"value is not in {WIRE_FORMAT}: {exc or type(exc).__name__}") from None
    return schema_id


@dataclass(frozen=True)
class _Reader:
    """A format's deserializer, and the registry look-up of a value's schema done before the payload
    is read, so that the two kinds of failure are told apart."""

    prepare: Callable[[Any], None]  # a value's SchemaId -> its schema fetched (SchemaRegistryError)
    read: Callable[[bytes], Any]  # the value, its schema at hand -> the record


_READERS: dict[str, Any] = {}
_LOCK = threading.Lock()


def _reader(of: RegistryDecoder):
    reader = _READERS.get(of.key)
    if reader is None:
        with _LOCK:
            reader = _READERS.get(of.key) or _READERS.setdefault(of.key, _new_reader(of.record_format, of.conf))
    return reader


def _client(conf: Mapping[str, Any]):
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient(clients.reveal(conf))


def _new_reader(record_format: str, conf: Mapping[str, Any]):
    client = _client(conf)
    if record_format == "protobuf":
        from detectorkit.kafka.protobuf_records import ProtobufRecords

        return ProtobufRecords(client)

    def fetch(schema_id) -> None:
        # Cached by the client, under the key the deserializer asks with.
        if schema_id.guid is None:
            client.get_schema(schema_id.id)
        else:
            client.get_schema_by_guid(str(schema_id.guid))

    # The writer's schema, found by the record's id, reads the record: no subject is looked up (its
    # latest version, migration rules), so no naming convention of subjects is assumed.
    no_subject = {"subject.name.strategy": lambda ctx, record_name: None}
    if record_format == "avro":
        from confluent_kafka.schema_registry.avro import AvroDeserializer

        deserializer = AvroDeserializer(client, conf=no_subject)
    else:
        from confluent_kafka.schema_registry.json_schema import JSONDeserializer

        deserializer = JSONDeserializer(None, schema_registry_client=client, conf=no_subject)
    return _Reader(fetch, lambda value: deserializer(value, None))
