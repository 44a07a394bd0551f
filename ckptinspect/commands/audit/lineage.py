"""Lineage across a save dir's iterations (issue 29): a stale save found by the value scan's fingerprints (CK524), and
the iteration numbers and counters of consecutive iterations disagreeing (CK525-CK529).

A save that "reports success" but holds the same weights as the iteration before it (NeMo-RL #3312: "step_90,
step_110 and step_120 are bit-identical") is a training run that did not train, or a writer that saved an old
state again. With `audit --all --values`, every iteration's model tensors have a shard-invariant fingerprint; when
two consecutive fully scanned iterations hold the same model keys with the same fingerprints while the iteration
number advanced, the later one is CK524. Optimizer state may legitimately change without the weights (a zero
learning rate): the finding names what it compared and says so; it does not change the status.

The metadata rules need only the common state (`common.pt` / `common_state`), which every iteration's read parses,
cheap or full, so they run in every save-dir audit and `ls`. Each iteration leaves a `Step` (five numbers) behind:
- CK525: the dir name says iteration N, the common state's `iteration` is M (a dir copied or renamed by hand). Megatron's
  `load_checkpoint` continues from the stored `iteration`, not from the dir's name.
- CK526: the same disagreement in the dir the tracker names: the resume continues at M, and its next save lands at
  `iter_{M+interval}`, not after N.
- CK527: `consumed_train_samples` (args) went backwards from one iteration to the next (by stored iteration): the
  iterations of two runs in one dir, e.g. a restart from an older checkpoint, or a new run, saving into it.
- CK528: the stored iteration advanced but `consumed_train_samples` did not: a resume from the later one starts the
  data where the earlier one did (Megatron adds the global batch size every iteration, skipped ones included).
- CK529: the scheduler's step (`opt_param_scheduler.num_steps` in the common state, in samples) went backwards.
The args' own `iteration` is not compared: Megatron sets it once, to the iteration the run started (resumed) from
(`setup_model_and_optimizer`), so in a resumed run it differs from the saved iteration by design.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckptinspect.findings import Finding
from ckptinspect.formats.args_values import arg_int

if TYPE_CHECKING:
    from ckptinspect.formats.savedir import SaveDir
    from ckptinspect.commands.values.report import TensorScan
    from ckptinspect.model import Checkpoint


@dataclass(frozen=True, slots=True)
class Lineage:
    """What the stale-save rule keeps of one fully value-scanned iteration (not its parsed metadata)."""

    name: str | None
    iteration: int | None
    fingerprints: dict[str, str]
    consumed_train_samples: int | None


def lineage_of(name: str | None, ckpt: Checkpoint, scans: Sequence[TensorScan] | None) -> Lineage | None:
    """The model tensor fingerprints of a value-scanned checkpoint; None unless every model tensor has one."""
    if scans is None:
        return None
    fps = {}
    for t in scans:
        if t.component != "model" or t.unsupported:
            continue
        fp = t.values.fingerprint
        if fp is None:
            return None
        fps[f"{t.shard}/{t.key}" if t.shard else t.key] = fp
    if not fps:
        return None
    return Lineage(name, ckpt.iteration, fps, arg_int(ckpt.args, "consumed_train_samples"))


def stale_saves(lines: Sequence[Lineage], label: str) -> list[Finding]:
    """CK524 for each iteration whose model weights are bit-identical to the previous scanned iteration's."""
    out: list[Finding] = []
    prev: Lineage | None = None
    for a in sorted(lines, key=lambda x: (x.iteration is None, x.iteration or 0)):
        if (f := stale_save(prev, a, label)) is not None:
            out.append(f)
        prev = a
    return out

def stale_save(prev: Lineage | None, a: Lineage, label: str) -> Finding | None:
    """CK524 for `a` when its model weights are bit-identical to `prev`'s (the previous scanned iteration)."""
    if prev is None or a.fingerprints != prev.fingerprints or a.iteration is None or prev.iteration is None \
            or a.iteration <= prev.iteration:
        return None
    samples = [prev.consumed_train_samples, a.consumed_train_samples]
    more = (f"; consumed_train_samples {samples[0]} -> {samples[1]}"
            if None not in samples and samples[0] != samples[1] else "")
    return Finding(
        "CK524", f"iteration {a.iteration} ({a.name}): its {len(a.fingerprints)} model tensors are "
        f"bit-identical to iteration {prev.iteration}'s ({prev.name}), while the iteration advanced{more}: a "
        "stale save (no weight update between them, or an old state saved again)", a.name, label,
        {"iteration": a.iteration, "previous": prev.iteration, "previous_name": prev.name,
         "model_tensors": len(a.fingerprints), "consumed_train_samples": samples})


