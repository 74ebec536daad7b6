"""The downstream notifier: detections in (every detector writes to one topic), one notification
per customer and time window out, delivered by a log line or an HTTP webhook.

The pipeline is at-least-once, so a detection may arrive twice: the same detector's detection of
the same source record (topic, partition, offset) is the same detection. Windows are event time
(the source record's Kafka timestamp), so a replay puts a detection in the window it had the first
time.

Its state is the runtime's keyed state (`detectorkit.state`), as a detector's: per input
partition, one key per window notified ("customer|window index") holding the ids of the window's
detections, the window's newest detection its event time, and the horizon its TTL. A window leaves
once its newest detection is more than the horizon older than the partition's newest detection,
so the state stays bounded. (The notifier's own changelog before counted from the window's end, so
a window may now leave up to one window earlier.) What the horizon promises is unchanged: a
detection within it of its partition's newest detection is never notified twice; an older one may
be: a duplicate is better than a lost notification.

The state lives where every stage's does: a compacted changelog topic, `<consumer group>.notifications`
(a name of its own: the `<consumer group>.state` of earlier versions holds another format and is
never read; it can be deleted), read back before a partition's first batch on whichever instance
gets it, and counted in the `detector_state_*` metrics.

Its batches run in the source's tasks, as a detector's, and its notifications are outputs: written
and committed by the runtime's commit sequence (`runtime.checkpoint`), with the window's state
change that stands for them. The output topic is an outbox: the notifier's relay
(`roles.notification_relay`) delivers what is committed there, so a delivery's retries hold no
batch, and with exactly-once an aborted batch's notifications are never delivered.
"""

from __future__ import annotations

import dataclasses
import email.utils
import json
import random
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx
import pandas as pd
import pyarrow as pa
import structlog

from detectorkit.records import MALFORMED_JSON, MISSING_FIELD, NOT_AN_OBJECT, Refused, Rejected, parse_object
from detectorkit.roles.notification_relay import DELIVERY_FAILED, NotificationRelay, delivery_group
from detectorkit.runtime.stage import KeyedBatch, Output, Source, StageBase
from detectorkit.settings import SettingsError, config_from_env
from detectorkit.state.declaration import State

log = structlog.get_logger("detectorkit.notifier")

__all__ = ["DELIVERY_FAILED", "Notifier", "NotifierConfig"]


@dataclasses.dataclass(frozen=True)
class NotifierConfig:
    """Read from NOTIFIER_<FIELD> variables."""

    window_seconds: float = 3600.0
    horizon_seconds: float = 7 * 24 * 3600.0
    delivery: str = "log"  # "log" or "webhook"
    webhook_url: str = ""
    webhook_attempts: int = 3
    webhook_timeout_seconds: float = 5.0
    # Full-jitter backoff between attempts: a wait drawn from [0, min(cap, base * 2^n)]. The cap
    # also bounds a receiver's Retry-After: the relay waits, holding the deliveries after it.
    webhook_backoff_base_seconds: float = 0.5
    webhook_backoff_cap_seconds: float = 30.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> NotifierConfig:
        config = config_from_env(cls, "NOTIFIER_", environ)
        if config.delivery not in ("log", "webhook"):
            raise SettingsError(f"invalid notifier setting NOTIFIER_DELIVERY={config.delivery!r}: use log or webhook")
        if config.delivery == "webhook" and not config.webhook_url.startswith(("http://", "https://")):
            raise SettingsError("NOTIFIER_DELIVERY=webhook needs NOTIFIER_WEBHOOK_URL=http(s)://...")
        if config.window_seconds <= 0 or config.horizon_seconds < config.window_seconds or config.webhook_attempts < 1:
            raise SettingsError("notifier settings need NOTIFIER_WINDOW_SECONDS > 0, NOTIFIER_HORIZON_SECONDS >= it, NOTIFIER_WEBHOOK_ATTEMPTS >= 1")
        if not 0 < config.webhook_backoff_base_seconds <= config.webhook_backoff_cap_seconds:
            raise SettingsError("notifier settings need 0 < NOTIFIER_WEBHOOK_BACKOFF_BASE_SECONDS <= NOTIFIER_WEBHOOK_BACKOFF_CAP_SECONDS")
        return config


def detection_id(detection: Mapping[str, Any]) -> str:
    s = detection["source"]
    if "timer_ms" in s:  # a timer's detection names no record: its key and its time say which it is
        return f"{detection['service']}|{s['topic']}|{s['partition']}|timer|{s['key']}|{s['timer_ms']}"
    return f"{detection['service']}|{s['topic']}|{s['partition']}|{s['offset']}"


# The state's name: its changelog is `<consumer group>.notifications`.
STATE_NAME = "notifications"


def notification_state(horizon_seconds: float) -> State:
    """A window's state: the ids of its detections; kept for the horizon in event time."""
    return State(columns=("ids",), ttl_seconds=horizon_seconds, name=STATE_NAME)


