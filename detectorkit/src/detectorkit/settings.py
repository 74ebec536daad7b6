"""The job's settings: one typed object, read from environment variables and command-line flags.

Every field's environment variable is its name in upper case (``input_topic`` -> ``INPUT_TOPIC``);
the flag is its name in kebab case (``--input-topic``). Flags win over the environment.
librdkafka settings for real clusters pass through from ``KAFKA_SECURITY_PROTOCOL``,
``KAFKA_SASL_*`` and ``KAFKA_SSL_*`` (``KAFKA_SASL_USERNAME`` -> ``sasl.username``) or from
``--kafka-option sasl.username=...``; the Schema Registry client's likewise from
``SCHEMA_REGISTRY_BASIC_AUTH_*``, ``SCHEMA_REGISTRY_BEARER_AUTH_*`` and ``SCHEMA_REGISTRY_SSL_*``
(``SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO`` -> ``basic.auth.user.info``) or
``--schema-registry-option``. Their secrets never reach a log line.
"""

from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import json
import os
import pathlib
import re
import socket
import types
import typing
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from detectorkit.kafka.secrets import is_secret

# The librdkafka keys a deployment may pass through: what a secured real cluster needs.
PASS_THROUGH_PREFIXES = ("security.", "sasl.", "ssl.", "client.", "socket.", "broker.", "metadata.")
# Where the Schema Registry client's settings come from in the environment, e.g.
# SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO -> basic.auth.user.info.
REGISTRY_ENV_PREFIXES = ("SCHEMA_REGISTRY_BASIC_AUTH_", "SCHEMA_REGISTRY_BEARER_AUTH_", "SCHEMA_REGISTRY_SSL_")
# Settings that are dicts of client settings: from their own variables and repeatable flags, never shown.
_OPTIONS = {"kafka_options": "--kafka-option", "schema_registry_options": "--schema-registry-option"}
_TOPIC_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


class SettingsError(ValueError):
    """A missing or invalid setting; its message is one line that says which and what to do."""


def check_topic_name(name: str) -> str:
    """Kafka's rules for a topic name; returns the name or raises ValueError saying what is wrong."""
    if not name:
        raise ValueError("a topic name cannot be empty")
    if name in (".", ".."):
        raise ValueError(f"{name!r} is not allowed as a topic name")
    if len(name) > 249:
        raise ValueError(f"a topic name has at most 249 characters, this one has {len(name)}")
    bad = sorted(set(name) - _TOPIC_CHARS)
    if bad:
        raise ValueError(f"a topic name may use only letters, digits, '.', '_' and '-', not {''.join(bad)!r}")
    return name


