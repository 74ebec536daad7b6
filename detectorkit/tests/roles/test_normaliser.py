"""The upstream normaliser's rules, without Spark or Kafka: every spelling source systems use
becomes the one schema, and what cannot be read is refused with its reason."""

import json

import pyarrow as pa
import pytest

from detectorkit import records as rec
from detectorkit.roles import normaliser as n
from detectorkit.runtime.stage import Source

KAFKA_MS = 1_795_000_000_000  # 2026-11-18T...


def norm(raw):
    return n.normalise(raw, "in-0-7", KAFKA_MS)


@pytest.mark.parametrize(
    ("value", "amount", "currency"),
    [
        (12, 12.0, None),
        (12.5, 12.5, None),
        ("12.50", 12.5, None),
        ("12,5", 12.5, None),
        ("€1.234,50", 1234.5, "EUR"),
        ("1,234.50 USD", 1234.5, "USD"),
        ("EUR 1 234,5", 1234.5, "EUR"),
        ("$12", 12.0, "USD"),
        ("£0.99", 0.99, "GBP"),
        ("1.234", 1234.0, None),
        ("-3,10", -3.1, None),
        ("1'234.00 CHF", 1234.0, "CHF"),
    ],
)
def test_amounts_in_every_spelling(value, amount, currency):
    assert n.parse_amount(value) == (pytest.approx(amount), currency)


@pytest.mark.parametrize("value", ["abc", "", "12 apples", True, None, [1], float("inf"), "1.2.3e4"])
def test_an_amount_that_is_no_number_is_refused(value):
    with pytest.raises(n.NotNormalisable) as refused:
        n.parse_amount(value)
    assert refused.value.reason == n.BAD_AMOUNT


@pytest.mark.parametrize(
    "value",
    [
        "2026-11-22T13:45:00Z",
        "2026-11-22T14:45:00+01:00",
        "2026-11-22 13:45:00",
        "22/11/2026 13:45:00",
        "2026-11-22T13:45:00",
        1795355100,
        1795355100000,
        "1795355100",
        "22.11.2026 13:45:00",
    ],
)
def test_timestamps_in_every_format_mean_the_same_moment(value):
    assert n.iso(n.parse_timestamp(value)) == "2026-11-22T13:45:00.000Z"


@pytest.mark.parametrize("value", ["yesterday", "2026-13-45", "", True, {"t": 1}])
def test_a_timestamp_in_no_known_format_is_refused(value):
    with pytest.raises(n.NotNormalisable) as refused:
        n.parse_timestamp(value)
    assert refused.value.reason == n.BAD_TIMESTAMP


def test_field_names_of_every_source_system_become_one_schema():
    a = norm({"id": "r-1", "customer": "c-1", "amount": 10, "currency": "EUR", "timestamp": "2026-11-22T13:45:00Z"})
    b = norm({"recordId": "r-1", "customerId": "c-1", "amt": "10,00", "ccy": "eur", "ts": 1795355100})
    c = norm({"record_id": "r-1", "client": " c-1 ", "total": "€10", "created_at": "22/11/2026 13:45:00"})
    assert a == b == c == {"id": "r-1", "customer": "c-1", "amount": 10.0, "currency": "EUR", "timestamp": "2026-11-22T13:45:00.000Z"}


def test_missing_id_and_timestamp_come_from_kafka():
    record = norm({"customer": "c-1", "amount": 1})
    assert record["id"] == "in-0-7"
    assert record["timestamp"] == n.iso(n.parse_timestamp(KAFKA_MS))
    assert record["currency"] == "EUR"


@pytest.mark.parametrize(
    ("raw", "reason", "says"),
    [
        ({"amount": 1}, rec.MISSING_FIELD, "customer"),
        ({"customer": "c", "amount": None}, rec.MISSING_FIELD, "amount"),
        ({"customer": "c", "amount": "lots"}, n.BAD_AMOUNT, "lots"),
        ({"customer": "c", "amount": "$5", "currency": "EUR"}, n.BAD_CURRENCY, "disagree"),
        ({"customer": "c", "amount": 5, "currency": "euros"}, n.BAD_CURRENCY, "euros"),
        ({"customer": "c", "amount": 5, "ts": "soon"}, n.BAD_TIMESTAMP, "soon"),
    ],
)
def test_what_cannot_be_normalised_is_refused_with_its_reason(raw, reason, says):
    with pytest.raises(n.NotNormalisable) as refused:
        norm(raw)
    assert refused.value.reason == reason and says in str(refused.value)


