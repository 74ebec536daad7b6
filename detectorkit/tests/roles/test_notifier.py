"""The downstream notifier's rules without Spark or Kafka: one notification per customer and
window, duplicates dropped, bounded state restored from its changelog, deliveries retried."""

import contextlib
import email.utils
import http.server
import json
import random
import socket
import threading
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from detectorkit import records as rec
from detectorkit.kafka import offset_store, range_reader
from detectorkit.kafka.access import KafkaAccess
from detectorkit.kafka.planning import PartitionRange
from detectorkit.kafka.range_reader import arrow_schema
from detectorkit.roles import notifier as nt
from detectorkit.runtime import processing, task_result
from detectorkit.runtime.stage import KeyedBatch, Source
from detectorkit.runtime.task_context import TaskContext
from detectorkit.runtime.task_stores import TaskStores
from detectorkit.runtime.writers import AtLeastOnceWriter
from detectorkit.settings import SettingsError
from detectorkit.state import cache, changelog, codec
from detectorkit.state.changelog import StateContext
from detectorkit.state.store import PartitionStore

from ..tasks import run_task

HOUR_MS = 3_600_000
T0 = 1_795_000_000_000 // HOUR_MS * HOUR_MS  # the start of an hour
CONFIG = nt.NotifierConfig(window_seconds=3600, horizon_seconds=3 * 3600)


def detection(service, offset, ts, partition=0):
    return {
        "service": service,
        "detection": {"amount": 2000},
        "source": {"topic": "records", "partition": partition, "offset": offset, "timestamp_ms": ts},
    }


def run(notifier, store, items):
    """items: (customer key, detection dict or raw bytes), one partition's batch; then the
    partition's expiry, as the runtime sweeps it at the batch's end."""
    values = pa.array([json.dumps(d).encode() if isinstance(d, dict) else d for _, d in items], pa.binary())
    keys = pa.array([None if c is None else c.encode() for c, _ in items], pa.binary())
    start = max(store.position, 100)
    tag = start + len(items)  # the batch's end

    def where(position):
        return Source("detections", store.partition, start + position, 0, items[position][0])

    batch = KeyedBatch(values, keys, np.zeros(len(items), "int64"), where, store, tag, "detections")
    found = notifier.run_keyed(batch, CONFIG, "notifier")
    store.expire(tag)
    return found


def fresh():
    n = nt.Notifier(delivery=nt.LogDelivery())
    n.prepare(CONFIG)
    return n, PartitionStore(n.state, 0)


def test_one_notification_per_customer_and_window_across_batches_and_duplicates():
    n, store = fresh()
    out, rejected = run(
        n,
        store,
        [
            ("c-1", detection("threshold", 5, T0 + 10)),
            ("c-1", detection("burst", 6, T0 + 20)),
            ("c-2", detection("threshold", 7, T0 + 30)),
            ("c-1", detection("threshold", 5, T0 + 10)),
        ],
    )
    assert rejected == []
    assert sorted(o.key for o in out) == ["c-1", "c-2"]
    c1 = next(o.value for o in out if o.key == "c-1")
    assert len(c1["detections"]) == 2  # the replayed copy of offset 5 counted once
    assert c1["window_start"].endswith(":00:00.000Z") and c1["window_end"] > c1["window_start"]
    # A later batch: the same detection again (a replay), and a new one, in the same window.
    window = f"c-1|{T0 // HOUR_MS}"
    ids = store.values_of(window)["ids"]
    out, _ = run(n, store, [("c-1", detection("threshold", 5, T0 + 10))])
    assert out == [] and store.values_of(window)["ids"] == ids  # a duplicate: nothing changes
    out, _ = run(n, store, [("c-1", detection("threshold", 9, T0 + 50))])
    assert out == [] and store.values_of(window)["ids"] == sorted([*ids, "threshold|records|0|9"])  # merged, not notified
    # The next hour is another window.
    out, _ = run(n, store, [("c-1", detection("threshold", 11, T0 + HOUR_MS + 1))])
    assert [o.key for o in out] == ["c-1"]


