"""`watch`'s state machine fed by real polls of real save dirs, with the clock given (no sleeping).

Every save dir is built from copies of a real megatron-core iteration (`torch_dist/iter_0000001`, a 0.16.1 TP2 ×
PP2 × DP2 save) and the states a save passes through: the iteration dir without its final marker (`metadata.json`,
written last by Megatron before the tracker), a data file cut short, a dir removed by retention. The poller
(`commands/watch/poll.py`) reads each snapshot; the machine (`state.py`) is fed it with an explicit time. Every
test checks that watching left every file of the save dir as it was.
"""

from __future__ import annotations

import os
import shutil
import tracemalloc
from pathlib import Path

import pytest

from ckptinspect.commands.watch import STALL_CODE, EventKind, WatchOptions, Watcher, follow
from ckptinspect.commands.watch.poll import Poller
from ckptinspect.commands.watch.state import Event, Phase
from ckptinspect.errors import UsageError
from ckptinspect.findings import Severity, Status
from conftest import SAMPLES

IT = SAMPLES / "torch_dist" / "iter_0000001"
SMALL = SAMPLES / "mlm_args" / "iter_0000002"  # a real 0.16.1 world-size-1 iteration (12 KB `.metadata`)
TRACKER = "latest_checkpointed_iteration.txt"


