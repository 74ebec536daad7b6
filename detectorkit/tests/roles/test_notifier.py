"""The downstream notifier's rules without Spark or Kafka: one notification per customer and
window, duplicates dropped, bounded state restored from its changelog, deliveries retried."""

import http.server
import json
import threading

import pyarrow as pa
import pytest

from detectorkit.roles import notifier as nt
from detectorkit.runtime import records as rec
from detectorkit.runtime.stage import Source
from detectorkit.settings import SettingsError

HOUR_MS = 3_600_000
T0 = 1_795_000_000_000 // HOUR_MS * HOUR_MS  # the start of an hour


def detection(service, offset, ts, partition=0):
    return {"service": service, "detection": {"amount": 2000},
            "source": {"topic": "records", "partition": partition, "offset": offset, "timestamp_ms": ts}}


def run(notifier, items, partition=0):
    """items: (customer key, detection dict or raw bytes)"""
    values = pa.array([json.dumps(d).encode() if isinstance(d, dict) else d for _, d in items], pa.binary())
    return notifier.run(values, nt.NotifierConfig(), lambda p: Source("detections", partition, 100 + p, 0, items[p][0]), "notifier")


def fresh():
    n = nt.Notifier(delivery=nt.LogDelivery())
    n.prepare(nt.NotifierConfig(window_seconds=3600, horizon_seconds=3 * 3600))
    return n


def test_one_notification_per_customer_and_window_across_batches_and_duplicates():
    n = fresh()
    out, rejected = run(n, [("c-1", detection("threshold", 5, T0 + 10)), ("c-1", detection("burst", 6, T0 + 20)),
                            ("c-2", detection("threshold", 7, T0 + 30)), ("c-1", detection("threshold", 5, T0 + 10))])
    assert rejected == []
    assert sorted(o.key for o in out) == ["c-1", "c-2"]
    c1 = next(o.value for o in out if o.key == "c-1")
    assert len(c1["detections"]) == 2  # the replayed copy of offset 5 counted once
    assert c1["window_start"].endswith(":00:00.000Z") and c1["window_end"] > c1["window_start"]
    # A later batch: the same detection again (a replay), and a new one, in the same window.
    out, _ = run(n, [("c-1", detection("threshold", 5, T0 + 10))])
    assert out == [] and n.counts["duplicate"] == 1
    out, _ = run(n, [("c-1", detection("threshold", 9, T0 + 50))])
    assert out == [] and n.counts["merged"] == 1
    # The next hour is another window.
    out, _ = run(n, [("c-1", detection("threshold", 11, T0 + HOUR_MS + 1))])
    assert [o.key for o in out] == ["c-1"]


def test_state_is_bounded_by_the_horizon_and_restored_from_its_changelog():
    n = fresh()
    for hour in range(10):
        run(n, [(f"c-{hour}", detection("threshold", hour, T0 + hour * HOUR_MS))])
    assert n.state.size() <= 4  # windows within 3 h of the newest, and the newest
    changelog = n.state.take_changes()
    assert any(value is None for _, _, value in changelog)  # evicted windows are deleted

    again = fresh()
    again.state.restore(0, [(key, value) for p, key, value in changelog if p == 0])
    assert again.state.partitions[0].windows == n.state.partitions[0].windows
    out, _ = run(again, [("c-9", detection("threshold", 9, T0 + 9 * HOUR_MS))])
    assert out == [] and again.counts["duplicate"] == 1  # notified before the restart: not again


def test_what_is_no_detection_is_a_dead_letter():
    n = fresh()
    out, rejected = run(n, [("c-1", b"{nope"), ("c-1", b"[1]"), ("c-1", {"service": "x"}), (None, detection("t", 1, T0))])
    assert out == []
    assert [r.reason for r in rejected] == [rec.MALFORMED_JSON, rec.NOT_AN_OBJECT, rec.MISSING_FIELD, rec.MISSING_FIELD]


class Receiver(http.server.BaseHTTPRequestHandler):
    answers: list = []
    received: list = []

    def do_POST(self):  # noqa: N802 - the name http.server calls
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        code = self.answers.pop(0) if self.answers else 200
        type(self).received.append((code, body))
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver():
    Receiver.answers, Receiver.received = [], []
    server = http.server.HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hook", Receiver
    server.shutdown()


def test_the_webhook_retries_server_errors_then_gives_up_with_the_reason(receiver):
    url, seen = receiver
    hook = nt.WebhookDelivery(url, attempts=3, sleep=lambda s: None)
    seen.answers = [503, 500]
    hook.deliver({"customer": "c-1"})
    assert [code for code, _ in seen.received] == [503, 500, 200]
    seen.answers, seen.received[:] = [500, 500, 500], []
    with pytest.raises(RuntimeError, match="failed 3 time"):
        hook.deliver({"customer": "c-2"})
    seen.answers, seen.received[:] = [400], []
    with pytest.raises(RuntimeError, match="HTTP 400"):
        hook.deliver({"customer": "c-3"})
    assert len(seen.received) == 1  # a refusal is not retried


@pytest.mark.parametrize(("env", "says"), [
    ({"NOTIFIER_DELIVERY": "pigeon"}, "log or webhook"),
    ({"NOTIFIER_DELIVERY": "webhook"}, "NOTIFIER_WEBHOOK_URL"),
    ({"NOTIFIER_WINDOW_SECONDS": "soon"}, "NOTIFIER_WINDOW_SECONDS='soon'"),
    ({"NOTIFIER_WINDOW_SECONDS": "7200", "NOTIFIER_HORIZON_SECONDS": "60"}, "HORIZON"),
])
def test_a_wrong_notifier_setting_is_one_line(env, says):
    with pytest.raises(SettingsError, match=says):
        nt.NotifierConfig.from_env(env)
