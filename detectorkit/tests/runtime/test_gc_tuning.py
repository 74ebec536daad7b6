"""The garbage collector of a Python worker, set at its first task."""

import dataclasses
import gc

import pytest

from detectorkit import logs
from detectorkit.runtime import gc_tuning, processing
from detectorkit.runtime.processing import warm_worker

from ..detectors import THRESHOLD
from .test_processing import ctx


@pytest.fixture
def fresh_collector(monkeypatch):
    """As in a new worker: nothing frozen, the default thresholds; put back afterwards. The
    worker's log setup is left out: in this process it would bind the logs of every later test
    to this test's captured stderr."""
    monkeypatch.setattr(logs, "setup_once", lambda *args, **kwargs: None)
    before = gc.get_threshold()
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    monkeypatch.setattr(gc_tuning, "_tuned", False)
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_a_workers_first_task_freezes_what_is_loaded_and_collects_less_often(fresh_collector):
    assert gc.get_freeze_count() == 0
    list(warm_worker(ctx(), iter([])))  # a worker's first task
    frozen = gc.get_freeze_count()
    assert frozen > 10_000  # the imports: pandas, pyarrow, detectorkit
    assert gc.get_threshold() == (gc_tuning.GEN0_THRESHOLD, 10, 10)
    list(warm_worker(ctx(), iter([])))  # a later task: nothing more is frozen
    # (A frozen object freed meanwhile leaves the frozen generation: another test's thread may free some.)
    assert gc.get_freeze_count() <= frozen


def test_a_higher_threshold_is_kept(fresh_collector):
    gc.set_threshold(100_000, 5, 5)
    gc_tuning.tune_once()
    assert gc.get_threshold() == (100_000, 5, 5)


def test_a_workers_first_task_warms_its_stage_once_and_a_failed_warm_up_fails_nothing(fresh_collector, monkeypatch):
    """What a stage's calls load once (a model's session, compiled code) is loaded at the worker's
    first task, before its batches; a warm-up that fails is left to the first batch, which says why."""
    monkeypatch.setattr(processing, "_WARMED", set())
    calls = []
    warmed = dataclasses.replace(THRESHOLD, name="warmed", warm=lambda: calls.append("warmed"))
    failing = dataclasses.replace(THRESHOLD, name="failing", warm=lambda: calls.append("failing") or 1 / 0)
    for _ in range(2):  # a later task warms nothing again
        list(warm_worker(ctx(warmed), iter([])))
        list(warm_worker(ctx(failing), iter([])))
    assert calls == ["warmed", "failing"]
