"""What the project's two brokers (embedded_broker's Tansu, kafka_broker's Apache Kafka) share: the
error they raise when they cannot start, and the loopback ports they take and wait on."""

from __future__ import annotations

import socket


class BrokerError(RuntimeError):
    """A broker could not be started."""


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