def test_the_stage_keys_by_customer_and_dead_letters_the_rest():
    values = pa.array(
        [
            json.dumps({"customerId": "c-9", "amount": "1.500,00 €", "ts": 1795355100}).encode(),
            b"{not json",
            b"[1, 2]",
            None,
            json.dumps({"customer": "c-1", "amount": "n/a"}).encode(),
        ],
        pa.binary(),
    )
    outputs, rejected = n.NORMALISER.run(values, None, lambda p: Source("raw", 0, 40 + p, KAFKA_MS), "normaliser")
    assert [(o.position, o.key, o.value["amount"], o.value["currency"], o.value["id"]) for o in outputs] == [(0, "c-9", 1500.0, "EUR", "raw-0-40")]
    assert outputs[0].timestamp_ms == 1795355100 * 1000  # the event's time becomes the Kafka timestamp
    assert [(r.position, r.reason) for r in rejected] == [(1, rec.MALFORMED_JSON), (2, rec.NOT_AN_OBJECT), (3, rec.NOT_AN_OBJECT), (4, n.BAD_AMOUNT)]
    assert set(n.NORMALISER.reasons) >= {r.reason for r in rejected}


def test_the_stage_reads_records_of_another_format_with_the_decoder_it_is_given():
    """RECORD_FORMAT avro, protobuf or json-schema: the values come through the registry's decoder
    (here one that stands for it), and an Avro timestamp is a time like any other."""
    from datetime import UTC, datetime

    def decode(value):
        if value == b"avro":
            return {"customer": "c-1", "amount": 12.5, "currency": "EUR", "created_at": datetime(2026, 11, 26, 12, 0, tzinfo=UTC)}
        raise rec.Refused(rec.UNDECODABLE, "value is not in the Confluent wire format")

    stage = n.NORMALISER.reading(decode)
    outputs, rejected = stage.run(pa.array([b"avro", b"{}"], pa.binary()), None, lambda p: Source("raw", 0, p, KAFKA_MS), "normaliser")
    assert [(o.key, o.value["amount"], o.value["timestamp"]) for o in outputs] == [("c-1", 12.5, "2026-11-26T12:00:00.000Z")]
    assert [(r.position, r.reason) for r in rejected] == [(1, rec.UNDECODABLE)]
    assert rec.UNDECODABLE in stage.reasons and rec.UNDECODABLE not in n.NORMALISER.reasons


def test_generated_raw_records_normalise_to_the_truth_they_were_made_from():
    """The sample generator renders each record in a random spelling; the normaliser must recover
    the record the generator started from, and refuse exactly the spoiled ones with their kind."""
    from detectorkit.samples import RAW_BAD_KINDS, raw_samples

    made = list(raw_samples(3_000, seed=5, anomaly_share=0.1, malformed_share=0.06))
    values = pa.array([s.value for s in made], pa.binary())
    outputs, rejected = n.NORMALISER.run(values, None, lambda p: Source("raw", 0, p, KAFKA_MS), "normaliser")
    assert {o.position: o.value for o in outputs} == {i: s.normalised for i, s in enumerate(made) if s.kind == "valid"}
    assert all(o.key == made[o.position].key.decode() for o in outputs)
    assert {r.position: r.reason for r in rejected} == {i: s.kind for i, s in enumerate(made) if s.kind != "valid"}
    assert {s.kind for s in made} == {"valid", *RAW_BAD_KINDS}
    assert sum(s.anomaly for s in made) > 200  # about 10% of the valid ones
    assert [s.value for s in raw_samples(50, seed=5)] == [s.value for s in raw_samples(50, seed=5)]
