"""A progress bar on stderr for the commands that read or write many records."""

from __future__ import annotations

import contextlib
import importlib.util


def have_rich() -> bool:
    """Whether the dev extra's terminal library is installed (a service's image has none)."""
    return importlib.util.find_spec("rich") is not None


@contextlib.contextmanager
def bar(total: int, label: str, show: bool):
    """Yields `advance(done)`: a rich progress bar on stderr, or nothing when `show` is off."""
    if not show:
        yield lambda done: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=Console(stderr=True)) as progress:
        task = progress.add_task(label, total=total)
        yield lambda done: progress.update(task, completed=done)
