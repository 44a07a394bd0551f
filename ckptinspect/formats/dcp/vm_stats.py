"""Which path read each per-chunk record of a streamed `.metadata`: the batch paths (`vm_fast.py`) or the loop.

A writer repeats three records per chunk: a ChunkStorageMetadata of `state_dict_metadata` ("chunk"), a
`storage_data` entry MetadataIndex -> _StorageInfo ("storage") and a plan WriteItem of `all_local_plans` ("plan").
The batch paths are meant to read nearly all of them; a record they leave to the opcode loop once they are on (past
their first memo slot) is a fallback, counted here per kind: the measure of whether the fast path holds on a file
(issue 31: on a writer's other object sharing, 97 % of the plan records once fell to the loop).
"""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("chunk", "storage", "plan")


def _zeros() -> dict[str, int]:
    return dict.fromkeys(KINDS, 0)


@dataclass(slots=True)
class ReadStats:
    """Per record kind: `batch`, records the batch paths read; `loop`, records the opcode loop read while the
    batch paths were on (the fallbacks; with `fast=False` every record); `runs`, the batch-path calls that read
    them (records per run: a run cut at every tensor pays the batch decoders' fixed cost per tensor). `memo_slots`: the memo slots the walk
    counted (every path must count the pickle's MEMOIZEs exactly: a miscount shifts every later memo GET).
    `fallback` is the reason the stream went to the reference reader (None when it did not)."""

    batch: dict[str, int] = field(default_factory=_zeros)
    loop: dict[str, int] = field(default_factory=_zeros)
    runs: dict[str, int] = field(default_factory=_zeros)
    memo_slots: int = 0
    fallback: str | None = None

    def share(self, kind: str) -> float:
        """The part of the records of `kind` the loop read (0.0 when there are none)."""
        total = self.batch[kind] + self.loop[kind]
        return self.loop[kind] / total if total else 0.0

    def total_share(self) -> float:
        total = sum(self.batch.values()) + sum(self.loop.values())
        return sum(self.loop.values()) / total if total else 0.0