def test_state_is_bounded_by_the_horizon_and_restored_from_its_changelog():
    n, store = fresh()
    changelog = []
    for hour in range(10):
        run(n, store, [(f"c-{hour}", detection("threshold", hour, T0 + hour * HOUR_MS))])
        changelog += [(key, value, store.position) for key, value in store.take_changes()]
    assert len(store) == 4  # windows whose newest detection is within 3 h of the partition's newest
    assert any(value is None for _, value, _ in changelog)  # windows past the horizon are deleted

    again, restored = fresh()
    restored.restore([(key, value, tag, offset) for offset, (key, value, tag) in enumerate(changelog)], store.position)
    assert restored.snapshot() == store.snapshot()
    out, _ = run(again, restored, [("c-9", detection("threshold", 9, T0 + 9 * HOUR_MS))])
    assert out == [] and restored.snapshot() == store.snapshot()  # notified before the restart: not again


def test_a_detection_within_the_horizon_is_never_notified_twice_and_one_past_it_may_be():
    n, store = fresh()
    run(n, store, [("c-1", detection("threshold", 1, T0 + 10))])
    run(n, store, [("c-2", detection("threshold", 2, T0 + 10 + 3 * HOUR_MS))])  # exactly the horizon later
    out, _ = run(n, store, [("c-1", detection("threshold", 1, T0 + 10))])
    assert out == []
    run(n, store, [("c-2", detection("threshold", 3, T0 + 11 + 3 * HOUR_MS))])  # a millisecond past it: c-1's window leaves
    out, _ = run(n, store, [("c-1", detection("threshold", 1, T0 + 10))])
    assert [o.key for o in out] == ["c-1"]  # a duplicate, not a lost notification


def test_what_is_no_detection_is_a_dead_letter():
    n, store = fresh()
    out, rejected = run(n, store, [("c-1", b"{nope"), ("c-1", b"[1]"), ("c-1", {"service": "x"}), (None, detection("t", 1, T0))])
    assert out == []
    assert [r.reason for r in rejected] == [rec.MALFORMED_JSON, rec.NOT_AN_OBJECT, rec.MISSING_FIELD, rec.MISSING_FIELD]


class Receiver(http.server.BaseHTTPRequestHandler):
    """A webhook receiver: answers from `answers` (a code, or a code and headers), then 200."""

    protocol_version = "HTTP/1.1"  # keeps the connection open between requests, as real receivers do
    answers: list = []
    received: list = []  # (code answered, body, the request's headers)

    def do_POST(self):  # noqa: N802 - the name http.server calls
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        answer = self.answers.pop(0) if self.answers else 200
        code, headers = answer if isinstance(answer, tuple) else (answer, {})
        type(self).received.append((code, body, dict(self.headers)))
        self.send_response(code)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


class CountingServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    connections = 0  # TCP connections accepted

    def get_request(self):
        request = super().get_request()
        self.connections += 1
        return request


@pytest.fixture
def receiver():
    Receiver.answers, Receiver.received = [], []
    server = CountingServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hook", Receiver, server
    server.shutdown()
    server.server_close()


class Waits:
    """Stands in for time.sleep: records what the delivery asked for, sleeps not at all."""

    def __init__(self):
        self.asked = []

    def __call__(self, seconds):
        self.asked.append(seconds)


def notification(customer="c-1", hour=0):
    return {
        "customer": customer,
        "window_start": nt._iso(T0 + hour * HOUR_MS),
        "window_end": nt._iso(T0 + (hour + 1) * HOUR_MS),
        "detections": [detection("threshold", hour, T0 + hour * HOUR_MS)],
    }


def test_the_webhook_retries_server_errors_then_gives_up_with_the_reason(receiver):
    url, seen, _ = receiver
    hook = nt.WebhookDelivery(url, attempts=3, sleep=Waits())
    seen.answers = [503, 500]
    hook.deliver(notification("c-1"))
    assert [code for code, _, _ in seen.received] == [503, 500, 200]
    seen.answers, seen.received[:] = [500, 500, 500], []
    with pytest.raises(RuntimeError, match="failed 3 time"):
        hook.deliver(notification("c-2"))


