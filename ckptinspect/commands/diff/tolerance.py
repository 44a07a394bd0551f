"""`diff` options that relax a comparison: `--atol` / `--rtol` for tensor values, `--ignore KEY_GLOB` for keys that
may differ (``*._extra_state``, ``rng_state*``), and the fingerprint shortcut of `diff --values`: a tensor whose
value fingerprints are equal on both sides (`commands/values`, the contract's "Value fingerprint") is identical
without an element-by-element comparison.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from ckptinspect.commands.values.report import fingerprint_of
from ckptinspect.errors import UsageError
from ckptinspect.model import Checkpoint, Format, Tensor

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Tolerance:
    """atol / rtol: float elements with ``|a - b| <= atol + rtol * |b|`` are equal. ignore: key globs left out."""

    atol: float = 0.0
    rtol: float = 0.0
    ignore: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not (self.atol >= 0 and self.rtol >= 0):  # also refuses NaN
            raise UsageError(f"--atol {self.atol} / --rtol {self.rtol}: tolerances must be >= 0")

    def ignored(self, key: str) -> bool:
        return any(fnmatch.fnmatchcase(key, g) for g in self.ignore)

    def kept(self, names: Mapping[str, V]) -> dict[str, V]:
        return {k: v for k, v in names.items() if not self.ignored(k)} if self.ignore else dict(names)


def same_values(a: Checkpoint, ta: Tensor, b: Checkpoint, tb: Tensor) -> bool:
    """Whether both tensors have a value fingerprint and it is the same (each side read once, chunk by chunk)."""
    if ta.dtype != tb.dtype or ta.shape != tb.shape or Format.TORCH in (a.format, b.format):
        return False  # legacy `.pt` tensors may be views repeating their storage: compared as stored, not scanned
    fa = fingerprint_of(a, ta)
    return fa is not None and fa == fingerprint_of(b, tb)
