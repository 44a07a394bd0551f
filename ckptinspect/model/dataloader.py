"""`DataloaderState`: the per-DP-rank dataloader state a training stack saved with a checkpoint (read by
`formats/dataloader_state.py`, predicted by `resume`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class DataloaderState:
    """The per-DP-rank dataloader state a training stack saved with a checkpoint (docs/contract.md "Dataloader state").

    stack: the writer (`Stack` value: ``megatron-bridge``, ``torchtitan``).
    location: where it is, relative to the checkpoint dir (``../energon/iter_0000002``) or the DCP key prefix
        (``dataloader.``).
    ranks: the DP ranks whose state is present, ascending.
    dp: the DP size the state should cover: the size the stack recorded with it (torchtitan ``world_size``), else the
        checkpoint's DP; None when neither is known.
    unreadable: the present ranks whose state cannot be read (cut, hostile or not the stack's shape).
    """

    stack: str
    location: str
    ranks: tuple[int, ...]
    dp: int | None
    unreadable: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"stack": self.stack, "location": self.location, "ranks": list(self.ranks), "dp": self.dp,
                "unreadable": list(self.unreadable)}
