"""`detectorkit cluster --workers N`: a Spark standalone cluster on this machine, from the pyspark
distribution's own `spark-class` (no separate Spark download): a master and N workers, the master
URL printed, everything stopped cleanly on SIGTERM/SIGINT.

A service runs on it with SPARK_MASTER=spark://127.0.0.1:<port>. The workers' Python is
`--python` (default: this interpreter); give them an environment without the service to prove that
its code reaches the executors with the job.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from importlib import resources

from detectorkit.devtools.embedded_broker import free_port


def worker_requirements() -> list[str]:
    """detectorkit's own dependencies, pinned to the versions installed here: what a workers'
    environment needs. Not detectorkit itself, nor any service: jobs ship those (runtime/shipping)."""
    from importlib import metadata

    from detectorkit.runtime.shipping import runtime_requirements

    return [f"{name}=={metadata.version(name)}" for name in runtime_requirements("detectorkit")]


def make_workers_env(path: pathlib.Path) -> pathlib.Path:
    """A virtual environment at `path` with `worker_requirements()` (made once); its Python."""
    python = path / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *worker_requirements()], check=True)
    return python


def spark_class() -> str:
    import pyspark

    return str(pathlib.Path(pyspark.__file__).parent / "bin" / "spark-class")


@dataclass
class LocalCluster:
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    python: str = sys.executable
    work_dir: str | None = None
    port: int = 0
    ui_port: int = 0
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        # SPARK_CONF_DIR is on the executors' class path: their log4j2.properties comes from there,
        # as on a real cluster's workers (a driver's file path means nothing on another machine).
        return {
            **os.environ,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": self.python,
            "SPARK_NO_DAEMONIZE": "1",
            "SPARK_CONF_DIR": str(pathlib.Path(self.work_dir) / "conf"),
        }

    def start(self, timeout: float = 120.0) -> LocalCluster:
        self.port, self.ui_port = self.port or free_port(), self.ui_port or free_port()
        self.work_dir = self.work_dir or tempfile.mkdtemp(prefix="spark-cluster-")
        logs = pathlib.Path(self.work_dir)
        (logs / "conf").mkdir(exist_ok=True)
        (logs / "conf" / "log4j2.properties").write_text(resources.files("detectorkit.runtime").joinpath("log4j2.properties").read_text())
        self.processes.append(
            self._spawn(
                ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui_port)],
                logs / "master.log",
            )
        )
        for i in range(self.workers):
            self.processes.append(
                self._spawn(
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        "127.0.0.1",
                        "--cores",
                        str(self.cores),
                        "--memory",
                        self.memory,
                        "--work-dir",
                        str(logs / f"worker-{i}"),
                        "--webui-port",
                        "0",
                        self.master_url,
                    ],
                    logs / f"worker-{i}.log",
                )
            )
        deadline = time.monotonic() + timeout
        while self.alive_workers() < self.workers:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                self.stop()
                raise RuntimeError(f"the cluster did not come up with {self.workers} worker(s) within {timeout:g} s; logs in {logs}")
            time.sleep(0.5)
        return self

    def _spawn(self, args: list[str], log: pathlib.Path) -> subprocess.Popen:
        with log.open("ab") as out:
            return subprocess.Popen([spark_class(), *args], env=self._env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def status(self) -> dict:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as response:
                return json.loads(response.read())
        except (OSError, ValueError):
            return {}  # not up, or starting: its UI answers an empty body before the master is ready (seen on a loaded machine)

    def alive_workers(self) -> int:
        return sum(1 for w in self.status().get("workers", []) if w.get("state") == "ALIVE")

    def executor_logs(self) -> list[pathlib.Path]:
        """Every executor's stderr (the worker's work dir/<app>/<executor>/stderr)."""
        return sorted(pathlib.Path(self.work_dir).glob("worker-*/app-*/*/stderr"))

    def kill_worker(self, index: int = 0) -> None:
        """A worker lost for good (kill -9 of its process group), as a machine failing."""
        os.killpg(self.processes[1 + index].pid, signal.SIGKILL)

    def stop(self, timeout: float = 30.0) -> None:
        for p in reversed(self.processes):  # workers first, then the master
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.processes:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="detectorkit cluster", description="Run a Spark standalone cluster on this machine.")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker")
    parser.add_argument("--memory", default="1g", help="memory per worker")
    parser.add_argument("--python", default=None, help="the workers' Python (default: this one)")
    parser.add_argument(
        "--workers-env", default=None, help="make (once) a virtual environment here with detectorkit's dependencies only, and give it to the workers"
    )
    parser.add_argument("--port", type=int, default=7077)
    args = parser.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    python = str(make_workers_env(pathlib.Path(args.workers_env).resolve())) if args.workers_env else args.python or sys.executable
    cluster = LocalCluster(args.workers, args.cores, args.memory, python, port=args.port).start()
    try:
        print(cluster.master_url, flush=True)
        print(
            f"web UI http://127.0.0.1:{cluster.ui_port}/, logs in {cluster.work_dir}; run a service on it with "
            f"SPARK_MASTER={cluster.master_url} PYSPARK_PYTHON={python}",
            file=sys.stderr,
            flush=True,
        )
        while not stop.wait(1.0):
            if any(p.poll() is not None for p in cluster.processes):
                print("a cluster process exited; stopping", file=sys.stderr)
                return 1
        return 0
    finally:
        cluster.stop()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