def _files(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            st = p.stat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


class Run:
    """A save dir, a poller and a machine over it; `poll(t)` is one poll at time t."""

    def __init__(self, save: Path, stall_after: float = 10.0) -> None:
        self.save = save
        self.poller = Poller(save, str(save), WatchOptions())
        self.calls: list[str] = []

        def classify(name: str):  # type: ignore[no-untyped-def]
            self.calls.append(name)
            return self.poller.classify(name)

        self.machine = Watcher(classify, stall_after)

    def poll(self, t: float) -> list[tuple[str, str | None, str | None]]:
        snap = self.poller.snapshot(t, self.machine.done)
        self.last = self.machine.observe(snap)
        return [(e.kind.value, e.name, e.status.value if e.status is not None else None) for e in self.last]


def _iteration(save: Path, n: int, marker: bool = True) -> Path:
    d = save / f"iter_{n:07d}"
    shutil.copytree(IT, d)
    if not marker:
        (d / "metadata.json").unlink()
    return d


@pytest.fixture
def save(tmp_path: Path) -> Path:
    s = tmp_path / "run"
    s.mkdir()
    _iteration(s, 1)
    (s / TRACKER).write_text("1")
    return s


def test_each_iteration_is_audited_once(save: Path) -> None:
    before = _files(save)
    r = Run(save)
    assert r.poll(0) == [("tracker_moved", None, None), ("iteration_complete", "iter_0000001", "complete"),
                         ("audited", "iter_0000001", "complete")]
    assert r.last[0].iteration == 1
    assert r.poll(1) == [] and r.poll(2) == []
    assert r.calls == ["iter_0000001"]  # settled: never audited again
    assert _files(save) == before


def test_a_save_in_flight_then_its_final_marker(save: Path) -> None:
    d = _iteration(save, 2, marker=False)
    r = Run(save)
    ev = r.poll(0)
    assert ev[-1] == ("iteration_in_flight", "iter_0000002", "incomplete")
    assert "CK101" in r.last[-1].codes  # `.metadata` without `metadata.json`
    assert r.poll(1) == []  # unchanged, not stalled yet: nothing to say
    shutil.copy2(IT / "metadata.json", d / "metadata.json")
    assert r.poll(2) == [("iteration_complete", "iter_0000002", "complete"), ("audited", "iter_0000002", "complete")]
    (save / TRACKER).write_text("2")
    assert r.poll(3) == [("tracker_moved", None, None)] and r.last[0].iteration == 2
    assert r.calls.count("iter_0000002") == 2  # in flight once, then complete once


def test_the_unfinished_shape_changing_is_reported(save: Path) -> None:
    d = save / "iter_0000002"
    d.mkdir()
    shutil.copy2(IT / "common.pt", d / "common.pt")
    r = Run(save)
    r.poll(0)
    assert "CK130" in r.last[-1].codes
    for f in sorted(IT.glob("*.distcp")):
        shutil.copy2(f, d / f.name)
    r.poll(1)
    assert r.last[-1].kind is EventKind.IN_FLIGHT and "CK102" in r.last[-1].codes  # data files, no `.metadata`


def test_a_stall_is_reported_once_then_again_after_new_writes(save: Path) -> None:
    d = _iteration(save, 2, marker=False)
    (d / ".metadata").unlink()
    r = Run(save, stall_after=10)
    r.poll(100)
    assert r.poll(105) == []
    assert r.poll(111) == [("stalled", "iter_0000002", "incomplete")]
    stall = r.last[0]
    assert STALL_CODE in stall.codes and stall.seconds == pytest.approx(11)
    assert stall.exit_code(Severity.WARNING) == 1 and stall.exit_code(Severity.ERROR) == 0  # CK530 is a warning
    assert r.poll(150) == []  # one event per stall
    shutil.copy2(IT / ".metadata", d / ".metadata")  # the save goes on
    assert r.poll(151) == [("iteration_in_flight", "iter_0000002", "incomplete")]
    assert r.poll(160) == []
    assert r.poll(162) == [("stalled", "iter_0000002", "incomplete")]


def test_a_broken_iteration_is_audited_and_fails(save: Path) -> None:
    d = _iteration(save, 2)
    with open(d / "__3_1.distcp", "r+b") as f:
        f.truncate(1000)
    r = Run(save)
    ev = r.poll(0)
    assert ev[-1] == ("audited", "iter_0000002", "corrupt")
    assert r.last[-1].exit_code(Severity.ERROR) == 1 and r.last[-1].exit_code(None) == 0
    assert r.machine.phase("iter_0000002") is Phase.SETTLED
    assert r.poll(1) == [] and r.calls.count("iter_0000002") == 1  # unchanged: not audited again


def test_a_broken_iteration_written_further_is_audited_again(save: Path) -> None:
    """A slow save judged damaged while still written (a file cut short) that then finishes: audited again when its
    dir changes, complete at last."""
    d = _iteration(save, 2)
    with open(d / "__3_1.distcp", "r+b") as f:
        f.truncate(1000)
    r = Run(save)
    assert r.poll(0)[-1] == ("audited", "iter_0000002", "corrupt")
    shutil.copy2(IT / "__3_1.distcp", d / "__3_1.distcp")
    assert r.poll(1) == [("iteration_complete", "iter_0000002", "complete"), ("audited", "iter_0000002", "complete")]
    assert r.poll(2) == [] and r.machine.done("iter_0000002")


def test_an_unfinished_save_the_tracker_passed_is_settled(save: Path) -> None:
    _iteration(save, 2, marker=False)
    r = Run(save)
    assert r.poll(0)[-1] == ("iteration_in_flight", "iter_0000002", "incomplete")
    _iteration(save, 3)
    (save / TRACKER).write_text("3")  # its finalize will never run: a crash leftover, not in flight
    ev = r.poll(1)
    assert ("audited", "iter_0000002", "incomplete") in ev and ("audited", "iter_0000003", "complete") in ev
    assert r.poll(1000) == []  # settled: no stall


def test_removed_iterations_leave_the_state(save: Path) -> None:
    _iteration(save, 2)
    r = Run(save)
    r.poll(0)
    assert r.machine.tracked() == 2
    shutil.rmtree(save / "iter_0000001")
    assert r.poll(1) == [("iteration_removed", "iter_0000001", "complete")]
    assert r.machine.tracked() == 1


def test_follow_stops_after_max_polls_and_never_sleeps_after_the_last(save: Path) -> None:
    slept: list[float] = []
    ts = iter(range(100))
    events = list(follow(save, str(save), WatchOptions(interval=7, max_polls=3), clock=lambda: float(next(ts)),
                         sleep=slept.append))
    assert [e.kind for e in events] == [EventKind.TRACKER_MOVED, EventKind.COMPLETE, EventKind.AUDITED]
    assert slept == [7, 7]


def test_follow_reports_a_poll_that_cannot_read_as_an_error(save: Path, tmp_path: Path) -> None:
    moved = tmp_path / "gone"
    seen: list[Event] = []
    gen = follow(save, str(save), WatchOptions(interval=0, max_polls=3), sleep=lambda _: None)
    for e in gen:
        seen.append(e)
        if e.kind is EventKind.AUDITED and not moved.exists():
            save.rename(moved)  # the save dir disappears under the watcher
    errors = [e for e in seen if e.kind is EventKind.ERROR]
    assert len(errors) == 2 and errors[0].exit_code(Severity.ERROR) == 2, seen


def test_one_checkpoint_or_a_missing_dir_is_a_usage_error(save: Path) -> None:
    with pytest.raises(UsageError, match="one checkpoint"):
        next(follow(save / "iter_0000001", "x", WatchOptions(max_polls=1)))
    with pytest.raises(UsageError):
        next(follow(save / "nope", "x", WatchOptions(max_polls=1)))


def test_state_does_not_grow_with_the_iterations_seen(save: Path) -> None:
    """40 iterations arrive one by one (hard links of a real iteration's files) and retention keeps the newest 3:
    the machine holds state for the dirs present, and tracemalloc's peak over the last 8 polls is not above the
    peak over polls 5-12 by more than a generous margin (an audit's transient parse dominates both)."""
    r = Run(save)
    peaks: dict[int, int] = {}
    tracemalloc.start()
    try:
        for n in range(2, 42):
            d = save / f"iter_{n:07d}"
            d.mkdir()
            for f in SMALL.iterdir():
                os.link(f, d / f.name)
            (save / TRACKER).write_text(str(n))
            old = save / f"iter_{n - 3:07d}"
            if old.exists():
                shutil.rmtree(old)
            tracemalloc.reset_peak()
            r.poll(float(n))
            assert r.last[-1].kind is EventKind.AUDITED and r.last[-1].status is Status.COMPLETE
            peaks[n] = tracemalloc.get_traced_memory()[1]
            assert r.machine.tracked() <= 3
    finally:
        tracemalloc.stop()
    early, late = max(peaks[n] for n in range(5, 13)), max(peaks[n] for n in range(34, 42))
    assert late < early * 1.5 + 1_000_000, (early, late)
