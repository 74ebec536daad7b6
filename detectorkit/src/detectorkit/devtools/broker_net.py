"""What the servers the dev tools launch (embedded_broker's Tansu, kafka_broker's Apache Kafka,
schema_registry's Apicurio) share: the error a broker raises when it cannot start, the loopback
ports they take and wait on, and their stop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess


class BrokerError(RuntimeError):
    """A broker could not be started."""


def terminate(proc: subprocess.Popen | None, timeout: float) -> None:
    """SIGTERM (a controlled shutdown), then after `timeout` SIGKILL: to the process's group when it
    leads one of its own (started with start_new_session), else to the process."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            leads = os.getpgid(proc.pid) == proc.pid
        except ProcessLookupError:
            leads = False
        os.killpg(proc.pid, signal.SIGKILL) if leads else proc.kill()
        proc.wait()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_taken(port: int) -> bool:
    # Tansu binds with SO_REUSEPORT: it would share a taken port with another broker, not fail.
    # SO_REUSEADDR, as Kafka binds: connections of a killed broker left in TIME_WAIT do not count.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def answers(bootstrap: str, timeout: float) -> bool:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 1000, "log_level": 0})
    try:
        admin.list_topics(timeout=timeout)
        return True
    except Exception:
        return False