@dataclass(frozen=True, slots=True)
class Step:
    """What the metadata lineage rules keep of one iteration: its name and four numbers, not its parsed metadata.

    dir_iteration: the number in the dir name (`iter_0000100`, `step-10`); None for `release`.
    iteration: `iteration` in the common state; None without one.
    consumed_train_samples: the args' `consumed_train_samples`; None without args or the arg.
    scheduler_steps: the common state's `opt_param_scheduler.num_steps`; None without one.
    """

    name: str
    dir_iteration: int | None
    iteration: int | None
    consumed_train_samples: int | None
    scheduler_steps: int | None


def step_of(name: str, dir_iteration: int | str, ckpt: Checkpoint) -> Step:
    common = ckpt.common or {}
    stored = common.get("iteration")
    sched = common.get("opt_param_scheduler")
    steps = sched.get("num_steps") if isinstance(sched, Mapping) else None
    return Step(name, dir_iteration if isinstance(dir_iteration, int) else None, _count(stored),
                arg_int(ckpt.args, "consumed_train_samples"), _count(steps))


def _count(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def step_findings(steps: Sequence[Step], save: SaveDir, label: str) -> list[Finding]:
    """CK525-CK529 over the iterations of `save` (`steps`: one per iteration dir)."""
    tracker = save.tracker
    tracked = save.find(tracker.iteration) if tracker.exists and tracker.error is None else None
    out: list[Finding] = []
    for s in steps:
        if s.dir_iteration is None or s.iteration is None or s.dir_iteration == s.iteration:
            continue
        if tracked is not None and s.name == tracked.name:
            out.append(Finding(
                "CK526", f"the tracker names iteration {s.dir_iteration}, but {s.name} stores iteration {s.iteration} "
                f"in its common state: a resume continues at iteration {s.iteration} (Megatron's load takes the stored "
                "one), and its next saves are numbered after it", s.name, label,
                {"tracker": tracker.iteration, "iteration": s.iteration, "name": s.name}))
        else:
            out.append(Finding(
                "CK525", f"{s.name} stores iteration {s.iteration} in its common state, not {s.dir_iteration} as its "
                "name says (a dir copied or renamed?); a resume from it continues at iteration "
                f"{s.iteration}", s.name, label, {"dir_iteration": s.dir_iteration, "iteration": s.iteration}))
    # the counters must grow with the stored iteration (a renamed dir is CK525 / CK526, not also a counter going
    # backwards in the names' order); without a stored one, the dir name's number places the iteration
    numbered = sorted((s for s in steps if s.iteration is not None or s.dir_iteration is not None),
                      key=lambda s: s.iteration if s.iteration is not None else s.dir_iteration or 0)
    for prev, s in zip(numbered, numbered[1:]):
        out.extend(_pair(prev, s, label))
    return out


def _pair(prev: Step, s: Step, label: str) -> list[Finding]:
    out: list[Finding] = []
    was, now = prev.consumed_train_samples, s.consumed_train_samples
    its = {"iteration": s.iteration, "previous": prev.iteration, "previous_name": prev.name}
    if was is not None and now is not None:
        if now < was:
            out.append(Finding(
                "CK527", f"consumed_train_samples went backwards from {prev.name} to {s.name}: {was} -> {now} (the "
                "iterations of two runs in one save dir, e.g. a restart from an older checkpoint saving into it)",
                s.name, label, {**its, "consumed_train_samples": [was, now]}))
        elif now == was and s.iteration is not None and prev.iteration is not None and s.iteration > prev.iteration:
            out.append(Finding(
                "CK528", f"iteration {s.iteration} ({s.name}) has consumed_train_samples {now}, as iteration "
                f"{prev.iteration} ({prev.name}) had: the iteration advanced but the data position did not (a "
                "resume from it starts the data where the earlier one did)", s.name, label,
                {**its, "consumed_train_samples": [was, now]}))
    a, b = prev.scheduler_steps, s.scheduler_steps
    if a is not None and b is not None and b < a:
        out.append(Finding(
            "CK529", f"the learning-rate scheduler's step went backwards from {prev.name} to {s.name}: "
            f"opt_param_scheduler.num_steps {a} -> {b} (a resume from {s.name} repeats the schedule)", s.name, label,
            {**its, "scheduler_steps": [a, b]}))
    return out