def window_key(customer: str, window: int) -> str:
    return f"{customer}|{window}"


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# ---- delivery -------------------------------------------------------------------------------------


class Delivery(Protocol):
    def deliver(self, notification: dict[str, Any]) -> None:
        """Deliver one notification; raise with the reason when it cannot be delivered."""


class LogDelivery:
    def deliver(self, notification: dict[str, Any]) -> None:
        log.info(
            "notification", customer=notification["customer"], window_start=notification["window_start"], detections=len(notification["detections"])
        )


class WebhookDelivery:
    """POST the notification as JSON over one kept-alive connection; retried on what may pass.

    Retried: connection errors and timeouts, 408, 429 and 5xx, waiting the receiver's
    `Retry-After` when it sends one, else an exponential backoff with full jitter (a wait drawn
    from [0, min(cap, base * 2^n)]) so that notifiers failing together do not retry in lockstep.
    Every wait is capped: the relay delivers one notification at a time, and a wait holds the next. Any
    other answer is final. Each notification carries an `Idempotency-Key` derived from its
    customer and window, the same across retries, replays and restarts, so a receiver can drop
    a repeat."""

    RETRIED = frozenset({408, 429})

    def __init__(
        self,
        url: str,
        attempts: int = 3,
        timeout: float = 5.0,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        random: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.time,
    ):
        self.url, self.attempts, self.timeout = url, attempts, timeout
        self.backoff_base, self.backoff_cap = backoff_base, backoff_cap
        self.sleep, self.random, self.clock = sleep, random, clock
        # Where the reasons say it went: the host, not the path or query, which often hold the
        # webhook's secret (and the reasons go to the dead-letter topic and the logs).
        parts = urllib.parse.urlsplit(url)
        self.where = f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        self._client: httpx.Client | None = None

    @property
    def client(self) -> httpx.Client:
        # One client for the notifier's life: its pool keeps the connection (and its TLS session)
        # between deliveries, where urllib opened a new one per POST.
        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout, follow_redirects=False)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def backoff(self, retry: int) -> float:
        """The wait before retry number `retry` (0 for the first): full jitter."""
        return self.random() * min(self.backoff_cap, self.backoff_base * 2**retry)

    def retry_after(self, value: str | None) -> float | None:
        """Seconds to wait from a `Retry-After` header (delay-seconds or an HTTP-date), or None."""
        if not value:
            return None
        value = value.strip()
        if value.isdigit():
            return float(value)
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None  # unreadable: the backoff decides
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return max(0.0, when.timestamp() - self.clock())

    def deliver(self, notification: dict[str, Any]) -> None:
        body = json.dumps(notification).encode()
        headers = {"Content-Type": "application/json", "Idempotency-Key": f'"{idempotency_key(notification)}"'}
        problem = ""
        for attempt in range(self.attempts):
            asked: float | None = None
            try:
                response = self.client.post(self.url, content=body, headers=headers)
            except httpx.TransportError as exc:  # refused, reset, timed out: the next try may pass
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 300:
                    return
                problem = f"HTTP {response.status_code}"
                if response.status_code < 500 and response.status_code not in self.RETRIED:
                    break  # the receiver refuses it (or redirects, which is not followed): retrying will not help
                asked = self.retry_after(response.headers.get("Retry-After"))
            if attempt + 1 < self.attempts:
                wait = min(self.backoff(attempt) if asked is None else asked, self.backoff_cap)
                log.warning(
                    "webhook delivery retried",
                    webhook=self.where,
                    attempt=attempt + 1,
                    problem=problem,
                    retry_after_seconds=asked,
                    wait_seconds=round(wait, 3),
                )
                self.sleep(wait)
        raise RuntimeError(f"webhook {self.where} failed {attempt + 1} time(s): {problem}")


# A fixed namespace: the same notification gets the same key in every process, on every machine.
_IDEMPOTENCY_NAMESPACE = uuid.UUID("6f0c1f57-3e8a-4c4b-9a51-2d0a8e5f4b21")


def idempotency_key(notification: Mapping[str, Any]) -> str:
    """The notification's identity (customer and window) as a UUID: a replay after a restart
    notifies the same window again under the same key, whatever detections it carries."""
    identity = json.dumps([notification["customer"], notification["window_start"], notification["window_end"]])
    return str(uuid.uuid5(_IDEMPOTENCY_NAMESPACE, identity))


def delivery_for(config: NotifierConfig) -> Delivery:
    if config.delivery == "webhook":
        return WebhookDelivery(
            config.webhook_url,
            config.webhook_attempts,
            config.webhook_timeout_seconds,
            config.webhook_backoff_base_seconds,
            config.webhook_backoff_cap_seconds,
        )
    return LogDelivery()