@pytest.mark.parametrize(
    ("code", "retried"), [(400, False), (401, False), (404, False), (422, False), (408, True), (429, True), (500, True), (503, True)]
)
def test_only_a_timeout_a_throttle_or_a_server_error_is_retried(receiver, code, retried):
    url, seen, _ = receiver
    seen.answers = [code]
    hook = nt.WebhookDelivery(url, attempts=3, sleep=Waits())
    if retried:
        hook.deliver(notification())
        assert [c for c, _, _ in seen.received] == [code, 200]
    else:
        with pytest.raises(RuntimeError, match=f"HTTP {code}"):
            hook.deliver(notification())
        assert len(seen.received) == 1  # the receiver refuses it: asking again will not help


def test_one_connection_is_kept_alive_across_deliveries(receiver):
    url, seen, server = receiver
    hook = nt.WebhookDelivery(url, sleep=Waits())
    for hour in range(10):
        hook.deliver(notification(hour=hour))
    assert len(seen.received) == 10
    assert server.connections == 1
    hook.close()


def test_retry_after_in_seconds_is_waited_at_least_and_capped(receiver):
    url, seen, _ = receiver
    waits = Waits()
    hook = nt.WebhookDelivery(url, attempts=3, backoff_base=0.01, backoff_cap=5.0, sleep=waits)
    seen.answers = [(503, {"Retry-After": "1"})]
    hook.deliver(notification())
    assert [c for c, _, _ in seen.received] == [503, 200]
    assert waits.asked and waits.asked[0] >= 1.0
    # A receiver asking for an hour holds the driver's batch no longer than the cap.
    seen.answers, waits.asked[:] = [(429, {"Retry-After": "3600"})], []
    hook.deliver(notification())
    assert waits.asked == [5.0]


def test_retry_after_as_an_http_date_is_waited_until_then(receiver):
    url, seen, _ = receiver
    now = 1_800_000_000.0
    waits = Waits()
    hook = nt.WebhookDelivery(url, attempts=2, backoff_base=0.01, backoff_cap=60.0, sleep=waits, clock=lambda: now)
    seen.answers = [(503, {"Retry-After": email.utils.formatdate(now + 7, usegmt=True)})]
    hook.deliver(notification())
    assert waits.asked == [pytest.approx(7.0, abs=1.0)]
    # A date already past: no wait beyond the backoff's.
    seen.answers, waits.asked[:] = [(503, {"Retry-After": email.utils.formatdate(now - 60, usegmt=True)})], []
    hook.deliver(notification())
    assert len(waits.asked) == 1 and 0 <= waits.asked[0] <= 0.01


def test_backoff_grows_exponentially_with_full_jitter_up_to_the_cap(receiver):
    url, seen, _ = receiver
    base, cap, attempts = 0.1, 1.0, 7
    ceilings = [min(cap, base * 2**n) for n in range(attempts - 1)]  # 0.1 0.2 0.4 0.8 1.0 1.0
    # The highest draw of the jitter shows the ceilings: doubling, then the cap.
    waits = Waits()
    seen.answers = [503] * attempts
    with pytest.raises(RuntimeError, match=f"failed {attempts} time"):
        nt.WebhookDelivery(url, attempts=attempts, backoff_base=base, backoff_cap=cap, sleep=waits, random=lambda: 1.0).deliver(notification())
    assert waits.asked == pytest.approx(ceilings)
    # Real draws: each wait anywhere in [0, its ceiling], and no two retries in lockstep.
    draws = random.Random(22)
    asked = []
    for _ in range(20):
        waits = Waits()
        seen.answers = [503] * attempts
        with pytest.raises(RuntimeError):
            nt.WebhookDelivery(url, attempts=attempts, backoff_base=base, backoff_cap=cap, sleep=waits, random=draws.random).deliver(notification())
        assert all(0 <= w <= c for w, c in zip(waits.asked, ceilings, strict=True))
        asked.append(tuple(waits.asked))
    assert len(set(asked)) == len(asked)
    assert max(run[-1] for run in asked) > ceilings[0]  # late retries wait longer than the first could


