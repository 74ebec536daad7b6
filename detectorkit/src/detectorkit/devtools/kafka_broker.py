"""Apache Kafka, the broker users run: a single-node KRaft broker+controller on loopback ports.

Its jars come from Maven Central, fetched once with Maven from the pom beside this module into a
cache directory (``DETECTORKIT_CACHE_DIR``, default ``~/.cache/detectorkit``); the same jars give
Kafka's own command-line tools (`run_tool`). The node's storage is formatted before its first
start; with a `data_dir` the log, the ports and so the bootstrap address survive a restart.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from detectorkit.devtools.broker_net import BrokerError, answers, free_port, port_taken, terminate
from detectorkit.devtools.maven_fetch import cache_dir, fetch_once, maven

KAFKA_VERSION = "4.2.1"

# The tools a user reaches for, by their script names in Kafka's distribution.
TOOLS = {
    "consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "topics": "org.apache.kafka.tools.TopicCommand",
    "delete-records": "org.apache.kafka.tools.DeleteRecordsCommand",
    "get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "transactions": "org.apache.kafka.tools.TransactionsCommand",
    "console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "acls": "kafka.admin.AclCommand",
}

_STATE_FILE = "detectorkit-broker.json"


def _resource(name: str) -> pathlib.Path:
    return pathlib.Path(str(resources.files("detectorkit.devtools.kafka_dist").joinpath(name)))


def kafka_libs(version: str = KAFKA_VERSION) -> pathlib.Path:
    """The directory of Kafka's runtime jars, fetched with Maven on first use."""
    target = cache_dir() / f"kafka-{version}"
    libs = target / "libs"
    if not (target / ".complete").exists() and shutil.which("java") is None:
        raise BrokerError("Apache Kafka needs Java 17 or later on PATH (e.g. apt-get install openjdk-17-jre-headless)")

    def fetch(work: pathlib.Path) -> None:
        shutil.copy(_resource("pom.xml"), work / "pom.xml")
        arguments = ["-f", str(work / "pom.xml"), "dependency:copy-dependencies", f"-Dkafka.version={version}", "-DincludeScope=runtime"]
        maven([*arguments, f"-DoutputDirectory={work / 'libs'}"], work, f"Apache Kafka {version}", BrokerError)
        shutil.rmtree(libs, ignore_errors=True)
        (work / "libs").rename(libs)

    fetch_once(target, fetch, version)
    return libs


def java_command(main_class: str, args: Sequence[str], heap: str | None = None, version: str = KAFKA_VERSION) -> list[str]:
    libs = kafka_libs(version)
    command = ["java"]
    if heap:
        command.append(f"-Xmx{heap}")
    command += [
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile=file:{_resource('log4j2.properties')}",
        "-cp",
        f"{libs}/*",
        main_class,
        *args,
    ]
    return command


def run_tool(name: str, args: Sequence[str], **run_kwargs) -> subprocess.CompletedProcess:
    """One of Kafka's command-line tools (`TOOLS`), e.g. run_tool("consumer-groups", ["--bootstrap-server", bs, "--list"])."""
    if name not in TOOLS:
        raise BrokerError(f"unknown Kafka tool {name!r}; one of: {', '.join(sorted(TOOLS))}")
    return subprocess.run(java_command(TOOLS[name], args, heap="256m"), **run_kwargs)


