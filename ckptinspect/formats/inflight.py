"""A Megatron save that has not finished: how its iteration dir is recognised, and the age rule that tells a save
being written from a crash leftover.

Write order of a Megatron-Core torch_dist save (reference §2 "Ordering", §8.1): rank 0 creates `iter_{N:07d}/`
(`os.makedirs`), writes `common.pt` (≤0.18, `torch.save`, before the sharded save, also in async mode), the ranks
write `__{rank}_{i}.distcp`, the coordinator `.metadata.tmp` → `.metadata`, rank 0 `metadata.json` with a plain
`open('w')` + `json.dump`, then `integrity.json` (optional) and last the tracker `latest_checkpointed_iteration.txt`.
A reader polling the dir meanwhile sees, in turn: an empty dir, a growing `common.pt`, growing `.distcp` files, a
`.metadata.tmp`, `.metadata` without `metadata.json`, an empty or cut `metadata.json`, the whole marker.
Megatron-Core writes every one of these files through multistorageclient (MSC) when that package is installed
(`msc_utils.MultiStorageClientFeature`, on unless Megatron-LM's `--disable-msc`): MSC's `PosixFile` writes
`.<name>.tmp` beside the target and renames it at close, so the growing files are `.common.pt.tmp`,
`.__0_0.distcp.tmp`, `..metadata.tmp`, `.metadata.json.tmp`, and `metadata.json` is never seen cut.

Recognition (`megatron_iteration`): a dir named exactly `iter_{N:07d}` (Megatron's `get_checkpoint_name`; at least
7 digits, no extra leading zero) that sits in a Megatron save dir — the caller reads it as one (`megatron_context`),
or its parent holds the tracker. Only then is an empty dir a save that started (CK130) rather than no checkpoint
(CK100).

Age rule (`GRACE_SECONDS`, environment `CKPTINSPECT_WRITE_GRACE_SECONDS`): an unfinished iteration is *being
written* while the newest modification time of the dir and its top-level entries is less than the grace before now
and the tracker does not name a later iteration; otherwise it is a *crash leftover*. The tracker is Megatron's
clock-free witness: its finalize functions run in save order, so a tracker naming a later iteration means this
save's finalize will never run. A newer `iter_*` dir is no such witness (an async save may start the next one
before this one is finalized). A `metadata.json` cut short in the *tracked* iteration is neither: the tracker is
written after the marker, so the marker was whole once and was damaged since (CK104, corrupt).

A legacy save (`--ckpt-format torch`, Megatron-LM `save_checkpoint`): each writing rank makes its
`iter_N/mp_rank_*/` dir, writes `distrib_optim.pt` (distributed optimizer) then `model_optim_rng.pt`, each with a
plain `torch.save`; rank 0 writes the tracker after the barrier. While the save runs, shard dirs and files are
missing and one file is cut short: in an untracked iteration within the grace that is the write in progress (CK132,
incomplete, `legacy_save_age`); older than the grace, or in the tracked iteration, it is damage (CK110 / CK111 /
CK206, corrupt), as before. The tracker itself is written with a plain `open('w')`: an *empty* tracker modified
within the grace is being written (CK133, incomplete); an empty one older than that is unparseable (CK502).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from ckptinspect.io.local import read_small
from ckptinspect.io.objpath import ObjectPath

GRACE_SECONDS = 120.0  # default: far above a marker's write (microseconds), above NFS attribute caching (≤60 s)
GRACE_ENV = "CKPTINSPECT_WRITE_GRACE_SECONDS"
TRACKER = "latest_checkpointed_iteration.txt"
COMMON_PT = "common.pt"
MSC_METADATA_TMP = "..metadata.tmp"  # multistorageclient's atomic-write temp of `.metadata`
SHARD_PREFIX = "mp_rank_"  # Megatron-LM's legacy shard dirs (`mp_rank_{tp:02d}[_{pp:03d}][_{ep:03d}]`)
MAX_SHARD_ENTRIES = 64  # entries looked at per shard dir (Megatron writes two files there)
_MEGATRON_ITER = re.compile(r"^iter_(\d{7,})$")
_LITERAL_PREFIXES = ("true", "false", "null")
_NUMBER_PREFIX = re.compile(r"^-?\d*(\.\d*)?([eE][+-]?\d*)?$")
_ESCAPE_PREFIX = re.compile(r"^u[0-9a-fA-F]{0,4}$")  # json reports the position after the backslash


def grace_seconds() -> float:
    """The grace of the age rule: `CKPTINSPECT_WRITE_GRACE_SECONDS` when set to a non-negative number, else 120."""
    raw = os.environ.get(GRACE_ENV)
    if raw is None:
        return GRACE_SECONDS
    try:
        value = float(raw)
    except ValueError:
        return GRACE_SECONDS
    return value if value >= 0 and value == value and value != float("inf") else GRACE_SECONDS


def megatron_iteration(path: Path, megatron_context: bool) -> int | None:
    """N when `path` is Megatron's `iter_{N:07d}` dir of a save dir (see the module doc), else None."""
    m = _MEGATRON_ITER.match(path.name)
    if m is None or path.name != f"iter_{int(m.group(1)):07d}":
        return None
    if megatron_context:
        return int(m.group(1))
    try:
        return int(m.group(1)) if (path.parent / TRACKER).is_file() else None
    except OSError:
        return None