def test_connection_errors_are_retried_with_backoff():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/hook"
    waits = Waits()
    with pytest.raises(RuntimeError, match="failed 3 time") as failure:
        nt.WebhookDelivery(url, attempts=3, sleep=waits).deliver(notification())
    assert len(waits.asked) == 2
    assert url not in str(failure.value)  # a webhook's path often holds its secret: the reason names the host only


def test_the_idempotency_key_is_the_notifications_identity(receiver):
    url, seen, _ = receiver
    hook = nt.WebhookDelivery(url, sleep=Waits())
    first = notification("c-1", hour=0)
    replay = {**first, "detections": first["detections"] * 2}  # a replay may bring more of the window's detections
    for n in (first, replay, notification("c-2", hour=0), notification("c-1", hour=1)):
        hook.deliver(n)
    # A restarted notifier (a new delivery, a new process) sends the same key for the same window.
    nt.WebhookDelivery(url, sleep=Waits()).deliver(json.loads(json.dumps(first)))
    keys = [headers.get("Idempotency-Key") for _, _, headers in seen.received]
    assert all(keys)
    assert keys[0] == keys[1] == keys[4]
    assert len({keys[0], keys[2], keys[3]}) == 3
    # Retries of one notification carry its key too.
    seen.answers, seen.received[:] = [503], []
    hook.deliver(first)
    assert [headers["Idempotency-Key"] for _, _, headers in seen.received] == [keys[0], keys[0]]


def test_webhook_backoff_settings():
    config = nt.NotifierConfig.from_env(
        {
            "NOTIFIER_DELIVERY": "webhook",
            "NOTIFIER_WEBHOOK_URL": "http://hooks.example/x",
            "NOTIFIER_WEBHOOK_BACKOFF_BASE_SECONDS": "0.2",
            "NOTIFIER_WEBHOOK_BACKOFF_CAP_SECONDS": "10",
        }
    )
    hook = nt.delivery_for(config)
    assert (hook.backoff_base, hook.backoff_cap, hook.attempts) == (0.2, 10.0, 3)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"NOTIFIER_DELIVERY": "pigeon"}, "log or webhook"),
        ({"NOTIFIER_DELIVERY": "webhook"}, "NOTIFIER_WEBHOOK_URL"),
        ({"NOTIFIER_WINDOW_SECONDS": "soon"}, "NOTIFIER_WINDOW_SECONDS='soon'"),
        ({"NOTIFIER_WINDOW_SECONDS": "7200", "NOTIFIER_HORIZON_SECONDS": "60"}, "HORIZON"),
        ({"NOTIFIER_WEBHOOK_BACKOFF_BASE_SECONDS": "2", "NOTIFIER_WEBHOOK_BACKOFF_CAP_SECONDS": "1"}, "BACKOFF_CAP"),
        ({"NOTIFIER_WEBHOOK_BACKOFF_BASE_SECONDS": "0"}, "BACKOFF_BASE"),
    ],
)
def test_a_wrong_notifier_setting_is_one_line(env, says):
    with pytest.raises(SettingsError, match=says):
        nt.NotifierConfig.from_env(env)


# ---- the notifier in the driver: its windows in the runtime's state stores --------------------