def redact(conf: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a client configuration that is safe to log: the Kafka clients' list of secrets."""
    return {k: ("***" if is_secret(k) else v) for k, v in conf.items()}


def redact_url(url: Any) -> Any:
    """A URL safe to log: a user:password in it masked."""
    return re.sub(r"//[^/@]*@", "//***@", url) if isinstance(url, str) else url


def default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Settings(BaseModel):
    """Settings of one detector job. Defaults suit a laptop with the embedded broker."""

    model_config = ConfigDict(extra="forbid", validate_default=True, frozen=True)

    kafka_bootstrap_servers: str | None = Field(None, description="Kafka bootstrap servers, host:port[,host:port]. Unset: start the embedded broker.")
    input_topic: str = Field("records.normalized", description="Topic of normalised records to read.")
    output_topic: str = Field("detections", description="Topic the detections are written to.")
    dlq_topic: str | None = Field(None, description="Dead-letter topic. Default: <service>.dlq.")
    consumer_group: str | None = Field(None, description="Consumer group holding the job's offsets. Default: the service name.")
    shadow: bool = Field(
        False,
        description="Run as a shadow of the live service: a new version beside the old one on the same input, in consumer group "
        "<group>.shadow, writing to <output>.shadow and <dlq>.shadow (which nothing downstream reads), as service <service>-shadow "
        "(its own metrics and state). Compare with: detectorkit diff topic:<output> topic:<output>.shadow --service <service>.",
    )
    instance_id: str = Field(
        default_factory=default_instance_id,
        description="This instance's id, unique among the service's instances. Set: also its "
        "group.instance.id (static membership: a restart within GROUP_SESSION_TIMEOUT_SECONDS keeps its partitions). Default: host-pid, "
        "a dynamic member that hands its partitions over at once when it stops.",
    )
    starting_offsets: Literal["latest", "earliest", "error"] = Field(
        "latest", description="Where to start when the group has no committed offset: latest, earliest or error."
    )
    max_records_per_batch: int = Field(250_000, gt=0, description="At most this many records in one poll of a task (and one detector call).")
    fail_on_data_loss: bool = Field(True, description="Stop when planned records are gone (retention, deleted topic); false skips ahead.")
    spark_master: str = Field("local[2]", description="Spark master URL.")
    slice_seconds: float | None = Field(
        None,
        gt=0,
        description="Each Spark task runs this long, reading, detecting, writing and committing as records arrive (a slice): "
        "Spark's scheduling is paid once a slice, and a record waits for a poll rather than a batch. Between two slices reading "
        "stops for the next Spark batch's start (a few hundred ms). A rebalance or a stop ends a slice early. Unset: 300 in "
        "local mode, where a failed task fails its slice at once; 30 on a cluster, where a task lost with its executor waits "
        "for a core, which the slice's other tasks free at its end.",
    )
    slice_commit_interval_seconds: float = Field(
        0.1,
        gt=0,
        description="How often a task flushes what it wrote and, with exactly-once, commits its transactions (what read_committed readers wait for).",
    )
    checkpoint_dir: str | None = Field(
        None,
        description="Where Spark's checkpoint goes: a subdirectory per instance, emptied at every start, since the consumer group "
        "holds the position. Default: a temporary directory.",
    )
    connect_timeout_seconds: float = Field(30.0, gt=0, description="How long to wait for the broker at start before giving up.")
    stop_after_idle_seconds: float = Field(0.0, ge=0, description="Stop gracefully after this long with no new records; 0 runs until stopped.")
    create_topics: bool = Field(False, description="Create missing input, output and dead-letter topics at start.")
    topics_as_code: bool = Field(
        False,
        description="The topics are made elsewhere (Strimzi's KafkaTopic, Terraform): the job creates none, not even its changelog, and "
        "stops at start with one line naming any of its topics that does not exist.",
    )
    topic_partitions: int = Field(8, gt=0, description="Partitions of topics created by CREATE_TOPICS.")
    group_session_timeout_seconds: float = Field(
        10.0,
        ge=1,
        description="How long the consumer group waits for a silent instance (killed, crashed) before giving its partitions to the "
        "others or to its restart; with INSTANCE_ID set, also how long a restarted instance has to get its own partitions back "
        "without a rebalance (above the restart time, if that matters more). Kafka's brokers accept 6 s and more by default "
        "(group.min.session.timeout.ms); under GROUP_PROTOCOL=consumer the broker's group.consumer.session.timeout.ms rules.",
    )
    group_protocol: Literal["classic", "consumer"] = Field(
        "classic",
        description="The consumer group's rebalance protocol: classic (any broker, the embedded one too) or consumer "
        "(KIP-848, Kafka 4.0+: the broker assigns, and its group.consumer.session.timeout.ms replaces GROUP_SESSION_TIMEOUT_SECONDS).",
    )
    metrics_topic: str = Field("metrics", description="Topic the job's metric snapshots are written to.")
    metrics_bootstrap_servers: str | None = Field(None, description="Kafka cluster of the metrics topic. Default: KAFKA_BOOTSTRAP_SERVERS.")
    metrics_interval_seconds: float = Field(10.0, gt=0, description="How often the job publishes a metrics snapshot.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level of the job's own logs (any case).")
    kafka_broker_kind: Literal["auto", "kafka", "tansu"] = Field(
        "auto",
        description="auto: detect; kafka: read_committed, end offsets from ListOffsets; tansu (the embedded broker): "
        "read_uncommitted, end offsets from Fetch responses.",
    )
    commit_refresh_seconds: float = Field(
        3600.0,
        gt=0,
        description="Commit every partition's position again this often, so the group's offsets never expire (offsets.retention.minutes).",
    )
    health_port: int | None = Field(
        None, ge=0, le=65535, description="Serve /ready and /live over HTTP on this port (0: any free port); unset: no health endpoint."
    )
    health_host: str = Field("0.0.0.0", description="Address the health endpoint listens on.")
    health_stall_seconds: float = Field(300.0, gt=0, description="/live fails when no batch has completed for this long while records wait.")
    query_restart_attempts: int = Field(
        5,
        ge=0,
        description="Restarts of a failed Spark query (from the group's committed offsets) before the job stops; "
        "a batch with records resets the count. A data loss, a refused topic or a bad setting stops it at once.",
    )
    query_restart_backoff_seconds: float = Field(
        1.0, gt=0, description="Wait before the first restart of a failed query; doubled for each next one, up to 30 s."
    )
    timer_idle_grace_seconds: float = Field(
        60.0,
        gt=0,
        description="A detector's timers on a partition that got no record for this long fire as the wall clock minus it passes them.",
    )
    kafka_options: dict[str, str] = Field(default_factory=dict, description="librdkafka settings passed through (security.protocol, sasl.*, ssl.*).")
    state_flush_interval_seconds: float = Field(
        5.0,
        ge=0,
        description="At-least-once, a detector with state, while a backlog is read: how often a task writes its partitions' state "
        "changes to the changelog (each changed key once); a batch that reads a partition to its end writes them at once, and 0 "
        "writes them every batch. A partition that moves, or a restart, replays the records read since without writing their "
        "outputs again. Exactly-once, and the embedded broker, write them every batch.",
    )
    processing_guarantee: Literal["auto", "at-least-once", "exactly-once"] = Field(
        "auto",
        description="exactly-once (Apache Kafka only): each task writes its partitions' detections, dead letters, state changes and "
        "next offsets in one Kafka transaction; consumers read read_committed. at-least-once: a crash replays what was written since "
        "the last commit. auto: exactly-once where the broker keeps transactions (Apache Kafka), at-least-once on the embedded broker "
        "(said at start).",
    )
    transaction_timeout_seconds: float = Field(
        30.0,
        ge=1,
        le=900,
        description="With exactly-once: the broker aborts a task's transaction left open this long (a killed or paused task), "
        "which until then holds back read_committed consumers of its topics. Above the longest batch a task runs.",
    )

    record_format: Literal["json", "avro", "protobuf", "json-schema"] = Field(
        "json",
        description="How the input's records are encoded: json (JSON objects, a batch read at once by Arrow), or avro, protobuf or "
        "json-schema in the Confluent wire format (a 0 byte, the writer's schema id, the payload), read with that schema from "
        "SCHEMA_REGISTRY_URL (pip install 'detectorkit[schema-registry]'). A record that cannot be read goes to the dead-letter topic "
        "as undecodable; a registry that cannot be reached fails the batch, which is retried.",
    )
    schema_registry_url: str | None = Field(
        None,
        description="The Schema Registry of RECORD_FORMAT avro, protobuf and json-schema, by Confluent's API (Confluent's, Karapace, "
        "Apicurio's /apis/ccompat/v7); several comma-separated. Credentials go in SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO.",
    )
    schema_registry_options: dict[str, str] = Field(
        default_factory=dict,
        description="Schema Registry client settings passed through (basic.auth.user.info=user:password, bearer.auth.*, ssl.*, timeout).",
    )

    @field_validator("log_level", "kafka_broker_kind", "starting_offsets", "group_protocol", "processing_guarantee", "record_format", mode="before")
    @classmethod
    def _any_case(cls, value: Any, info) -> Any:
        # Only a known choice is normalised: a wrong one is reported as it was typed.
        if isinstance(value, str):
            for choice in typing.get_args(cls.model_fields[info.field_name].annotation):
                if value.lower() == choice.lower():
                    return choice
        return value

    @property
    def exactly_once(self) -> bool:
        """What a job on Apache Kafka runs (auto included): where it needs transactions' rights."""
        return self.processing_guarantee != "at-least-once"

    def static_instance_id(self) -> str | None:
        """group.instance.id: only an id someone chose is stable across restarts."""
        return self.instance_id if "instance_id" in self.model_fields_set else None

    @field_validator("input_topic", "output_topic", "dlq_topic", "metrics_topic")
    @classmethod
    def _topic(cls, value: str | None) -> str | None:
        return None if value is None else check_topic_name(value)

    @field_validator("kafka_options")
    @classmethod
    def _options(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not key.startswith(PASS_THROUGH_PREFIXES):
                raise ValueError(f"{key!r} is not a pass-through librdkafka setting (allowed: {', '.join(p + '*' for p in PASS_THROUGH_PREFIXES)})")
        return value

    @model_validator(mode="after")
    def _registry(self) -> Settings:
        if self.record_format != "json":
            if not self.schema_registry_url:
                raise ValueError(f"RECORD_FORMAT={self.record_format} reads each record with its schema from a registry: set SCHEMA_REGISTRY_URL")
            from detectorkit.kafka import schema_registry

            schema_registry.check(self.record_format, self.registry_conf())
        return self

    def registry_conf(self) -> dict[str, Any]:
        """The Schema Registry client's settings, secrets as SecretStr."""
        from detectorkit.kafka import schema_registry

        return schema_registry.client_conf(self.schema_registry_url or "", self.schema_registry_options)

    def for_service(self, service: str) -> Settings:
        """Fill the defaults that depend on the service's name (a shadow's: beside the live ones)."""
        dlq, group, output = self.dlq_topic or check_topic_name(f"{service}.dlq"), self.consumer_group or service, self.output_topic
        if self.shadow:
            dlq, group, output = check_topic_name(f"{dlq}.shadow"), f"{group}.shadow", check_topic_name(f"{output}.shadow")
        return self.model_copy(update={"dlq_topic": dlq, "consumer_group": group, "output_topic": output})

    def __repr_args__(self):
        for name, value in super().__repr_args__():
            yield name, _shown(name, value)

    def safe_dict(self) -> dict[str, Any]:
        """The settings as a dict fit for a log line."""
        return {name: _shown(name, value) for name, value in self.model_dump().items()}


def _shown(name: str, value: Any) -> Any:
    if name in _OPTIONS:
        return redact(value)
    return redact_url(value) if name == "schema_registry_url" else value


def kafka_options_from_env(environ: Mapping[str, str]) -> dict[str, str]:
    return _options_from_env(environ, ("KAFKA_SECURITY_", "KAFKA_SASL_", "KAFKA_SSL_"), "KAFKA_")


def registry_options_from_env(environ: Mapping[str, str]) -> dict[str, str]:
    return _options_from_env(environ, REGISTRY_ENV_PREFIXES, "SCHEMA_REGISTRY_")


def _options_from_env(environ: Mapping[str, str], prefixes: Sequence[str], strip: str) -> dict[str, str]:
    options = {}
    for name, value in environ.items():
        upper = name.upper()
        if upper.startswith(tuple(prefixes)):
            options[upper[len(strip) :].lower().replace("_", ".")] = value
    return options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, with the field's description as help."""
    for name, field in Settings.model_fields.items():
        if name in _OPTIONS:
            continue
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, dest=name, default=None, metavar=name.upper(), help=f"{field.description} (env {name.upper()})")
    parser.add_argument(
        "--kafka-option",
        dest="kafka_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka setting passed to every client, e.g. sasl.mechanism=PLAIN (repeatable)",
    )
    parser.add_argument(
        "--schema-registry-option",
        dest="schema_registry_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Schema Registry client setting, e.g. ssl.ca.location=/etc/ca.pem (repeatable; env SCHEMA_REGISTRY_BASIC_AUTH_*, "
        "SCHEMA_REGISTRY_BEARER_AUTH_*, SCHEMA_REGISTRY_SSL_*)",
    )


def load(
    args: argparse.Namespace | None = None,
    environ: Mapping[str, str] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> Settings:
    """Settings from flags, else the environment, else `defaults` (a service's own), else the
    documented defaults; or SettingsError with one clear line."""
    environ = os.environ if environ is None else environ
    if "INPUT_PARTITIONS" in environ:
        raise SettingsError(
            "INPUT_PARTITIONS is no longer read: the instances of a service share the input partitions through "
            "their consumer group, also partitions added later; remove it and start as many instances as you need"
        )
    overrides: dict[str, Any] = {}
    options = {"kafka_options": kafka_options_from_env(environ), "schema_registry_options": registry_options_from_env(environ)}
    if args is not None:
        for name in Settings.model_fields:
            value = getattr(args, name, None)
            if name in _OPTIONS:
                for item in value or []:
                    key, sep, val = item.partition("=")
                    if not sep:
                        raise SettingsError(f"{_OPTIONS[name]} wants KEY=VALUE, got {item!r}")
                    options[name][key.strip()] = val
            elif value is not None:
                overrides[name] = value
    overrides.update(options)
    env_values = {
        name: environ[name.upper()] for name in Settings.model_fields if name.upper() in environ and name not in overrides and name not in _OPTIONS
    }
    try:
        return Settings.model_validate({**(defaults or {}), **env_values, **overrides})
    except ValidationError as exc:
        raise SettingsError(describe(exc)) from None


def read_env_file(path: str, environ: MutableMapping[str, str] | None = None) -> None:
    """KEY=VALUE lines (a `.env` made from `.env.example`; `#` comments, `export `, quotes) into the
    environment, where a variable set already wins, as with Docker Compose's env_file; SettingsError
    in one line for a file that cannot be read or a line of another shape (its value never shown)."""
    environ = os.environ if environ is None else environ
    try:
        lines = pathlib.Path(path).read_text().splitlines()
    except OSError as exc:
        raise SettingsError(f"--env-file {path}: {exc.strerror or exc}") from None
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        key, sep, value = text.removeprefix("export ").partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise SettingsError(f"--env-file {path}, line {number}: not KEY=VALUE")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        environ.setdefault(key, value)


def describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        if not error["loc"]:  # a check of several settings: its message names them, and no value is shown
            parts.append(error["msg"].removeprefix("Value error, "))
            continue
        name = ".".join(str(x) for x in error["loc"])
        shown = "***" if "option" in name else repr(redact_url(error.get("input")))
        parts.append(f"{name.upper()}={shown}: {error['msg']}")
    return "invalid setting " + "; ".join(parts)


def parse(argv: Sequence[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return load(parser.parse_args(argv))


def _is_container(hint: Any) -> bool:
    """A dict, list, tuple, set or dataclass field, possibly optional (`X | None`)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_is_container(a) for a in typing.get_args(hint) if a is not type(None))
    return (
        (origin or hint) in (dict, list, tuple, set, frozenset)
        or dataclasses.is_dataclass(hint)
        or (
            isinstance(origin, type)
            and issubclass(origin, (collections.abc.Mapping, collections.abc.Sequence, collections.abc.Set))
            and origin is not str
        )
    )


def config_from_env(config: type, prefix: str, environ: Mapping[str, str] | None = None) -> Any:
    """A role's or a detector's config dataclass filled from <PREFIX><FIELD> variables (e.g.
    DETECTOR_THRESHOLD), converted to the fields' types; SettingsError naming the variable on a
    bad value."""
    from pydantic import TypeAdapter

    environ = os.environ if environ is None else environ
    values = {f.name: environ[f"{prefix}{f.name.upper()}"] for f in dataclasses.fields(config) if f"{prefix}{f.name.upper()}" in environ}
    hints = typing.get_type_hints(config)
    for name, text in values.items():
        # Pydantic takes a dict or a list as Python values, not as text: those are written as JSON.
        if _is_container(hints.get(name)):
            try:
                values[name] = json.loads(text)
            except json.JSONDecodeError:
                variable = f"{prefix}{name.upper()}"
                raise SettingsError(
                    f"invalid {prefix.rstrip('_').lower()} setting {variable}={text!r}: not JSON; "
                    f"""write a dict or a list as JSON, e.g. {variable}='{{"EUR": 500}}' or '["FR", "DE"]'"""
                ) from None
    try:
        return TypeAdapter(config).validate_python(values, strict=False)
    except ValidationError as exc:
        # A check of the whole config (its __post_init__) names no field: its message says which.
        parts = [
            f"{prefix}{'.'.join(map(str, e['loc'])).upper()}={e.get('input')!r}: {e['msg']}" if e["loc"] else e["msg"].removeprefix("Value error, ")
            for e in exc.errors()
        ]
        raise SettingsError(f"invalid {prefix.rstrip('_').lower()} setting " + "; ".join(parts)) from None
