"""The pace of the sample feeds, on a fake clock."""

from detectorkit.devtools import pacing


def test_a_pacer_sleeps_off_what_it_is_ahead_and_does_not_make_up_a_pause(monkeypatch):
    now = [100.0]
    slept = []
    monkeypatch.setattr(pacing.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(pacing.time, "sleep", lambda s: (slept.append(round(s, 6)), now.__setitem__(0, now[0] + s)))
    pacer = pacing.Pacer(rate=100)
    now[0] += 0.25
    pacer.wait(50)  # 50 items are due at 0.5 s; 0.25 s went by
    assert slept == [0.25]
    now[0] += 10  # held for 10 s
    pacer.restart_at(50)
    pacer.wait(60)
    assert slept == [0.25, 0.1]
    pacer.wait(60)  # on time: no sleep
    assert slept == [0.25, 0.1]


def test_without_a_rate_it_never_sleeps(monkeypatch):
    monkeypatch.setattr(pacing.time, "sleep", lambda s: (_ for _ in ()).throw(AssertionError("slept")))
    pacer = pacing.Pacer(rate=None)
    pacer.restart_at(10)
    pacer.wait(1_000_000)
