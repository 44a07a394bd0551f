"""Lineage across a save dir's iterations (issue 29): a stale save, found by the value scan's fingerprints.

A save that "reports success" but holds the same weights as the iteration before it (NeMo-RL #3312: "step_90,
step_110 and step_120 are bit-identical") is a training run that did not train, or a writer that saved an old
state again. With `audit --all --values`, every iteration's model tensors have a shard-invariant fingerprint; when
two consecutive fully scanned iterations hold the same model keys with the same fingerprints while the iteration
number advanced, the later one is CK524. Optimizer state may legitimately change without the weights (a zero
learning rate): the finding names what it compared and says so; it does not change the status.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckptinspect.findings import Finding
from ckptinspect.formats.args_values import arg_int

if TYPE_CHECKING:
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
        if prev is not None and a.fingerprints == prev.fingerprints and a.iteration is not None \
                and prev.iteration is not None and a.iteration > prev.iteration:
            samples = [prev.consumed_train_samples, a.consumed_train_samples]
            more = (f"; consumed_train_samples {samples[0]} -> {samples[1]}"
                    if None not in samples and samples[0] != samples[1] else "")
            out.append(Finding(
                "CK524", f"iteration {a.iteration} ({a.name}): its {len(a.fingerprints)} model tensors are "
                f"bit-identical to iteration {prev.iteration}'s ({prev.name}), while the iteration advanced{more}: a "
                "stale save (no weight update between them, or an old state saved again)", a.name, label,
                {"iteration": a.iteration, "previous": prev.iteration, "previous_name": prev.name,
                 "model_tensors": len(a.fingerprints), "consumed_train_samples": samples}))
        prev = a
    return out
