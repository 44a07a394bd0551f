"""Per-rank DCP metadata: what `dcp.save(..., use_collectives=False)` writes, and how torch reads it back.

torch 2.13 (`state_dict_saver._save_state_dict`, `filesystem._FileSystemWriter`): without collectives each rank
plans alone (its global plan is its own local plan: no cross-rank dedup), prefixes its data files `__{rank}_`
(`prepare_local_plan`) and finishes by writing its own `__{rank}.metadata` (via `__{rank}.metadata.tmp`, renamed)
instead of the coordinator's `.metadata`; without a process group (`no_dist`) the rank is 0. Each `__R.metadata` is a
whole `Metadata` that describes what rank R wrote: a sharded DTensor's global size with R's chunks only, and every
tensor R holds replicated (a Replicate DTensor, a plain tensor every rank saves) once more, in R's own file.

`dcp.load` (`state_dict_loader._load_state_dict`) tries `.metadata` first and, when it cannot read it, rank R's
`__R.metadata` (`FileSystemReader.read_metadata(rank=R)`); each rank then plans and reads alone from its own file.
So a rank whose `__R.metadata` is missing fails its load (`metadata is None`), and `.metadata`, when present, wins.

ckptinspect reads every rank's file and merges them: tensors by key (one shape and dtype; a rank that disagrees is
CK106), chunks and byte items of all ranks kept, so every stored item is checked; the coverage check treats chunks
that several ranks wrote at the same place as replicas (`Checkpoint.rank_metadata`). A rank that wrote data or
started its metadata (`__R_*.distcp`, `__R.metadata.tmp`) but has no `__R.metadata`, and a rank number below the
highest one with no file at all, are ranks whose load fails: `missing_ranks`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ckptinspect.errors import ReadError
from ckptinspect.findings import Finding
from ckptinspect.formats.files import pickle_findings
from ckptinspect.formats.dcp.metadata import DcpMetadata
from ckptinspect.formats.dcp.stream import read_metadata
from ckptinspect.model import Chunk, ObjectItem, Tensor
from ckptinspect.model.chunk_table import ChunkTable, TensorEntry
from ckptinspect.pickling.unpickle import PickleReport
from ckptinspect.io.objpath import ObjectPath

RANK_METADATA = re.compile(r"^__(\d{1,9})\.metadata$")
RANK_METADATA_TMP = re.compile(r"^__(\d{1,9})\.metadata\.tmp$")
RANK_DATA = re.compile(r"^__(\d{1,9})_\d+\.distcp$")
MAX_RANK_GAP = 1 << 20  # rank numbers this far beyond the files seen are no gap to enumerate


@dataclass(frozen=True, slots=True)
class RankFiles:
    """The per-rank files of a DCP dir.

    metadata: rank -> `__R.metadata` present. tmp: ranks with a `__R.metadata.tmp`. data: ranks with a
    `__R_*.distcp` file.
    """

    metadata: dict[int, str]
    tmp: frozenset[int]
    data: frozenset[int]

    @property
    def missing(self) -> tuple[int, ...]:
        """Ranks whose per-rank load would find no metadata: a rank with data or a `.tmp` but no `__R.metadata`, and
        every rank number below the highest one seen that has no file at all."""
        seen = set(self.metadata) | self.tmp | self.data
        if not seen:
            return ()
        top = max(seen)
        gaps = set(range(top + 1)) if top < MAX_RANK_GAP else set()
        return tuple(sorted((gaps | self.tmp | self.data) - set(self.metadata)))


def rank_files(path: Path) -> RankFiles:
    """The `__R.metadata`, `__R.metadata.tmp` and `__R_*.distcp` files at the top of `path`. Never raises."""
    names: list[str]
    try:
        if isinstance(path, ObjectPath):
            names = [rel for rel, _ in path.walk_files(False)]
        else:
            names = [e.name for e in os.scandir(path)]
    except OSError:
        names = []
    meta: dict[int, str] = {}
    tmp: set[int] = set()
    data: set[int] = set()
    for n in names:
        if m := RANK_METADATA.match(n):
            meta[int(m.group(1))] = n
        elif m := RANK_METADATA_TMP.match(n):
            tmp.add(int(m.group(1)))
        elif m := RANK_DATA.match(n):
            data.add(int(m.group(1)))
    return RankFiles(dict(sorted(meta.items())), frozenset(tmp), frozenset(data))


def missing_message(rf: RankFiles) -> tuple[str, str]:
    """(subject, message) of the finding for the ranks whose load would fail."""
    ranks = rf.missing
    first = ranks[0]
    shown = ", ".join(f"__{r}.metadata" for r in ranks[:5]) + (f" and {len(ranks) - 5} more" if len(ranks) > 5 else "")
    why = ("its __{0}.metadata.tmp was never renamed: rank {0} crashed while writing it" if first in rf.tmp else
           "rank {0} wrote data files but no metadata" if first in rf.data else
           "rank {0} left no file at all, although higher ranks did")
    return (f"__{first}.metadata",
            f"per-rank metadata (use_collectives=False) missing for rank(s) {', '.join(map(str, ranks[:5]))}"
            f"{' ...' if len(ranks) > 5 else ''} ({shown}): {why.format(first)}; dcp.load on such a rank finds "
            "no metadata and fails")


def read_rank_metadata(path: Path, rf: RankFiles, label: str) -> tuple[DcpMetadata | None, list[Finding]]:
    """Read and merge every `__R.metadata` of `rf` (see the module docstring). Never raises for a broken file."""
    findings: list[Finding] = []
    merged: dict[str, Tensor] = {}
    chunks: dict[str, list[Chunk]] = {}
    objects: list[ObjectItem] = []
    first: DcpMetadata | None = None
    report = PickleReport()
    for rank, name in rf.metadata.items():
        rep = PickleReport()
        try:
            md = read_metadata(path / name, rep)
        except OSError as e:
            findings.append(Finding("CK106", f"{name} unreadable: {e.strerror or e}", name, label))
            continue
        except ReadError as e:
            findings.append(Finding(e.code, f"{name}: {e}", name, label))
            continue
        finally:
            findings.extend(pickle_findings(rep, name, label))
            report.merge(rep)
        first = first or md
        for t in md.tensors:
            have = merged.get(t.key)
            if have is None:
                merged[t.key] = t
                chunks[t.key] = list(t.chunks)
            elif have.shape != t.shape or have.dtype != t.dtype:
                findings.append(Finding(
                    "CK106", f"{name}: rank {rank} describes {t.key} as {list(t.shape)} {t.dtype}, an earlier rank "
                    f"as {list(have.shape)} {have.dtype} (per-rank metadata of different saves?)", t.key, label,
                    {"rank": rank, "shape": list(t.shape), "dtype": t.dtype, "first_shape": list(have.shape),
                     "first_dtype": have.dtype}))
            else:
                chunks[t.key].extend(t.chunks)
        objects.extend(md.objects)
    if first is None:
        return None, findings
    table = ChunkTable.of(TensorEntry(t.key, t.shape, t.dtype, chunks[t.key]) for t in merged.values())
    md = DcpMetadata(table.tensors, tuple(objects), first.planner_keys, (), {}, first.version,
                     first.checkpoint_id, first.root_class, first.unknown_attrs, 0, report, table)
    return md, findings