def msc_temp_of(name: str, suffix: str) -> bool:
    """Whether `name` is multistorageclient's atomic-write temp (`.<target>.tmp`) of a file ending in `suffix`."""
    return name.startswith(".") and name.endswith(suffix + ".tmp") and len(name) > len(suffix) + 5


def save_file(name: str) -> bool:
    """Whether `name` is a file a Megatron torch_dist save writes into its iteration dir (or MSC's temp of one)."""
    if name in (COMMON_PT, ".metadata", ".metadata.tmp", MSC_METADATA_TMP, "metadata.json"):
        return True
    return name.endswith(".distcp") or any(msc_temp_of(name, s) for s in (".distcp", COMMON_PT, "metadata.json"))


def only_started(path: Path) -> tuple[bool, tuple[str, ...]]:
    """Whether `path` holds nothing a save writes after `common.pt`: (True, names) for an empty dir or one holding
    only `common.pt` (whole or cut) or MSC's temp of it, else (False, ())."""
    try:
        names = tuple(sorted(p.name for p in path.iterdir()))
    except OSError:
        return False, ()
    return (set(names) <= {COMMON_PT, f".{COMMON_PT}.tmp"}), names


@dataclass(frozen=True, slots=True)
class Age:
    """The age rule's verdict on one unfinished iteration dir. Reported values are the files' own (`newest_mtime`,
    epoch seconds), so two audits of the same tree say the same thing; only `in_progress` depends on the clock."""

    in_progress: bool | None  # None: no modification times to judge by (object storage) and no later tracker
    newest_mtime: float | None  # newest modification time of the dir and its top-level entries (None: none stat'ed)
    superseded: bool  # the tracker names a later iteration
    grace_seconds: float

    def describe(self) -> str:
        if self.superseded:
            return "a crash leftover (the tracker names a later iteration)"
        if self.in_progress is None:
            return "being written or a crash leftover (no modification times to tell by)"
        if self.in_progress:
            return f"being written (its newest file is within the {self.grace_seconds:g} s grace)"
        return f"a crash leftover (nothing written to it for more than the {self.grace_seconds:g} s grace)"

    def to_dict(self) -> dict[str, object]:
        return {"in_progress": self.in_progress, "newest_mtime": self.newest_mtime, "superseded": self.superseded,
                "grace_seconds": self.grace_seconds}


def newest_mtime(path: Path) -> float | None:
    """The newest modification time of `path` and its top-level entries, and of the entries of its legacy
    `mp_rank_*` shard dirs (a legacy save writes its files there: a growing `model_optim_rng.pt` changes no
    top-level time); other sub-dirs are not entered. On object storage the same from the listings: the objects'
    last-modified times (a prefix has none of its own). None where there are no times to read."""
    if isinstance(path, ObjectPath):
        return _object_times(path)
    times: list[float] = []
    try:
        times.append(path.stat().st_mtime)
        with os.scandir(path) as it:
            for entry in it:
                try:
                    times.append(entry.stat(follow_symlinks=False).st_mtime)
                    if entry.name.startswith(SHARD_PREFIX) and entry.is_dir(follow_symlinks=False):
                        times.extend(_entry_times(entry.path))
                except OSError:
                    continue
    except (OSError, TypeError):  # TypeError: `ObjectPath` has neither stat() nor a local path
        pass
    return max(times) if times else None


