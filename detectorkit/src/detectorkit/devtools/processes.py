"""Signals to a whole job, as a container runtime sends them: every process of its session."""

from __future__ import annotations

import os
import pathlib


def signal_session(session: int, signum: int) -> None:
    """`signum` to every process group of session `session` (a job started in a session of its own,
    whose id is its pid). PySpark's daemon puts the Python workers in a group of their own, which
    a signal to the job's group alone would leave running: a paused job's tasks went on."""
    groups = {session}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            _state, _parent, group, of = stat.read_text().rsplit(")", 1)[1].split()[:4]
        except (OSError, ValueError):
            continue  # gone meanwhile
        if int(of) == session:
            groups.add(int(group))
    for group in groups:
        try:
            os.killpg(group, signum)
        except ProcessLookupError:
            pass
