"""The Spark query whose batches run this instance's slices (runtime.slices): started on a fresh
checkpoint, stopped after its batch in flight, one at a time.

A batch runs under the batch lock; whatever must not happen under a running batch (a stop, a
recommit, closing Kafka clients) takes that lock here, in a `with`, and nowhere else. A batch of a
query being stopped is skipped (its token is no longer current) and so never committed: the
partitions' next reader reads it again."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import structlog

from detectorkit.runtime.job_plan import JobPlan
from detectorkit.runtime.supervisor import explain

log = structlog.get_logger("detectorkit.job")


class QueryRunner:
    def __init__(
        self,
        spark,
        plan: JobPlan,
        run_batch: Callable[[object, int], None],
        serve: Callable[[], None],
        interrupt: Callable[[], None] | None = None,
    ):
        self._spark = spark  # a SparkSession, or a function that returns it once it has started
        self.plan = plan
        self._run_batch = run_batch
        self._serve = serve  # answers the group while waiting for a batch (it may be waiting on this thread)
        self._interrupt = interrupt  # ends the batch in flight early (a slice's tasks end at their next checkpoint)
        self.query = None
        self._token = 0
        self._stopping = False
        self._lock = threading.Lock()
        self._checkpoint: str | None = None

    def start(self) -> None:
        """A query over Spark's rate source, whose batches only tick: each runs a slice, whose
        tasks read the partitions themselves. Rows come faster than any slice ends, so a batch
        follows each at once; none is ever computed."""
        spark = self._spark() if callable(self._spark) else self._spark
        token = self._token
        self._stopping = False
        self._checkpoint = self.plan.fresh_checkpoint()
        stream = spark.readStream.format("rate").option("rowsPerSecond", 1000).option("numPartitions", 1).load()
        writer = (
            stream.writeStream.foreachBatch(partial(self._on_batch, token))
            .option("checkpointLocation", self._checkpoint)
            .queryName(f"{self.plan.service}-{token}")
        )
        self.query = writer.start()

    def _on_batch(self, token: int, frame, batch_id: int) -> None:
        with self._lock:
            if token != self._token or self._stopping:
                # Not committed, so the partitions' next reader reads these records again; Spark
                # records the batch as done, which is harmless since no query reuses a checkpoint.
                return
            self._run_batch(frame, batch_id)

    def failure(self) -> str | None:
        """Why the query has died; None while it runs, or when there is none."""
        query = self.query
        if query is None or query.isActive:
            return None
        exc = query.exception()
        return explain(exc) if exc is not None else "the query stopped by itself"

    def stop(self, timeout: float, on_cancel: Callable[[], None]) -> None:
        """Stop the query after its batch in flight. If that batch takes longer than `timeout`, the
        query is stopped under it (its tasks cancelled) after `on_cancel`, which keeps its offsets
        from being committed."""
        if self.query is None:
            return
        # A batch that starts from now on is skipped, and the one in flight ends early if it can.
        self._stopping = True
        if self._interrupt is not None:
            self._interrupt()
        # Said again while waiting: a batch that had passed its check of `_stopping` may begin its
        # slice after the first word, and would run to its deadline.
        with self.idle(timeout, interrupting=True) as finished:
            self._token += 1  # later batches of this query are skipped, and never committed
        if not finished:
            log.warning("batch in flight did not finish in time; cancelling it", timeout=timeout)
            on_cancel()
        self.query.stop()
        # Cancelled, the batch's callback returns soon: wait for it before anything is closed.
        with self.idle(max(timeout, 120.0)):
            pass
        self.query = None
        self._drop_checkpoint()

    @contextmanager
    def idle(self, timeout: float, serving: bool = True, interrupting: bool = False) -> Iterator[bool]:
        """No batch runs inside (True), or none finished within `timeout` (False). The group is
        served meanwhile (unless it is being closed): the batch in flight may wait for its commit
        to run on this thread. `interrupting`: the batch in flight is asked to end early at each
        turn of the wait."""
        deadline = time.monotonic() + timeout
        acquired = False
        while not (acquired := self._lock.acquire(timeout=0.05 if serving else timeout)):
            if interrupting and self._interrupt is not None:
                self._interrupt()
            if serving:
                self._serve()
            if not serving or time.monotonic() > deadline:
                break
        try:
            yield acquired
        finally:
            if acquired:
                self._lock.release()

    @contextmanager
    def between_batches(self) -> Iterator[bool]:
        """True inside if no batch runs now; none starts until the block ends."""
        acquired = self._lock.acquire(blocking=False)
        try:
            yield acquired
        finally:
            if acquired:
                self._lock.release()

    def after_batch(self, close: Callable[[], None], timeout: float) -> None:
        """Run `close` once no batch runs: the batch callback runs in this process and may outlive
        query.stop(). If one still runs after `timeout`, `close` runs when it returns."""
        with self.idle(timeout, serving=False) as free:
            if free:
                close()
                self._drop_checkpoint()
                return
        # Never left to the garbage collector: librdkafka spins forever destroying an unclosed
        # group member with a rebalance pending (measured).
        log.error("a batch is still running; its Kafka clients are closed when it returns", timeout=timeout)

        def later() -> None:
            with self._lock:
                close()
                self._drop_checkpoint()

        threading.Thread(target=later, name="close-after-batch", daemon=True).start()

    def _drop_checkpoint(self) -> None:
        if self._checkpoint:
            shutil.rmtree(self._checkpoint, ignore_errors=True)
            self._checkpoint = None
