"""The worker-side client cache: reuse within a process, close when idle, drop after a failure."""

import pytest

from detectorkit.kafka.worker_clients import WorkerClients


class Client:
    def __init__(self):
        self.closed = False


@pytest.fixture
def cache():
    closed = []
    return WorkerClients(close=lambda c: (setattr(c, "closed", True), closed.append(c)), idle_seconds=30), closed


def test_a_client_is_reused_by_the_next_task(cache):
    clients, _ = cache
    with clients.use("k", Client) as first:
        pass
    with clients.use("k", Client) as second:
        assert second is first
    with clients.use("other", Client) as third:
        assert third is not first
    assert len(clients) == 2


def test_idle_clients_are_closed_and_busy_ones_never(cache):
    clients, closed = cache
    with clients.use("idle", Client) as idle:
        pass
    with clients.use("busy", Client) as busy:
        assert clients.close_idle(now=10**9) == 1  # far in the future: "idle" is stale, "busy" is in use
        assert idle.closed and not busy.closed
    assert closed == [idle]
    with clients.use("idle", Client) as again:
        assert again is not idle and not again.closed


def test_a_client_that_failed_is_closed_and_not_reused(cache):
    clients, closed = cache
    with pytest.raises(RuntimeError), clients.use("k", Client) as failed:
        raise RuntimeError("delivery failed")
    assert closed == [failed]
    with clients.use("k", Client) as fresh:
        assert fresh is not failed