# ---- the stage ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Notifier(StageBase):
    """The downstream role as a stage: its windows kept as keyed state (`state`) that the runtime
    restores and writes as a detector's, its notifications an outbox that its relay delivers."""

    name: str = "notifier"
    reasons: tuple[str, ...] = (MALFORMED_JSON, NOT_AN_OBJECT, MISSING_FIELD, DELIVERY_FAILED)
    counts_as_detection: bool = False
    # Its TTL is the configured horizon once `prepare` has run: at the job's start, before any batch.
    state: State = notification_state(NotifierConfig.horizon_seconds)
    delivery: Delivery | None = None

    def load_config(self) -> NotifierConfig:
        return NotifierConfig.from_env()

    def __getstate__(self) -> dict[str, Any]:
        # Pickled to the tasks, which never deliver: the delivery (an HTTP client) stays in the relay's process.
        return {**self.__dict__, "delivery": None}

    def prepare(self, config: NotifierConfig) -> None:
        self.state = notification_state(config.horizon_seconds)
        self.delivery = self.delivery or delivery_for(config)

    def prepare_job(self, config: NotifierConfig, settings: Any, base_conf: Mapping[str, Any], broker_kind: str) -> None:
        """The state's TTL and the delivery, from the configuration (the runtime creates the changelog)."""
        self.prepare(config)

    def relay(
        self, config: NotifierConfig, settings: Any, base_conf: Mapping[str, Any], broker_kind: str, on_dead_letter, on_failure
    ) -> NotificationRelay:
        """Deliveries of what the batches committed to the output topic."""
        self.prepare(config)
        s = settings
        return NotificationRelay(
            self.delivery.deliver,
            base_conf,
            s.output_topic,
            s.consumer_group,
            s.dlq_topic,
            self.name,
            broker_kind,
            on_dead_letter,
            on_failure,
            s.connect_timeout_seconds,
        )

    def also_reads(self, settings: Any) -> tuple[tuple[str, str], ...]:
        """The relay reads the output topic, the outbox, in a group of its own."""
        return ((settings.output_topic, delivery_group(settings.consumer_group)),)

    def run(self, values: pa.Array, config: Any, source: Callable[[int], Source], service: str) -> tuple[list[Output], list[Rejected]]:
        raise TypeError("the notifier keeps state per input partition: it runs through run_keyed, with the partition's store")

    def run_keyed(self, batch: KeyedBatch, config: NotifierConfig, service: str) -> tuple[list[Output], list[Rejected]]:
        """One input partition's detections, with the partition's store; `tag` is the batch's end.
        Its time is its detections' (`source.timestamp_ms`), never the Kafka timestamps nor the
        wall clock (`idle_ms`): it has no timers, and a quiet partition's windows wait for detections."""
        values, source, store, tag = batch.values, batch.source, batch.store, batch.tag
        window_ms = int(config.window_seconds * 1000)
        groups: dict[tuple[str, int], list[tuple[int, dict]]] = {}
        rejected = []
        for position, value in enumerate(values.to_pylist()):
            try:
                detection = parse_object(value)
            except Refused as exc:
                rejected.append(Rejected(position, exc.reason, str(exc)))
                continue
            where = source(position)
            try:
                event_ms = int(detection["source"]["timestamp_ms"])
                detection_id(detection)
            except (KeyError, TypeError, ValueError):
                rejected.append(Rejected(position, MISSING_FIELD, "a detection needs service and source.topic, partition, offset and timestamp_ms"))
                continue
            if not where.key:
                rejected.append(Rejected(position, MISSING_FIELD, "a detection is keyed by its customer; this one has no key"))
                continue
            groups.setdefault((where.key, event_ms // window_ms), []).append((position, detection))
        if not groups:
            return [], rejected
        names = {group: window_key(*group) for group in groups}
        held = store.read(list(names.values()))
        notified = dict(zip(held.index, held["ids"], strict=True))
        outputs, changed, newest = [], {}, 0
        for (customer, window), found in groups.items():
            name = names[(customer, window)]
            ids = {detection_id(d) for _, d in found}
            event_ms = max(int(d["source"]["timestamp_ms"]) for _, d in found)
            newest = max(newest, event_ms)
            seen = notified.get(name)
            outcome = "notify" if seen is None else ("duplicate" if ids <= set(seen) else "merged")
            if outcome == "duplicate":
                continue
            changed[name] = (sorted(ids.union(seen or ())), event_ms)
            if outcome != "notify":
                continue
            unique = {detection_id(d): d for _, d in found}
            notification = {
                "customer": customer,
                "window_start": _iso(window * window_ms),
                "window_end": _iso((window + 1) * window_ms),
                "detections": list(unique.values()),
            }
            outputs.append(Output(found[0][0], notification, key=customer))
        if changed:
            names_changed = list(changed)
            new_state = pd.DataFrame({"ids": [ids for ids, _ in changed.values()]}, index=pd.Index(names_changed, dtype=object))
            store.write(store.prepare(new_state, names_changed, [ms for _, ms in changed.values()], tag=tag), tag)
        # The TTL's clock: the runtime sweeps the windows it leaves behind once the batch is done.
        store.advance(newest)
        return outputs, rejected
