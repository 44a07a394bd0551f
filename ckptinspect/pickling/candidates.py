"""Every pickle a loader could unpickle from one torch archive, walked: the shared ground of `audit` and `scan`.

`archive_walks` lists, for the archive at a byte range of a file:
- every `.pkl` member under every zip reading (`zipdir.py`: letter case, duplicates, second central directories,
  prepended bytes);
- tensor storages (`data/N`) whose bytes are a pickle: Transformer Engine ≥ 2.0 keeps `_extra_state` as a uint8
  tensor of `pickle.dumps(state)` and Megatron-Core decodes it with `pickle.loads` on load
  (megatron-core 0.16.1 megatron/core/extensions/transformer_engine.py `_decode_extra_state`:
  `pickle.loads(state.detach().cpu().numpy().tobytes())`, whatever the tensor's dtype). `pickle.loads` takes any
  protocol: a protocol 0/1 pickle has no PROTO header and starts with any opcode. Storages starting with PROTO 2–5
  are walked everywhere; in an `_extra_state` archive (the caller knows the item's key: `extra_state`) or an
  archive whose `data.pkl` names an `_extra_state` key (a legacy `model_optim_rng.pt`), every storage starting with
  an opcode `pickle.loads` accepts is walked too. Elsewhere tensor bytes that start with, say, `N` are data, and
  walking every storage would cost `--deep` a walk per tensor;
- byte strings inside a pickle that hold a pickle or a zip archive (a pickled `io.BytesIO` of a `torch.save`, which
  TE < 2.0 hands to `torch.load`), recursively up to `MAX_NESTED_BLOBS` levels.
Nested pickles that would run nothing are not listed (tensor bytes that happen to look like a pickle are data).
An archive with a `constants.pkl` record is a TorchScript archive: `torch.load` hands it to `torch.jit.load`, which runs
its code whatever its pickles say; it is listed as a `Walked` of its own (`torchscript`), so `audit` (`torch_archive`)
and `scan` (`services/safety_containers`) both report it.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import IO

from ckptinspect.pickling.walk import PickleWalk, is_pickle_start, walk_pickle, walk_stream
from ckptinspect.pickling.zipdir import (
    LOCAL, ZipMember, is_pickle_member, is_torchscript_record, member_bytes, zip_members,
)

MAX_MEMBER_PICKLE = 1 << 30  # a `.pkl` member, inflated
MAX_STORAGE_PICKLE = 1 << 30  # a tensor storage walked as a pickle (streamed)
MAX_NESTED_BLOBS = 3
MAX_BLOB_BYTES = 256 << 20
TORCHSCRIPT = "TorchScript archive: torch.load would hand it to torch.jit.load, which runs its code"


@dataclass(frozen=True, slots=True)
class Walked:
    """One pickle found in an archive. where: the member (``archive/data.pkl``, ``archive/data/3``, with
    ``!blob@offset`` for a byte string inside), size: its bytes, problem: why it could not be walked (then walk is
    None), torchscript: the archive is a TorchScript one (where: its `constants.pkl` record; CK606)."""

    where: str
    walk: PickleWalk | None
    size: int
    problem: str | None = None
    limit: bool = False
    torchscript: bool = False


EXTRA_STATE = "_extra_state"  # the state-dict key suffix of Transformer Engine's extra state


def archive_walks(f: IO[bytes], offset: int, length: int, depth: int = 0,
                  extra_state: bool = False) -> tuple[list[Walked], list[ZipMember], str | None]:
    """(pickles walked, every member, why the directory is unreadable) for the zip archive at [offset, +length).
    `extra_state`: the archive is a TE `_extra_state` item, whose storages `pickle.loads` decodes (any protocol)."""
    members, why = zip_members(f, offset, length)
    out: list[Walked] = []
    script = next((m for m in members if is_torchscript_record(m.name)), None)
    if script is not None:
        out.append(Walked(script.name, None, script.size, TORCHSCRIPT, torchscript=True))
    storages: list[ZipMember] = []
    for m in members:
        if not is_pickle_member(m.name):
            if "/data/" in f"/{m.name}" and m.method == 0 and m.size >= 4:
                storages.append(m)
            continue
        if m.size > MAX_MEMBER_PICKLE:
            out.append(Walked(m.name, None, m.size, f"claims {m.size} bytes uncompressed (bound "
                              f"{MAX_MEMBER_PICKLE}; zip bomb?)", limit=True))
            continue
        data = member_bytes(f, offset, length, m, MAX_MEMBER_PICKLE)
        if isinstance(data, str):
            out.append(Walked(m.name, None, 0, data))
        elif len(data) > MAX_MEMBER_PICKLE:
            out.append(Walked(m.name, None, len(data), "inflates past the bound (zip bomb?)", limit=True))
        else:
            walk = walk_pickle(data)
            out.append(Walked(m.name, walk, len(data)))
            out.extend(blob_walks(data, walk, m.name, depth + 1))
            extra_state = extra_state or _EXTRA_STATE_BYTES in data
    for m in storages:
        out.extend(_storage_walk(f, offset, length, m, extra_state))
    return out, members, why


_EXTRA_STATE_BYTES = EXTRA_STATE.encode()


def _storage_walk(f: IO[bytes], offset: int, length: int, m: ZipMember, any_protocol: bool) -> list[Walked]:
    """A stored tensor storage that is a pickle which would run code when `pickle.loads` decodes it: one with a
    PROTO 2–5 header, or (`any_protocol`) one starting with any opcode `pickle.loads` accepts."""
    from ckptinspect.pickling.zipdir import data_offset

    start = data_offset(f, offset, length, m)
    if start is None:
        return []
    f.seek(offset + start)
    head = f.read(2)
    if len(head) < 2 or not (is_pickle_start(head) if any_protocol else head[0] == 0x80 and 2 <= head[1] <= 5):
        return []
    size = min(m.compressed_size, MAX_STORAGE_PICKLE)
    f.seek(offset + start)
    walk = walk_stream(f, size)
    return [Walked(m.name, walk, size)] if walk.unsafe else []


def blob_walks(data: bytes, walk: PickleWalk, where: str, depth: int) -> list[Walked]:
    """Pickles and torch archives held in byte strings of a walked pickle, when they would run code."""
    out: list[Walked] = []
    for off, n, latin1 in walk.blobs:
        label = f"{where}!blob@{off}"
        if depth > MAX_NESTED_BLOBS:
            out.append(Walked(label, None, n, f"byte strings nested deeper than {MAX_NESTED_BLOBS}", limit=True))
            break
        if n > MAX_BLOB_BYTES:
            out.append(Walked(label, None, n, f"embedded blob of {n} bytes (bound {MAX_BLOB_BYTES})", limit=True))
            continue
        blob = data[off : off + n]
        if latin1:
            try:
                blob = blob.decode("utf-8", "surrogatepass").encode("latin-1")
            except (UnicodeDecodeError, UnicodeEncodeError):
                continue
        if blob[:4] == LOCAL:
            inner, _, _ = archive_walks(io.BytesIO(blob), 0, len(blob), depth + 1)
            out.extend(Walked(f"{label}!{w.where}", w.walk, w.size, w.problem, w.limit, w.torchscript) for w in inner
                       if w.limit or w.torchscript
                       or (w.walk is not None and (w.walk.unsafe or w.walk.limit is not None)))
        elif is_pickle_start(blob[:2]):
            inner_walk = walk_pickle(blob)
            if inner_walk.unsafe or inner_walk.limit is not None:
                out.append(Walked(label, inner_walk, n))
            out.extend(blob_walks(blob, inner_walk, label, depth + 1))
    return out