def cluster_id() -> str:
    """A random id as Kafka writes them. Like Kafka's own Uuid.randomUuid(), it never starts with
    '-': the storage tool would read such an id as an option (1 start in 64 failed that way)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


@dataclass
class KafkaBroker:
    """A single-node Apache Kafka (KRaft) on loopback. Use as a context manager or start()/stop().

    `sasl_users` adds a SASL_PLAINTEXT listener with PLAIN users ({name: password}) at
    `sasl_bootstrap_servers`; `tls_clients` adds an SSL listener at `ssl_bootstrap_servers` that
    requires a client certificate signed by `tls` (devtools.tls.Authority: its `issue` makes one,
    whose principal is User:CN=<name>, as Strimzi's TLS users'); `authorizer` turns ACLs on (the
    PLAINTEXT listener stays a super user, so tests can administer); `overrides` are server
    properties (e.g. offsets.retention.minutes).
    """

    data_dir: str | None = None
    port: int | None = None
    sasl_users: Mapping[str, str] | None = None
    authorizer: bool = False
    tls_clients: bool = False
    overrides: Mapping[str, str] = field(default_factory=dict)
    heap: str = "1g"
    startup_timeout: float = 90.0
    version: str = KAFKA_VERSION
    process: subprocess.Popen | None = field(default=None, init=False, repr=False)
    bootstrap_servers: str = field(default="", init=False)
    sasl_bootstrap_servers: str = field(default="", init=False)
    ssl_bootstrap_servers: str = field(default="", init=False)
    tls: Any = field(default=None, init=False, repr=False)
    _tmp: str | None = field(default=None, init=False, repr=False)
    _log: Any = field(default=None, init=False, repr=False)

    def start(self) -> KafkaBroker:
        kafka_libs(self.version)  # fetch first: that can take a minute, and is not start-up time
        if self.data_dir is None:
            self._tmp = self.data_dir = tempfile.mkdtemp(prefix="kafka-")
        data = pathlib.Path(self.data_dir)
        data.mkdir(parents=True, exist_ok=True)
        ports = self._ports(data)
        for name, port in ports.items():
            if port_taken(port):
                raise BrokerError(f"cannot start Apache Kafka: its {name} port 127.0.0.1:{port} is taken")
        self.bootstrap_servers = f"127.0.0.1:{ports['broker']}"
        self.sasl_bootstrap_servers = f"127.0.0.1:{ports['sasl']}" if "sasl" in ports else ""
        self.ssl_bootstrap_servers = f"127.0.0.1:{ports['ssl']}" if "ssl" in ports else ""
        if self.tls_clients:
            from detectorkit.devtools.tls import Authority

            self.tls = Authority(data / "tls")
            cert, key = self.tls.issue("broker", data / "tls" / "broker", host="127.0.0.1")
            # Kafka's PEM key store: the private key, then the certificate chain, in one file.
            (data / "tls" / "broker.pem").write_bytes(key.read_bytes() + cert.read_bytes())
        config = data / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self._properties(data / "log", ports).items()))
        if not (data / "log" / "meta.properties").exists():
            self._java("kafka.tools.StorageTool", ["format", "--standalone", "-t", cluster_id(), "-c", str(config)], what="formatting its storage")
        self._log = open(data / "broker.log", "ab")  # noqa: SIM115 - open while the broker runs
        self.process = subprocess.Popen(
            java_command("kafka.Kafka", [str(config)], heap=self.heap, version=self.version),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C meant for a job must not kill the broker under it
        )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BrokerError(f"Apache Kafka exited at start: {self._log_tail()}")
            if answers(self.bootstrap_servers, timeout=1.0):
                return self
            time.sleep(0.1)
        self.stop()
        raise BrokerError(f"Apache Kafka did not answer on {self.bootstrap_servers} within {self.startup_timeout:.0f} s: {self._log_tail()}")

    def _ports(self, data: pathlib.Path) -> dict[str, int]:
        # The controller's address is written into the formatted log: a restart must reuse it.
        state = data / _STATE_FILE
        if state.exists():
            return json.loads(state.read_text())
        ports = {"broker": self.port or free_port(), "controller": free_port()}
        if self.sasl_users:
            ports["sasl"] = free_port()
        if self.tls_clients:
            ports["ssl"] = free_port()
        state.write_text(json.dumps(ports))
        return ports

    def _properties(self, log_dir: pathlib.Path, ports: Mapping[str, int]) -> dict[str, str]:
        listeners = [f"PLAINTEXT://127.0.0.1:{ports['broker']}", f"CONTROLLER://127.0.0.1:{ports['controller']}"]
        protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{ports['controller']}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(log_dir),
            "num.partitions": "1",
            # One node: the internal topics cannot have more replicas than that.
            "offsets.topic.replication.factor": "1",
            # One node: 50 partitions each (the defaults) only make the first group's start slow.
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            # A transaction past its timeout is aborted within a second instead of ten: a test (and a
            # developer) sees the timeout's effect soon after it passes.
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # Tests and demos create groups all the time; the default 3 s delay only slows them.
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            # No deletion by age: time retention goes by the records' timestamps, and a record's
            # event time may be days old (the samples, a backfill through the normaliser), so the
            # 7-day default deleted outputs soon after they were written (at the first retention
            # check, 30 s after the start), under a test that then read them.
            "log.retention.ms": "-1",
        }
        advertised = [f"PLAINTEXT://127.0.0.1:{ports['broker']}"]
        if self.sasl_users:
            listeners.append(f"SASL_PLAINTEXT://127.0.0.1:{ports['sasl']}")
            advertised.append(f"SASL_PLAINTEXT://127.0.0.1:{ports['sasl']}")
            protocols.append("SASL_PLAINTEXT:SASL_PLAINTEXT")
            users = " ".join(f'user_{name}="{password}"' for name, password in self.sasl_users.items())
            props["sasl.enabled.mechanisms"] = "PLAIN"
            props["listener.name.sasl_plaintext.plain.sasl.jaas.config"] = (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};"
            )
        if self.tls_clients:
            listeners.append(f"SSL://127.0.0.1:{ports['ssl']}")
            advertised.append(f"SSL://127.0.0.1:{ports['ssl']}")
            protocols.append("SSL:SSL")
            tls = log_dir.parent / "tls"
            props.update(
                {
                    "listener.name.ssl.ssl.keystore.type": "PEM",
                    "listener.name.ssl.ssl.keystore.location": str(tls / "broker.pem"),
                    "listener.name.ssl.ssl.truststore.type": "PEM",
                    "listener.name.ssl.ssl.truststore.location": str(tls / "ca.crt"),
                    "listener.name.ssl.ssl.client.auth": "required",
                }
            )
        if self.authorizer:
            props["authorizer.class.name"] = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
            # The PLAINTEXT and controller listeners are unauthenticated: that principal administers.
            props["super.users"] = "User:ANONYMOUS"
        props["listeners"] = ",".join(listeners)
        props["advertised.listeners"] = ",".join(advertised)
        props["listener.security.protocol.map"] = ",".join(protocols)
        props.update({k: str(v) for k, v in self.overrides.items()})
        return props

    def _java(self, main_class: str, args: list[str], what: str) -> None:
        done = subprocess.run(java_command(main_class, args, heap="256m", version=self.version), capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise BrokerError(f"Apache Kafka failed {what}: {(done.stdout + done.stderr).strip()[-1000:]}")

    def _log_tail(self) -> str:
        try:
            lines = (pathlib.Path(self.data_dir) / "broker.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        errors = [line for line in lines if " ERROR " in line or "Exception" in line]
        return " | ".join((errors or lines)[-3:]) or "no message"

    def kill(self) -> None:
        """SIGKILL, as a crash would: the log stays as it was (for restart tests)."""
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop(self, timeout: float = 30.0) -> None:
        proc, self.process = self.process, None
        terminate(proc, timeout)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = self.data_dir = None

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