def _object_times(path: ObjectPath) -> float | None:
    """`newest_mtime` of a prefix: its objects' and its `mp_rank_*` sub-prefixes' objects' last-modified times (a
    listing per prefix, which the store caches; at most `MAX_SHARD_ENTRIES` sub-prefix entries read)."""
    times: list[float] = []
    try:
        for entry in path.iterdir():
            if entry.name.startswith(SHARD_PREFIX) and entry.is_dir():
                times.extend(t for t in (c.last_modified() for c in islice(entry.iterdir(), MAX_SHARD_ENTRIES))
                             if t is not None)
            else:
                t = entry.last_modified()
                if t is not None:
                    times.append(t)
    except OSError:  # a listing that failed: no times (the readers report the failure itself)
        pass
    return max(times) if times else None


def _entry_times(path: str) -> list[float]:
    out: list[float] = []
    with os.scandir(path) as it:
        for entry in islice(it, MAX_SHARD_ENTRIES):
            try:
                out.append(entry.stat(follow_symlinks=False).st_mtime)
            except OSError:
                continue
    return out


def written_within_grace(path: Path, now: float | None = None) -> bool:
    """Whether the file `path` was modified less than the grace (`grace_seconds`) before now; False when it has no
    modification time to read (absent, an object: an object appears whole, never mid-write)."""
    try:
        mtime = path.stat().st_mtime
    except (OSError, TypeError, AttributeError):
        return False
    return (time.time() if now is None else now) - mtime < grace_seconds()


def legacy_save_age(path: Path, megatron_context: bool) -> Age | None:
    """The age rule's verdict on a legacy (`mp_rank_*`) iteration dir that may be a save being written: for
    Megatron's `iter_{N:07d}` of a save dir that the tracker does not name (Megatron-LM writes the shard files —
    `distrib_optim.pt` first, then `model_optim_rng.pt`, each a plain `torch.save` — and only then the tracker);
    None for any other dir (the tracked iteration, a dir outside a save dir: its missing or cut files are damage)."""
    n = megatron_iteration(path, megatron_context)
    if n is None or is_tracked(path):
        return None
    return age_of(path, n)


def tracked_iteration(save: Path) -> int | str | None:
    """The iteration the tracker in `save` names (int, "release"), or None (absent, unreadable, unparseable)."""
    try:
        text = read_small(save / TRACKER, 4096).decode("utf-8", "replace").strip()
    except (OSError, TypeError):
        return None
    if text == "release":
        return text
    return int(text) if text.isdigit() and len(text) <= 20 else None


_UNREAD = object()


def age_of(path: Path, iteration: int | None, now: float | None = None, tracked: object = _UNREAD) -> Age:
    """The age rule (module doc) for the unfinished iteration dir `path` (iteration `iteration` when known).
    `tracked`: the tracker's iteration when the caller read it already (else the tracker beside `path` is read)."""
    grace = grace_seconds()
    newest = newest_mtime(path)
    if tracked is _UNREAD:
        tracked = tracked_iteration(path.parent) if iteration is not None else None
    superseded = isinstance(tracked, int) and iteration is not None and tracked > iteration
    in_progress: bool | None
    if superseded:
        in_progress = False
    elif newest is None:
        in_progress = None
    else:
        in_progress = (time.time() if now is None else now) - newest < grace
    return Age(in_progress, newest, superseded, grace)


def is_tracked(path: Path) -> bool:
    """Whether the tracker beside `path` names it (`iter_{N:07d}` with N the tracker's iteration, or `release`)."""
    tracked = tracked_iteration(path.parent)
    if tracked == "release":
        return path.name == "release"
    return isinstance(tracked, int) and path.name == f"iter_{tracked:07d}"


def cut_json(data: bytes) -> bool:
    """Whether `data` is a JSON text cut short: empty, or a proper prefix of some JSON document (what an
    interrupted `open('w')` + `json.dump` leaves). A complete document, or bytes no JSON document starts with, is
    not."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        # a multi-byte character cut at the end is still a prefix
        if e.start < len(data) - 3 or e.reason != "unexpected end of data":
            return False
        text = data[:e.start].decode("utf-8", "replace")
    if not text.strip():
        return True
    try:
        json.loads(text)
        return False
    except json.JSONDecodeError as e:
        rest = text[e.pos:].rstrip()
        if e.msg.startswith("Unterminated string"):
            return True
        if e.msg.startswith("Invalid \\uXXXX escape"):
            return bool(_ESCAPE_PREFIX.match(rest))
        if e.pos >= len(text.rstrip()):
            return True  # ran out of input where a value, a name, a ':' or a ',' was expected
        return any(lit.startswith(rest) for lit in _LITERAL_PREFIXES) or bool(_NUMBER_PREFIX.match(rest))
    except RecursionError:
        return False
