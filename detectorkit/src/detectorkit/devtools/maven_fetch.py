"""What the dev tools fetch from Maven Central the way a user would (Apache Kafka's jars, Apicurio
Registry): once per machine into the cache, whichever test process asks first."""

from __future__ import annotations

import fcntl
import os
import pathlib
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence


def cache_dir() -> pathlib.Path:
    root = os.environ.get("DETECTORKIT_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "detectorkit")
    return pathlib.Path(root)


def fetch_once(target: pathlib.Path, fetch: Callable[[pathlib.Path], None], marker: str = "") -> None:
    """`fetch(work)` fills `target` from a scratch folder inside it, unless an earlier fetch
    completed; test processes that ask at once wait for the one that fetches."""
    if (target / ".complete").exists():
        return
    target.mkdir(parents=True, exist_ok=True)
    with open(target / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return
        work = pathlib.Path(tempfile.mkdtemp(prefix="fetch-", dir=target))
        try:
            fetch(work)
            (target / ".complete").write_text(marker)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def maven(arguments: Sequence[str], cwd: pathlib.Path, what: str, error: type[Exception]) -> None:
    """Maven, quiet and in batch mode; `error` saying what it could not fetch, with its last lines."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise error(f"fetching {what} from Maven Central needs Maven on PATH (e.g. apt-get install maven)")
    done = subprocess.run([mvn, "-q", "-B", *arguments], cwd=cwd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise error(f"Maven could not fetch {what}: {' | '.join(tail) or 'no message'}")
