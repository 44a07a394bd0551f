"""TorchScript modules for the hostile-input tests (issue 24 §2). No `from __future__ import annotations`: TorchScript
compiles these methods from their source and needs real annotations.

`Touch`'s `__setstate__` (TorchScript, run by `torch.jit.load`) creates its marker file: `torch.from_file(path,
shared=True, size=2)` opens the path O_RDWR | O_CREAT and sizes it (a write primitive on any path, from inside the
TorchScript interpreter, with no Python global anywhere in the archive's pickles).
"""

from typing import Tuple

import torch


class Touch(torch.nn.Module):
    def __init__(self, marker: str) -> None:
        super().__init__()
        self.w = torch.zeros(2)
        self.marker = marker

    @torch.jit.export
    def __getstate__(self) -> Tuple[torch.Tensor, str, bool]:
        return (self.w, self.marker, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[torch.Tensor, str, bool]) -> None:
        self.marker = state[1]
        self.training = state[2]
        self.w = state[0] + torch.from_file(state[1], True, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w