class DriverKafka:
    """The driver's Kafka: what is sent and flushed, and the changelog topics, which outlive a
    process (a "process" is the stores' cache, replaced by `restart`)."""

    def __init__(self, monkeypatch):
        self.events, self.topics = [], {}
        self.monkeypatch = monkeypatch
        self.failing_flushes = 0  # flushes to fail from now on
        kafka = self

        class Sink:
            def send(self, topic, key, value, headers=None, partition=None, timestamp_ms=None):
                kafka.events.append(("send", topic, key, value, dict(headers or []), partition))
                if topic.endswith((".notifications", ".state")):
                    kafka.topics.setdefault(topic, {}).setdefault(partition, []).append((key.decode(), value, dict(headers or [])))

            def send_all(self, topic, partition, records, headers):
                for key, value in records:
                    self.send(topic, key.encode(), value, headers, partition)

            def send_batch(self, topic, partition, records):
                self.send_all(topic, partition, records, None)

            def flush(self, timeout):
                kafka.events.append(("flush",))
                if kafka.failing_flushes:
                    kafka.failing_flushes -= 1
                    raise RuntimeError("broker gone")

        @contextlib.contextmanager
        def for_worker(conf, idle=None):
            yield Sink()

        topics = self.topics

        class Reader:
            """changelog.read over the fake topics (offset = position): each partition to its end;
            a restart reads a partition again from its first record."""

            def __init__(self, ctx, starts):
                self.topic, self.starts, self.restarts = ctx.topic, dict(starts), []

            def restart(self, partition):
                self.restarts.append(partition)

            def __iter__(self):
                todo = list(self.starts.items())
                while todo:
                    p, start = todo.pop(0)
                    log = topics.get(self.topic, {}).get(p, [])
                    tags = [codec.tag_of(list(h.items()), v) for _, v, h in log]
                    records = [(k, v, tag, o) for o, ((k, v, _), tag) in enumerate(zip(log, tags, strict=True)) if o >= (start or 0)]
                    yield changelog.Part(p, records, len(log))
                    todo += [(q, None) for q in self.restarts]
                    self.restarts.clear()

        def ends(ctx, partitions):
            return {p: len(topics.get(ctx.topic, {}).get(p, [])) for p in partitions}

        monkeypatch.setattr(processing.sinks, "for_worker", for_worker)
        # The group's commits carry no changelog position: the changelog reflects the committed offset.
        monkeypatch.setattr(offset_store, "committed_durable", lambda conf, group, topic, partitions, timeout: dict.fromkeys(partitions))
        monkeypatch.setattr(changelog, "read", Reader)
        monkeypatch.setattr(changelog, "ends", ends)
        self.restart()

    def restart(self):
        self.monkeypatch.setattr(cache, "_stores", {})

    def sent(self, topic):
        return [e for e in self.events if e[0] == "send" and e[1] == topic]


@pytest.fixture
def driver_kafka(monkeypatch):
    return DriverKafka(monkeypatch)


GROUP = "notifier-group"


def task_batch(notifier, kafka, monkeypatch, items, start, partition=0):
    """One read of the notifier as a slice's task runs it (at-least-once): `items` ((customer,
    detection)) at offsets start.. of `partition`, its range planned from `start`; the task's results."""
    n = len(items)
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([c.encode() for c, _ in items], pa.binary()),
            pa.array([json.dumps(d).encode() for _, d in items], pa.binary()),
            pa.array(["detections"] * n),
            pa.array([partition] * n, pa.int32()),
            pa.array(range(start, start + n), pa.int64()),
            pa.array([T0 * 1000] * n, pa.timestamp("us", tz="UTC")),
        ],
        schema=arrow_schema(),
    )
    monkeypatch.setattr(range_reader, "read_planned", lambda source, ranges: iter([batch]))
    state = StateContext(f"{GROUP}.notifications", KafkaAccess({}, GROUP, 5.0), 600.0, 60.0, "detections")
    ctx = TaskContext("notifier", notifier, CONFIG, KafkaAccess({}, GROUP, 5.0), "notifications", "notifier.dlq", state=state)
    source = SimpleNamespace(client_conf={}, group=GROUP, topic="detections")
    ranges = [PartitionRange("detections", partition, start, start + n)]
    with AtLeastOnceWriter(ctx) as writer:
        stores = TaskStores.open(ctx, ranges, source)
        return task_result.rows_of(run_task(ctx, iter([batch]), {partition: start + n}, stores, writer))


def prepared():
    n = nt.Notifier()
    n.prepare(CONFIG)
    return n


def notified(kafka):
    return [json.loads(e[3])["customer"] for e in kafka.sent("notifications")]


