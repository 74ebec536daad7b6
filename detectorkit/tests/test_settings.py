import argparse

import certifi
import pytest

from detectorkit import settings as s
from detectorkit.detector import Detector
from detectorkit.settings import SettingsError, load

from .detectors import THRESHOLD, Config


def parse(argv, environ=None, defaults=None):
    parser = argparse.ArgumentParser()
    s.add_arguments(parser)
    return load(parser.parse_args(argv), environ=environ or {}, defaults=defaults)


def test_documented_defaults():
    got = load(environ={})
    assert got.kafka_bootstrap_servers is None
    assert (got.input_topic, got.output_topic, got.starting_offsets) == ("records.normalized", "detections", "latest")
    assert got.max_records_per_batch == 250_000 and got.fail_on_data_loss is True
    assert got.slice_seconds is None  # the plan's, by master (runtime.job_plan.slice_seconds)
    assert all(f.description for f in s.Settings.model_fields.values())


def test_environment_then_flags_then_service_defaults():
    env = {"INPUT_TOPIC": "from-env", "OUTPUT_TOPIC": "out-env", "MAX_RECORDS_PER_BATCH": "500", "SLICE_SECONDS": "2"}
    got = parse(["--output-topic", "out-flag"], env, defaults={"input_topic": "svc-in", "dlq_topic": "svc.dlq"})
    assert got.input_topic == "from-env"
    assert got.output_topic == "out-flag"
    assert got.dlq_topic == "svc.dlq"
    assert got.max_records_per_batch == 500 and got.slice_seconds == 2


def test_service_fills_dlq_and_group():
    got = load(environ={}).for_service("high-value-orders")
    assert got.dlq_topic == "high-value-orders.dlq"
    assert got.consumer_group == "high-value-orders"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"STARTING_OFFSETS": "newest"}, "STARTING_OFFSETS='newest'"),
        ({"MAX_RECORDS_PER_BATCH": "0"}, "MAX_RECORDS_PER_BATCH='0'"),
        ({"MAX_RECORDS_PER_BATCH": "lots"}, "MAX_RECORDS_PER_BATCH='lots'"),
        ({"INPUT_TOPIC": "bad topic"}, "INPUT_TOPIC='bad topic'"),
        ({"OUTPUT_TOPIC": ".."}, "not allowed"),
        ({"FAIL_ON_DATA_LOSS": "maybe"}, "FAIL_ON_DATA_LOSS"),
        ({"SLICE_SECONDS": "0"}, "SLICE_SECONDS='0'"),
    ],
)
def test_invalid_value_is_one_clear_line(env, message):
    with pytest.raises(SettingsError) as info:
        load(environ=env)
    text = str(info.value)
    assert message in text and "\n" not in text


