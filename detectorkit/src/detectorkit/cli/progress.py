"""Progress on stderr for the commands that read or write many records: a bar on a terminal, lines
elsewhere (a CI log, a file, a notebook's cell)."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import time

# Lines when not on a terminal: one at least this many seconds after the last, and at the end.
LINE_SECONDS = 10.0


def have_rich() -> bool:
    """Whether the dev extra's terminal library is installed (a service's image has none)."""
    return importlib.util.find_spec("rich") is not None


def shown(asked: bool | None) -> str | None:
    """How progress shows: "bar" on a terminal with rich, else "lines"; None when `asked` is False."""
    if asked is False:
        return None
    return "bar" if sys.stderr.isatty() and have_rich() else "lines"


@contextlib.contextmanager
def bar(total: int, label: str, show: bool | str | None):
    """Yields `advance(done)`: a rich progress bar on stderr ("bar", or True), lines on stderr every
    LINE_SECONDS and at the end ("lines"), or nothing."""
    if not show:
        yield lambda done: None
        return
    if show == "lines":
        yield from _lines(total, label)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=Console(stderr=True)) as progress:
        task = progress.add_task(label, total=total)
        yield lambda done: progress.update(task, completed=done)


def _lines(total: int, label: str):
    started = last = time.monotonic()
    reached = [0]

    def advance(done: int) -> None:
        nonlocal last
        reached[0] = done
        now = time.monotonic()
        if now - last >= LINE_SECONDS:
            last = now
            print(_line(label, done, total, now - started), file=sys.stderr, flush=True)

    yield advance
    print(_line(label, reached[0], total, time.monotonic() - started), file=sys.stderr, flush=True)


def _line(label: str, done: int, total: int, seconds: float) -> str:
    share = f" ({done / total:.0%})" if total else ""
    rate = f", {done / seconds:,.0f} records/s" if seconds > 0 else ""
    return f"{label}: {done:,} of {total:,} records{share} in {seconds:,.0f} s{rate}"