def test_the_notifiers_windows_are_state_in_its_own_changelog_and_show_in_the_state_summary(driver_kafka, monkeypatch):
    n = prepared()
    assert n.state.changelog_topic(GROUP) == f"{GROUP}.notifications"  # not `.state`: earlier versions wrote another format there
    items = [("c-1", detection("threshold", 5, T0 + 10)), ("c-1", detection("burst", 6, T0 + 20)), ("c-2", detection("threshold", 7, T0 + 30))]
    rows = task_batch(n, driver_kafka, monkeypatch, items, start=100)
    assert sorted(notified(driver_kafka)) == ["c-1", "c-2"]  # the outbox: delivered by the relay once committed
    state = rows[0].state
    assert state["keys"] == 2 and state["bytes"] > 0 and state["written"] >= 2
    written = {k: v for k, v, _ in driver_kafka.topics[f"{GROUP}.notifications"][0]}
    window = T0 // HOUR_MS
    assert json.loads(written[f"c-1|{window}"])["state"]["ids"] == sorted(nt.detection_id(d) for _, d in items[:2])
    # Every change carries the batch's end: a restore knows whether the group committed it.
    assert {codec.tag_of(list(h.items()), v) for _, v, h in driver_kafka.topics[f"{GROUP}.notifications"][0]} == {103}
    # The notifications are flushed before the state's changes that stand for them are sent.
    kinds = [e[1] if e[0] == "send" else "flush" for e in driver_kafka.events]
    assert kinds.index("flush") > max(i for i, k in enumerate(kinds) if k == "notifications")
    assert kinds.index("flush") < min(i for i, k in enumerate(kinds) if k == f"{GROUP}.notifications")


def test_a_restarted_notifier_reads_its_windows_back_from_the_changelog(driver_kafka, monkeypatch):
    task_batch(prepared(), driver_kafka, monkeypatch, [("c-1", detection("threshold", 5, T0 + 10))], start=100)
    driver_kafka.restart()  # a new process (or the instance the partition was handed to): no store in memory
    before = len(notified(driver_kafka))
    rows = task_batch(prepared(), driver_kafka, monkeypatch, [("c-1", detection("threshold", 5, T0 + 10))], start=101)  # a replay
    assert len(notified(driver_kafka)) == before and rows[0].state["restored"] > 0
    task_batch(prepared(), driver_kafka, monkeypatch, [("c-1", detection("threshold", 8, T0 + HOUR_MS))], start=102)
    assert notified(driver_kafka)[before:] == ["c-1"]  # its next window


@pytest.mark.parametrize("restart", [False, True], ids=["the-batch-retried-in-the-same-process", "a-new-process"])
def test_a_crash_after_the_state_is_written_and_before_the_commit_loses_no_notification(driver_kafka, monkeypatch, restart):
    """A batch writes its notifications, then its windows' changes, and dies before its offsets are
    committed: the changelog says "notified", and the notification may never reach the relay's
    reader (at-least-once: the batch is read again). The changes carry the batch's end, past the
    group's committed offset, so the replay reads the state without them and notifies again."""
    items = [("c-1", detection("threshold", 5, T0 + 10))]
    task_batch(prepared(), driver_kafka, monkeypatch, items, start=100)  # nothing committed after it
    assert f"c-1|{T0 // HOUR_MS}" in {k for k, _, _ in driver_kafka.topics[f"{GROUP}.notifications"][0]}
    if restart:
        driver_kafka.restart()
    task_batch(prepared(), driver_kafka, monkeypatch, items, start=100)  # the batch again, from the committed offset
    assert notified(driver_kafka) == ["c-1", "c-1"]


def test_a_batch_whose_notifications_were_not_written_leaves_no_state_behind(driver_kafka, monkeypatch):
    """The notifications' flush fails: the batch fails before any state change is sent, so its
    replay notifies."""
    items = [("c-1", detection("threshold", 5, T0 + 10))]
    driver_kafka.failing_flushes = 1
    with pytest.raises(RuntimeError, match="broker gone"):
        task_batch(prepared(), driver_kafka, monkeypatch, items, start=100)
    assert f"{GROUP}.notifications" not in driver_kafka.topics
    task_batch(prepared(), driver_kafka, monkeypatch, items, start=100)  # the query restarted from the committed offset
    assert notified(driver_kafka) == ["c-1", "c-1"]  # the failed batch's unflushed copy, and the replay's
