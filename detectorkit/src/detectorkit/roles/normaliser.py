"""The upstream normaliser: raw customer records as source systems send them, turned into the one
schema every detector reads.

    {"id": str, "customer": str, "amount": float, "currency": "EUR", "timestamp": "2026-11-22T13:45:00Z"}

Source systems disagree on field names (``customer_id``, ``customerId``, ``client``...), write
amounts as strings with currency symbols, thousands separators or decimal commas, and timestamps
as ISO 8601, epoch seconds or milliseconds, or day-first dates. A record without an id takes its
Kafka position; one without a timestamp takes its Kafka timestamp. A record whose customer or
amount is missing, or whose amount or timestamp cannot be read, goes to the dead-letter topic with
the reason; nothing is guessed.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from detectorkit.detector import NoConfig
from detectorkit.records import MALFORMED_JSON, MISSING_FIELD, NOT_AN_OBJECT, UNDECODABLE, Decode, Refused, Rejected, parse_object
from detectorkit.runtime.stage import Output, Source, StageBase

# Dead-letter reasons beyond those of parsing (see detectorkit.records).
BAD_AMOUNT = "bad_amount"
BAD_TIMESTAMP = "bad_timestamp"
BAD_CURRENCY = "bad_currency"

FIELDS = {
    "id": ("id", "record_id", "recordId", "txn_id"),
    "customer": ("customer", "customer_id", "customerId", "client", "client_id"),
    "amount": ("amount", "amt", "value", "total"),
    "currency": ("currency", "ccy", "cur"),
    "timestamp": ("timestamp", "ts", "time", "created_at", "createdAt", "event_time"),
}
SYMBOLS = {"€": "EUR", "$": "USD", "£": "GBP", "¥": "JPY", "CHF": "CHF"}
_CODE = re.compile(r"[A-Z]{3}")
_NUMBER = re.compile(r"^[+-]?[\d.,' ]*\d[\d.,' ]*$")
# Epoch values beyond this are milliseconds: 1e11 s is the year 5138.
_EPOCH_MS_FROM = 1e11
_DATE_FORMATS = (
    "%Y-%m-%d %H:%M:%S",
    "%Y-%m-%dT%H:%M:%S",
    "%d/%m/%Y %H:%M:%S",
    "%d/%m/%Y %H:%M",
    "%d.%m.%Y %H:%M:%S",
    "%Y/%m/%d %H:%M:%S",
    "%Y-%m-%d",
)


class NotNormalisable(Refused):
    """Why a raw record cannot become a normalised one; `reason` is the dead-letter reason."""


def first(raw: dict[str, Any], field: str) -> Any:
    """The value of the first present, non-empty spelling of `field`."""
    for name in FIELDS[field]:
        value = raw.get(name)
        if value is not None and value != "":
            return value
    return None


def parse_amount(value: Any) -> tuple[float, str | None]:
    """(amount, currency named in the value or None): 12.5, "12.50", "€1.234,50", "1,234.50 USD",
    "EUR 12,5". The last separator followed by one or two digits is the decimal point."""
    if isinstance(value, bool):
        raise NotNormalisable(BAD_AMOUNT, f"amount {value!r} is not a number")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise NotNormalisable(BAD_AMOUNT, f"amount {value!r} is not finite")
        return float(value), None
    if not isinstance(value, str):
        raise NotNormalisable(BAD_AMOUNT, f"amount {value!r} is not a number")
    text, currency = value.strip(), None
    for symbol, code in SYMBOLS.items():
        if symbol in text:
            text, currency = text.replace(symbol, ""), code
    codes = _CODE.findall(text)
    if codes:
        currency = codes[0]
        text = _CODE.sub("", text)
    text = text.strip()
    if not _NUMBER.match(text):
        raise NotNormalisable(BAD_AMOUNT, f"amount {value!r} is not a number")
    text = text.replace(" ", "").replace("'", "")
    last = max(text.rfind("."), text.rfind(","))
    if last >= 0 and 1 <= len(text) - last - 1 <= 2:
        whole, fraction = text[:last], text[last + 1 :]
    else:
        whole, fraction = text, ""
    whole = whole.replace(".", "").replace(",", "")
    try:
        return float(f"{whole}.{fraction}" if fraction else whole), currency
    except ValueError:
        raise NotNormalisable(BAD_AMOUNT, f"amount {value!r} is not a number") from None


def parse_timestamp(value: Any) -> datetime:
    """An aware UTC datetime from ISO 8601 (naive means UTC), epoch seconds or milliseconds, or
    the day-first and year-first layouts source systems use."""
    if isinstance(value, bool):
        raise NotNormalisable(BAD_TIMESTAMP, f"timestamp {value!r} is not a time")
    if isinstance(value, datetime):  # an Avro timestamp
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)
    if isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)?", value.strip()):
        value = float(value)
    if isinstance(value, int | float):
        seconds = value / 1000 if value >= _EPOCH_MS_FROM else value
        try:
            return datetime.fromtimestamp(seconds, UTC)
        except (OverflowError, OSError, ValueError):
            raise NotNormalisable(BAD_TIMESTAMP, f"timestamp {value!r} is out of range") from None
    if not isinstance(value, str):
        raise NotNormalisable(BAD_TIMESTAMP, f"timestamp {value!r} is not a time")
    text = value.strip()
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        for layout in _DATE_FORMATS:
            try:
                parsed = datetime.strptime(text, layout)
                break
            except ValueError:
                continue
        else:
            raise NotNormalisable(BAD_TIMESTAMP, f"timestamp {value!r} is in no known format") from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _epoch_ms(iso_text: str) -> int:
    return int(datetime.fromisoformat(iso_text.replace("Z", "+00:00")).timestamp() * 1000)


def normalise(raw: dict[str, Any], fallback_id: str, fallback_timestamp_ms: int) -> dict[str, Any]:
    """The normalised record, or NotNormalisable with the reason."""
    customer = first(raw, "customer")
    amount_value = first(raw, "amount")
    missing = [name for name, value in (("customer", customer), ("amount", amount_value)) if value is None]
    if missing:
        raise NotNormalisable(MISSING_FIELD, f"record has no value for {', '.join(missing)}")
    amount, currency_in_amount = parse_amount(amount_value)
    currency = first(raw, "currency")
    if currency is not None:
        currency = SYMBOLS.get(str(currency).strip(), str(currency).strip().upper())
        if not _CODE.fullmatch(currency):
            raise NotNormalisable(BAD_CURRENCY, f"currency {first(raw, 'currency')!r} is not an ISO 4217 code")
        if currency_in_amount is not None and currency_in_amount != currency:
            raise NotNormalisable(BAD_CURRENCY, f"amount {amount_value!r} and currency {currency!r} disagree")
    currency = currency or currency_in_amount or "EUR"
    stamp = first(raw, "timestamp")
    moment = parse_timestamp(stamp) if stamp is not None else datetime.fromtimestamp(fallback_timestamp_ms / 1000, UTC)
    record_id = first(raw, "id")
    return {
        "id": str(record_id) if record_id is not None else fallback_id,
        "customer": str(customer).strip(),
        "amount": round(amount, 2),
        "currency": currency,
        "timestamp": iso(moment),
    }


@dataclasses.dataclass(frozen=True)
class Normaliser(StageBase):
    """The upstream role as a stage of the runtime: one normalised record per raw record, keyed by
    customer, or a dead letter with the reason."""

    name: str = "normaliser"
    reasons: tuple[str, ...] = (MALFORMED_JSON, NOT_AN_OBJECT, MISSING_FIELD, BAD_AMOUNT, BAD_CURRENCY, BAD_TIMESTAMP)
    counts_as_detection: bool = False
    decode: Decode = parse_object  # each raw value as a dict: JSON, or RECORD_FORMAT's (`reading`)

    def load_config(self) -> NoConfig:
        return NoConfig()

    def reading(self, decode: Decode) -> Normaliser:
        reasons = self.reasons if UNDECODABLE in self.reasons else (*self.reasons, UNDECODABLE)
        return dataclasses.replace(self, decode=decode, reasons=reasons)

    def run(self, values: pa.Array, config: Any, source: Callable[[int], Source], service: str) -> tuple[list[Output], list[Rejected]]:
        outputs, rejected = [], []
        for position, value in enumerate(values.to_pylist()):
            where = source(position)
            try:
                record = normalise(self.decode(value), f"{where.topic}-{where.partition}-{where.offset}", where.timestamp_ms)
            except Refused as exc:
                rejected.append(Rejected(position, exc.reason, str(exc)))
                continue
            # Event time travels on: the Kafka timestamp downstream is when it happened, so the
            # notifier's windows and the detectors' latency count from the event.
            outputs.append(Output(position, record, key=record["customer"], timestamp_ms=_epoch_ms(record["timestamp"])))
        return outputs, rejected


NORMALISER = Normaliser()