def test_pass_through_of_librdkafka_settings_from_env_and_flags():
    env = {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_USERNAME": "svc", "KAFKA_SASL_PASSWORD": "hunter2"}
    got = parse(["--kafka-option", "ssl.ca.location=/etc/ca.pem"], env)
    assert got.kafka_options == {
        "security.protocol": "SASL_SSL",
        "sasl.username": "svc",
        "sasl.password": "hunter2",
        "ssl.ca.location": "/etc/ca.pem",
    }


def test_only_connection_settings_pass_through():
    with pytest.raises(SettingsError, match="enable.auto.commit"):
        parse(["--kafka-option", "enable.auto.commit=true"])


def test_secrets_never_reach_logs():
    got = load(environ={"KAFKA_SASL_PASSWORD": "hunter2", "KAFKA_SSL_KEY_PASSWORD": "s3cret"})
    for shown in (repr(got), str(got), str(got.safe_dict())):
        assert "hunter2" not in shown and "s3cret" not in shown
    assert got.kafka_options["sasl.password"] == "hunter2"


def test_every_secret_from_the_environment_is_masked_and_the_rest_shown():
    secrets = [
        "sasl.password",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.config",
        "sasl.jaas.config",
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "ssl.key.password",
        "ssl.key.pem",
        "ssl.keystore.password",
    ]
    shown = {
        "sasl.username": "svc",
        "ssl.key.location": "/etc/kafka/client.key",
        "ssl.keystore.location": "/etc/kafka/client.p12",
        "sasl.oauthbearer.token.endpoint.url": "https://idp.example.com/token",
    }
    env = {"KAFKA_" + key.upper().replace(".", "_"): f"hunter2-{i}" for i, key in enumerate(secrets)}
    env |= {"KAFKA_" + key.upper().replace(".", "_"): value for key, value in shown.items()}
    got = load(environ=env)
    assert set(got.kafka_options) == set(secrets) | set(shown)
    for text in (repr(got), str(got), str(got.safe_dict())):
        assert "hunter2" not in text
        assert all(value in text for value in shown.values())
    assert got.safe_dict()["kafka_options"] == dict.fromkeys(secrets, "***") | shown


def test_detector_config_from_environment():
    assert THRESHOLD.load_config({"DETECTOR_THRESHOLD": "12.5"}) == Config(threshold=12.5)
    with pytest.raises(SettingsError, match="DETECTOR_THRESHOLD='high'"):
        THRESHOLD.load_config({"DETECTOR_THRESHOLD": "high"})


def test_a_config_field_of_dicts_or_lists_is_set_from_json():
    """A data scientist's config may hold a threshold per currency or a list of countries: set from
    the environment as JSON, refused in one line that names the variable when it is not."""
    import dataclasses

    from detectorkit.settings import config_from_env

    @dataclasses.dataclass(frozen=True)
    class PerCurrency:
        thresholds: dict[str, float] = dataclasses.field(default_factory=lambda: {"EUR": 1000.0})
        countries: tuple[str, ...] = ("FR",)
        limit: float = 1.0

    env = {"DETECTOR_THRESHOLDS": '{"EUR": 500, "USD": 700.5}', "DETECTOR_COUNTRIES": '["DE", "NL"]', "DETECTOR_LIMIT": "2"}
    assert config_from_env(PerCurrency, "DETECTOR_", env) == PerCurrency({"EUR": 500.0, "USD": 700.5}, ("DE", "NL"), 2.0)
    with pytest.raises(SettingsError) as refused:
        config_from_env(PerCurrency, "DETECTOR_", {"DETECTOR_THRESHOLDS": "EUR=500"})
    assert "DETECTOR_THRESHOLDS='EUR=500'" in str(refused.value) and "JSON" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(SettingsError, match="DETECTOR_THRESHOLDS"):
        config_from_env(PerCurrency, "DETECTOR_", {"DETECTOR_THRESHOLDS": '{"EUR": "lots"}'})


def test_detector_without_config():
    assert Detector(name="x", detect=lambda r, c: r).load_config({}) is not None


def test_log_level_and_choices_in_any_case():
    got = load(environ={"LOG_LEVEL": "debug", "STARTING_OFFSETS": "Earliest", "KAFKA_BROKER_KIND": "KAFKA"})
    assert (got.log_level, got.starting_offsets, got.kafka_broker_kind) == ("DEBUG", "earliest", "kafka")
    with pytest.raises(SettingsError, match="LOG_LEVEL='verbose'"):
        load(environ={"LOG_LEVEL": "verbose"})


def test_input_partitions_is_refused_with_what_to_do_instead():
    """Set by hand next to instances that share the group, it would read partitions twice."""
    with pytest.raises(SettingsError, match="INPUT_PARTITIONS is no longer read: the instances of a service share"):
        load(environ={"INPUT_PARTITIONS": "0-3"})


def test_only_a_chosen_instance_id_makes_a_static_member():
    assert load(environ={}).static_instance_id() is None  # host-pid changes at every start
    chosen = load(environ={"INSTANCE_ID": "orders-1"}).for_service("orders")
    assert chosen.static_instance_id() == "orders-1"
    assert load(environ={"GROUP_SESSION_TIMEOUT_SECONDS": "10"}).group_session_timeout_seconds == 10
    with pytest.raises(SettingsError, match="GROUP_SESSION_TIMEOUT_SECONDS"):
        load(environ={"GROUP_SESSION_TIMEOUT_SECONDS": "0"})


def test_a_shadow_reads_and_writes_beside_the_live_service():
    live = s.Settings(consumer_group="bursts", output_topic="detections", dlq_topic="bursts.dlq").for_service("bursts")
    shadow = s.Settings(consumer_group="bursts", output_topic="detections", dlq_topic="bursts.dlq", shadow=True).for_service("bursts")
    assert (live.consumer_group, live.output_topic, live.dlq_topic) == ("bursts", "detections", "bursts.dlq")
    assert (shadow.consumer_group, shadow.output_topic, shadow.dlq_topic) == ("bursts.shadow", "detections.shadow", "bursts.dlq.shadow")
    assert s.Settings(shadow=True).for_service("x").dlq_topic == "x.dlq.shadow"


def test_an_env_file_fills_what_the_environment_leaves_unset(tmp_path):
    from detectorkit.settings import read_env_file

    env_file = tmp_path / ".env"
    env_file.write_text('# the usual settings\nINPUT_TOPIC=orders\nexport OUTPUT_TOPIC="found"\n\nDETECTOR_THRESHOLD = 5000\nDLQ_TOPIC=orders.dlq\n')
    environ = {"DLQ_TOPIC": "set.already"}
    read_env_file(str(env_file), environ)
    assert environ == {"INPUT_TOPIC": "orders", "OUTPUT_TOPIC": "found", "DETECTOR_THRESHOLD": "5000", "DLQ_TOPIC": "set.already"}
    assert load(environ=environ).input_topic == "orders"


def test_an_env_file_of_another_shape_is_one_line_that_never_shows_a_value(tmp_path):
    from detectorkit.settings import read_env_file

    env_file = tmp_path / ".env"
    env_file.write_text("KAFKA_SASL_PASSWORD=hunter2\nthis is no setting hunter2\n")
    with pytest.raises(SettingsError) as raised:
        read_env_file(str(env_file), {})
    assert str(raised.value) == f"--env-file {env_file}, line 2: not KEY=VALUE"
    with pytest.raises(SettingsError, match="No such file"):
        read_env_file(str(tmp_path / "missing.env"), {})


# ---- record formats through a Schema Registry ------------------------------------------------------


def test_json_is_the_default_record_format_and_needs_no_registry():
    got = load(environ={})
    assert got.record_format == "json" and got.schema_registry_url is None


@pytest.mark.parametrize("record_format", ["avro", "protobuf", "json-schema"])
def test_a_registry_format_without_a_registry_stops_at_start_in_one_line(record_format):
    with pytest.raises(SettingsError) as info:
        load(environ={"RECORD_FORMAT": record_format})
    text = str(info.value)
    assert f"RECORD_FORMAT={record_format}" in text and "set SCHEMA_REGISTRY_URL" in text and "\n" not in text


def test_registry_settings_from_env_and_flags_and_their_secrets_never_show():
    ca = certifi.where()  # the client reads its CA file at once
    env = {
        "RECORD_FORMAT": "AVRO",
        "SCHEMA_REGISTRY_URL": "https://registry.example.com:8081",
        "SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO": "svc:hunter2",
        "SCHEMA_REGISTRY_SSL_CA_LOCATION": ca,
    }
    got = parse(["--schema-registry-option", "timeout=5"], env)
    assert got.record_format == "avro"
    assert got.schema_registry_options == {
        "basic.auth.user.info": "svc:hunter2",
        "ssl.ca.location": ca,
        "timeout": "5",
    }
    for text in (repr(got), str(got), str(got.safe_dict()), repr(got.registry_conf())):
        assert "hunter2" not in text
        assert ca in text and "registry.example.com" in text
    assert got.registry_conf()["timeout"] == 5
    # The other way to authenticate: a bearer token, as secret.
    assert s.is_secret("bearer.auth.token") and s.is_secret("bearer.auth.client.secret") and not s.is_secret("bearer.auth.client.id")


def test_a_password_in_the_registry_url_is_masked_too():
    got = load(environ={"RECORD_FORMAT": "json-schema", "SCHEMA_REGISTRY_URL": "https://svc:hunter2@registry.example.com"})
    for text in (repr(got), str(got), str(got.safe_dict())):
        assert "hunter2" not in text and "https://***@registry.example.com" in text


def test_registry_settings_the_client_refuses_stop_at_start_in_one_line_without_their_values():
    avro = {"RECORD_FORMAT": "avro", "SCHEMA_REGISTRY_URL": "http://registry:8081"}
    for option, message in [
        ("basic.auth.user.info=hunter2-without-a-user", "{username}:{password}"),
        ("auto.register.schemas=true", "Unrecognized properties: auto.register.schemas"),
        ("timeout=soon", "timeout must be a number"),
    ]:
        with pytest.raises(SettingsError) as info:
            parse(["--schema-registry-option", option], avro)
        text = str(info.value)
        assert message in text and "hunter2" not in text and "\n" not in text, text


def test_a_stage_that_reads_json_only_refuses_another_format_and_the_normaliser_reads_it():
    from detectorkit.roles.normaliser import NORMALISER
    from detectorkit.roles.notifier import Notifier
    from detectorkit.runtime.stage import as_stage, reading_input

    avro = load(environ={"RECORD_FORMAT": "avro", "SCHEMA_REGISTRY_URL": "http://registry:8081"})
    assert reading_input(as_stage(THRESHOLD), avro).decode.record_format == "avro"
    normaliser = reading_input(reading_input(NORMALISER, avro), avro)
    assert normaliser.decode.record_format == "avro" and normaliser.reasons.count("undecodable") == 1
    notifier = Notifier()
    with pytest.raises(SettingsError, match="the notifier reads JSON records only"):
        reading_input(notifier, avro)
    assert reading_input(notifier, load(environ={})) is notifier
