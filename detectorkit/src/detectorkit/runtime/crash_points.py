"""Named points of a task's commit sequence where the crash tests kill the whole job (`kill -9`).

`DETECTORKIT_CRASH_AT=<point>:<n>` (set only by the test suite) kills the job's processes, the
driver and its JVM included, the n-th time any of its Python workers reaches `<point>`;
`<point>:<n>:raise` fails the task there instead, `<point>:<n>:stall<seconds>` stalls it there. A kill from
outside lands wherever the job happens to be; these land exactly between two steps, the places
where exactly-once could break: before any output, amid the outputs, after the outputs before
the commit, and between a transaction's offsets and its end.
"""

from __future__ import annotations

import fcntl
import os
import pathlib
import signal
import tempfile
import time

POINTS = ("before-produce", "during-produce", "before-commit", "during-commit")


def _count(point: str) -> int:
    """How many times the job's processes have reached `point`, this one included: counted in a
    file per job (its session), since Spark replaces a Python worker whose task failed."""
    sid = os.getsid(0)
    try:  # the session leader's start time too: a pid, and so a session id, is reused in time
        started = pathlib.Path(f"/proc/{sid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        started = "0"
    path = pathlib.Path(tempfile.gettempdir()) / f"detectorkit-crash-{sid}-{started}-{point}"
    with open(path, "a+", encoding="ascii") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        file.seek(0)
        count = int(file.read() or 0) + 1
        file.seek(0)
        file.truncate()
        file.write(str(count))
    return count


def reach(point: str) -> None:
    wanted = os.environ.get("DETECTORKIT_CRASH_AT")
    if not wanted:
        return
    name, _, rest = wanted.partition(":")
    if name != point:
        return
    nth, _, how = rest.partition(":")
    if _count(point) != int(nth or 1):
        return
    if how == "raise":  # a task that fails there instead (Spark retries or re-plans it), once
        raise RuntimeError(f"failure injected at {point} (DETECTORKIT_CRASH_AT)")
    if how.startswith("stall"):  # a task that stalls there for so many seconds (past a transaction's timeout, say), once
        time.sleep(float(how[len("stall") :]))  # the stall is the fault injected
        return
    # The job's session (its driver and JVM: a container's processes), then this worker's own
    # group (PySpark's daemon starts one): nothing of the job may run on after this.
    for group in (os.getsid(0), os.getpgid(0)):
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
