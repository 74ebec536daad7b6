"""The line between the driver and its slices' tasks (runtime.slices), one TCP connection per task.

A task runs for seconds, so the driver cannot wait for it to end to know where it is, nor to hand
its partitions over: each task reports its partitions' positions at every checkpoint, and ends at
its next checkpoint once the driver says so (a rebalance, a stop). A task whose driver is gone
(the connection closes) ends too: nobody would commit what it reads, and a new driver's tasks
read the same partitions. So does one whose driver has said nothing for a while: the driver says
it is there every `beat_seconds`, and a driver that stood still (a pause, a frozen machine) may
have lost its partitions to another member without knowing it yet."""

from __future__ import annotations

import json
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

log = structlog.get_logger("detectorkit.job")

END = b"end\n"
ALIVE = b"alive\n"


@dataclass
class SliceProgress:
    """Where a slice's partitions are, as its tasks last reported."""

    positions: dict[int, int] = field(default_factory=dict)
    at_end: set[int] = field(default_factory=set)
    reported_at: float = 0.0
    # With a state flush interval: how far each partition's changelog reflects the input, as of
    # the same checkpoints (what a commit of `positions` carries).
    durable: dict[int, int] = field(default_factory=dict)


class SliceControl:
    """The driver's end: a listening socket, and each slice's tasks by its token."""

    def __init__(self, host: str = "127.0.0.1", on_counts: Callable[[dict], None] | None = None, beat_seconds: float = 1.0):
        # What a task wrote since its last report, as it reports it (runtime.processing.take_counts).
        self._on_counts = on_counts
        self._beat_seconds = beat_seconds
        self._server = socket.create_server((host, 0))
        self._server.setblocking(False)
        self.address = (host, self._server.getsockname()[1])
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._server, selectors.EVENT_READ)
        self._lock = threading.Lock()
        self._links: dict[str, list[socket.socket]] = {}
        self._ended: set[str] = set()
        self._buffers: dict[socket.socket, bytes] = {}
        self._tokens: dict[socket.socket, str | None] = {}
        self.progress: dict[str, SliceProgress] = {}
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="slice-control", daemon=True)
        self._thread.start()

    def begin(self, token: str, after: str | None = None) -> None:
        """A slice starts; its partitions are where the slice `after` (the one before) left them
        until its tasks report."""
        before = self.snapshot(after)
        with self._lock:
            self.progress[token] = SliceProgress() if before is None else before
        if after is not None:
            self.forget(after)

    def snapshot(self, token: str | None) -> SliceProgress | None:
        """A copy of the slice's progress: the control's thread goes on changing the original."""
        with self._lock:
            progress = self.progress.get(token) if token is not None else None
            if progress is None:
                return None
            return SliceProgress(dict(progress.positions), set(progress.at_end), progress.reported_at, dict(progress.durable))

    def seconds_since_report(self) -> float:
        """Since a task last reported (inf: none has)."""
        with self._lock:
            last = max((p.reported_at for p in self.progress.values()), default=0.0)
        return time.monotonic() - last if last else float("inf")

    def end(self, token: str | None = None) -> None:
        """Tell the slice's tasks (every slice's, None) to end at their next checkpoint; a task that
        connects later is told at once."""
        with self._lock:
            # Each slice's tasks are told once; a stop says it again while it waits.
            tokens = [t for t in (list(self.progress) if token is None else [token]) if t not in self._ended]
            self._ended.update(tokens)
            links = [s for t in tokens for s in self._links.get(t, [])]
        for link in links:
            _send(link, END)

    def forget(self, token: str) -> None:
        with self._lock:
            links = self._links.pop(token, [])
            self._ended.discard(token)
            self.progress.pop(token, None)
        for link in links:
            self._drop(link)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        for link in list(self._tokens):
            self._drop(link)
        self._selector.close()
        self._server.close()

    def _serve(self) -> None:
        beat = time.monotonic()
        while not self._closed.is_set():
            for key, _ in self._selector.select(timeout=min(0.2, self._beat_seconds)):
                if key.fileobj is self._server:
                    self._accept()
                else:
                    self._read(key.fileobj)
            if time.monotonic() - beat >= self._beat_seconds:
                beat = time.monotonic()
                for link in list(self._tokens):
                    _send(link, ALIVE)

    def _accept(self) -> None:
        try:
            link, _ = self._server.accept()
        except BlockingIOError:
            return
        link.setblocking(False)
        self._buffers[link], self._tokens[link] = b"", None
        self._selector.register(link, selectors.EVENT_READ)

    def _read(self, link: socket.socket) -> None:
        try:
            data = link.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(link)
            return
        buffer = self._buffers[link] + data
        *lines, self._buffers[link] = buffer.split(b"\n")
        for line in lines:
            self._line(link, line.decode())

    def _line(self, link: socket.socket, line: str) -> None:
        token = self._tokens[link]
        if token is None:
            self._tokens[link] = line
            with self._lock:
                self._links.setdefault(line, []).append(link)
                ended = line in self._ended
            if ended:
                _send(link, END)
            return
        report = json.loads(line)
        if self._on_counts is not None:
            # Written whether or not the slice is still followed: its tasks report only what they flushed.
            self._on_counts(report["counts"])
        with self._lock:
            progress = self.progress.get(token)
            if progress is None:
                return
            for p, (position, at_end, durable) in report["positions"].items():
                progress.positions[int(p)] = position
                (progress.at_end.add if at_end else progress.at_end.discard)(int(p))
                if durable is not None:
                    progress.durable[int(p)] = durable
            progress.reported_at = time.monotonic()

    def _drop(self, link: socket.socket) -> None:
        try:
            self._selector.unregister(link)
        except (KeyError, ValueError):
            pass
        self._buffers.pop(link, None)
        token = self._tokens.pop(link, None)
        with self._lock:
            if token is not None and link in self._links.get(token, []):
                self._links[token].remove(link)
        link.close()


def _send(link: socket.socket, data: bytes) -> None:
    try:
        link.send(data)
    except OSError:
        pass  # the task has gone: nothing to tell it


class Link:
    """A task's end: connects at the slice's start, reports, and tells whether to end."""

    def __init__(self, address: tuple[str, int], token: str, timeout: float):
        self._socket = socket.create_connection(address, timeout=timeout)
        self._socket.sendall(token.encode() + b"\n")
        self._socket.setblocking(False)
        self._ended = False
        self._heard = time.monotonic()
        # The last bytes read: the word to end may come in two reads, after many beats.
        self._tail = b""

    def ended(self) -> bool:
        """The driver said so, or is gone."""
        while not self._ended:
            try:
                data = self._socket.recv(4096)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data = b""
            # The word, or the end of the connection: either way, end. Otherwise it is there.
            self._ended = not data or END in self._tail + data
            self._tail = (self._tail + data)[-len(END) :]
            self._heard = time.monotonic()
        return self._ended

    def silent_for(self) -> float:
        """Seconds since the driver was last heard, as of the last `ended`."""
        return time.monotonic() - self._heard

    def report(self, positions: dict[int, int], at_end: set[int], durable: dict[int, int], counts: dict) -> None:
        """Where its partitions are, and what it wrote since its last report (the driver's metrics)."""
        line = json.dumps({"positions": {str(p): [o, p in at_end, durable.get(p)] for p, o in positions.items()}, "counts": counts}).encode() + b"\n"
        try:
            self._socket.setblocking(True)
            self._socket.sendall(line)
        except OSError:
            self._ended = True
        finally:
            try:
                self._socket.setblocking(False)
            except OSError:
                pass

    def close(self) -> None:
        self._socket.close()
