"""Hostile mutation operators for the fuzz suite (issue 18): member-name case, duplicate members, a second central
directory, nested pickles in tensor storages (protocol 0/1 too), storage paths leaving the checkpoint dir, huge numbers,
deep nesting, stream-compressed (zstd) stored items and their hostile variants; (issue 24) hooks installed by a BUILD
state and called implicitly, a TorchScript `constants.pkl` member, a `.pt` file re-wrapped as a pre-1.6 tar container.

Each takes (rng, root, target, files, dirs) like the operators of `test_fuzz.py` and returns a description, or None
when it does not apply. The payload never runs (ckptinspect never executes it); the fuzz suite only checks that
every command ends cleanly (exit 0/1, valid JSON, no hang, no change to the files).
"""

from __future__ import annotations

import io
import json
import pickle
import random
import tarfile
import zipfile
from pathlib import Path

from hostile_samples import Reduce, two_directories, write_zip, zip_entries


def _pt_files(files: list[Path]) -> list[Path]:
    return [f for f in files if f.suffix in (".pt", ".distcp") and f.is_file() and not f.is_symlink()]


def _entries(p: Path) -> list[tuple[str, bytes]] | None:
    try:
        return zip_entries(p.read_bytes())
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, KeyError, RuntimeError):
        return None


def _evil() -> bytes:
    return pickle.dumps({"x": Reduce(print, ("fuzz payload, never run",))}, protocol=2)


def op_member_case(rng: random.Random, root: Path, t: Path | None, files: list[Path], dirs: list[Path]) -> str | None:
    """`data.pkl` → `DATA.PKL` (or another case mix) in place: torch's reader matches case-insensitively."""
    cands = _pt_files(files)
    if not cands:
        return None
    p = rng.choice(cands)
    data = p.read_bytes()
    new = rng.choice([b"/DATA.PKL", b"/Data.pkl", b"/data.PKL"])
    if b"/data.pkl" not in data:
        return None
    p.write_bytes(data.replace(b"/data.pkl", new, rng.choice([1, 2, -1])))
    return f"member case {new.decode()} in {p.relative_to(root)}"


def _pick_pt(rng: random.Random, files: list[Path]) -> tuple[Path, list[tuple[str, bytes]]] | None:
    """One `.pt` file of the case, drawn by `rng`, with its zip entries; None when there is no `.pt` file or the one
    drawn is not a readable, non-empty zip."""
    cands = [f for f in _pt_files(files) if f.suffix == ".pt"]
    if not cands:
        return None
    p = rng.choice(cands)
    entries = _entries(p)
    return (p, entries) if entries else None


def op_duplicate_member(rng: random.Random, root: Path, t: Path | None, files: list[Path],
                        dirs: list[Path]) -> str | None:
    picked = _pick_pt(rng, files)
    main = next((n for n, _ in picked[1] if n.endswith("/data.pkl")), None) if picked else None
    if picked is None or main is None:
        return None
    p, entries = picked
    extra = (main if rng.random() < 0.5 else main.upper(), _evil() if rng.random() < 0.7 else b"\x80\x02K\x01.")
    entries = [extra] + entries if rng.random() < 0.5 else entries + [extra]
    p.write_bytes(write_zip(entries))
    return f"duplicate member {extra[0]} in {p.relative_to(root)}"


def op_second_directory(rng: random.Random, root: Path, t: Path | None, files: list[Path],
                        dirs: list[Path]) -> str | None:
    picked = _pick_pt(rng, files)
    if picked is None or not any(n.endswith("/data.pkl") for n, _ in picked[1]):
        return None
    p, entries = picked
    evil = [(n, _evil() if n.endswith("/data.pkl") else d) for n, d in entries]
    p.write_bytes(two_directories(evil, entries) if rng.random() < 0.5 else two_directories(entries, evil))
    return f"second central directory in {p.relative_to(root)}"


def _over_storage(rng: random.Random, root: Path, files: list[Path], payload: bytes) -> str | None:
    """Overwrite the start of a stored tensor storage (`*/data/N`) of a random `.pt` / `.distcp` with `payload`; the
    place written, or None."""
    cands = _pt_files(files)
    if not cands:
        return None
    p = rng.choice(cands)
    data = bytearray(p.read_bytes())
    at = data.find(b"/data/", rng.randrange(max(1, len(data))))
    at = data.find(b"/data/") if at < 0 else at
    if at < 0:
        return None
    start = data.find(b"\x00", at) + 1
    if start <= 0 or start + len(payload) > len(data):
        return None
    data[start : start + len(payload)] = payload
    p.write_bytes(bytes(data))
    return f"a tensor storage of {p.relative_to(root)} at {start}"


def op_pickle_in_storage(rng: random.Random, root: Path, t: Path | None, files: list[Path],
                         dirs: list[Path]) -> str | None:
    """Overwrite the start of a stored tensor storage (`*/data/N`) with a pickle (TE `_extra_state`-style)."""
    where = _over_storage(rng, root, files, _evil())
    return where and f"pickle in {where}"


def op_path_out_of_dir(rng: random.Random, root: Path, t: Path | None, files: list[Path],
                       dirs: list[Path]) -> str | None:
    """`__0_0.distcp` → `../_0.distcp` (same length) in `.metadata`: the item now lies outside the checkpoint."""
    mds = [f for f in files if f.name == ".metadata" and f.is_file()]
    if not mds:
        return None
    p = rng.choice(mds)
    data = p.read_bytes()
    if b"__" not in data:
        return None
    p.write_bytes(data.replace(b"__0_", b"../_", rng.choice([1, -1])))
    if rng.random() < 0.5:
        src = next((f for f in files if f.name.startswith("__0_") and f.is_file()), None)
        if src is not None:
            (p.parent.parent / ("_" + src.name[4:])).write_bytes(src.read_bytes())
    return f"storage path out of the dir in {p.relative_to(root)}"


def op_huge_numbers(rng: random.Random, root: Path, t: Path | None, files: list[Path],
                    dirs: list[Path]) -> str | None:
    picked = _pick_pt(rng, files)
    if picked is None:
        return None
    p, entries = picked
    big = rng.choice([10**5000, -(10**4400), 1 << 64, float("inf")])
    state = {"args": {"seq_length": big, "padded_vocab_size": big}, "iteration": big, "k": {big: [big]}
             if not isinstance(big, float) else {}}
    body = pickle.dumps(state, protocol=2)
    p.write_bytes(write_zip([(n, body if n.endswith("/data.pkl") else d) for n, d in entries]))
    return f"huge numbers in {p.relative_to(root)}"


def op_deep_nesting(rng: random.Random, root: Path, t: Path | None, files: list[Path],
                    dirs: list[Path]) -> str | None:
    cands = [f for f in files if f.is_file() and (f.suffix == ".pt" or f.name == ".metadata")]
    if not cands:
        return None
    p = rng.choice(cands)
    n = rng.choice([300, 5_000, 100_000])
    body = b"\x80\x04" + rng.choice([b"}" + b")" + b"\x85" * n + b"K\x01s", b"(" + b")" + b"\x85" * n + b"\x91",
                                     b"]" * n + b"a" * (n - 1)]) + b"."
    if p.name == ".metadata":
        p.write_bytes(body)
    else:
        entries = _entries(p)
        if not entries:
            return None
        p.write_bytes(write_zip([(nm, body if nm.endswith("/data.pkl") else d) for nm, d in entries]))
    return f"nesting {n} deep in {p.relative_to(root)}"


def _s(text: str) -> bytes:
    b = text.encode()
    return b"\x8c" + bytes([len(b)]) + b


def op_implicit_call(rng: random.Random, root: Path, t: Path | None, files: list[Path],
                     dirs: list[Path]) -> str | None:
    """A first BUILD on an inert carrier installs a callable as `__setstate__` / `append` / `extend` / `add` (as a
    dict or slot state, through the memo, or under a computed key); the next opcode calls it (issue 24)."""
    cands = [f for f in _pt_files(files) if f.suffix == ".pt"]
    if not cands:
        return None
    p = rng.choice(cands)
    entries = _entries(p)
    if not entries:
        return None
    carrier = rng.choice([b"collections\nOrderedDict", b"argparse\nNamespace", b"types\nSimpleNamespace"])
    module, name = carrier.split(b"\n")
    make = _s(module.decode()) + _s(name.decode()) + b"\x93)R"
    fn = _s("builtins") + _s("print") + b"\x93"
    hook = rng.choice(["__setstate__", "append", "extend", "add"])
    call = {"__setstate__": _s("x") + b"b", "append": _s("x") + b"a", "extend": b"(" + _s("x") + b"e",
            "add": b"(" + _s("x") + b"\x90"}[hook]
    how = rng.choice(["dict", "slots", "memo", "computed"])
    if how == "dict":
        state = b"}" + _s(hook) + fn + b"sb"
    elif how == "slots":
        state = b"N}" + _s(hook) + fn + b"s\x86b"
    elif how == "memo":
        make, state = b"}\x94" + _s(hook) + fn + b"s0" + make, b"h\x00b"
    else:
        state = b"}" + _s("builtins") + _s("str") + b"\x93" + _s(hook) + b"\x85R" + fn + b"sb"
    body = b"\x80\x04" + make + state + call + b"."
    p.write_bytes(write_zip([(nm, body if nm.endswith("/data.pkl") else d) for nm, d in entries]))
    return f"{hook} installed on {name.decode()} ({how}) in {p.relative_to(root)}"


def op_torchscript_member(rng: random.Random, root: Path, t: Path | None, files: list[Path],
                          dirs: list[Path]) -> str | None:
    """Add `<archive>/constants.pkl` (what `torch.jit.save` writes: a pickled tuple) to a `.pt` file, and maybe a
    `code/` member: torch.load would hand the archive to torch.jit.load (CK606)."""
    picked = _pick_pt(rng, files)
    main = next((n for n, _ in picked[1] if n.endswith("/data.pkl")), None) if picked else None
    if picked is None or main is None:
        return None
    p, entries = picked
    prefix = main[: -len("data.pkl")]
    extra = [(prefix + "constants.pkl", pickle.dumps((), protocol=2))]
    if rng.random() < 0.5:
        extra.append((prefix + "code/__torch__.py", b"class M(Module):\n  __parameters__ = []\n"))
    at = rng.randrange(len(entries) + 1)
    p.write_bytes(write_zip(entries[:at] + extra + entries[at:]))
    return f"TorchScript member {prefix}constants.pkl in {p.relative_to(root)}"


def tar_container(main: bytes, storages: bytes = b"\x80\x02K\x00.\x80\x02]q\x00.",
                  tensors: bytes = b"\x80\x02K\x00.") -> bytes:
    """The pre-1.6 `torch.save` tar layout (torch/serialization.py `_legacy_load`): `storages` (no storage, no
    views), `tensors` (none) and `pickle` = `main`."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("storages", storages), ("tensors", tensors), ("pickle", main)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def op_tar_container(rng: random.Random, root: Path, t: Path | None, files: list[Path],
                     dirs: list[Path]) -> str | None:
    """Re-wrap a `.pt` file as a pre-1.6 tar container: its `data.pkl` (or a payload, in `pickle` or in the
    `storages` record count) as the tar's pickles; sometimes truncated."""
    picked = _pick_pt(rng, files)
    main = next((d for n, d in picked[1] if n.endswith("/data.pkl")), None) if picked else None
    if picked is None or main is None:
        return None
    p = picked[0]
    kind = rng.choice(["benign", "evil-pickle", "evil-storages", "truncated"])
    if kind == "evil-pickle":
        data = tar_container(_evil())
    elif kind == "evil-storages":
        data = tar_container(main, storages=_evil())
    else:
        data = tar_container(main)
    if kind == "truncated":
        data = data[: rng.randrange(513, 2048)]
    p.write_bytes(data)
    return f"tar container ({kind}) in place of {p.relative_to(root)}"


def op_protocol0_pickle(rng: random.Random, root: Path, t: Path | None, files: list[Path],
                        dirs: list[Path]) -> str | None:
    """A protocol 0 or 1 pickle (no PROTO header: it starts with an opcode) over the start of a tensor storage, the
    way a TE `_extra_state` tensor holds one (Megatron-Core decodes those with `pickle.loads`, any protocol)."""
    protocol = rng.choice([0, 1])
    payload = pickle.dumps({"x": Reduce(print, ("fuzz payload, never run",))}, protocol=protocol)
    where = _over_storage(rng, root, files, payload)
    return where and f"protocol-{protocol} pickle in {where}"


class _MetadataOnly(pickle.Unpickler):
    """Reads a DCP `.metadata` the fuzzer may already have mutated: only the classes a `.metadata` is made of are
    resolved (a mutated one holding anything else is left alone), so a payload an earlier operator wrote never runs
    in the test process."""

    _MODULES = ("torch.distributed.checkpoint.", "megatron.core.dist_checkpointing.")

    def find_class(self, module: str, name: str) -> object:
        import torch

        if module.startswith(self._MODULES) or (module, name) in {("collections", "OrderedDict"),
                                                                   ("torch", "Size"), ("builtins", "set"),
                                                                   ("torch.serialization", "_get_layout"),
                                                                   ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath")} or (
                module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout,
                                                                              torch.memory_format))):
            import torch.distributed.checkpoint  # noqa: F401 - the classes the pickle names

            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not a .metadata class")


def op_compressed_item(rng: random.Random, root: Path, t: Path | None, files: list[Path],
                       dirs: list[Path]) -> str | None:
    """One stored item re-written zstd-compressed, as `FileSystemWriter(_extensions=[ZStandard()])` writes it (its
    `_StorageInfo.transform_descriptors` = ``["stream.zstd/1"]``), or as a hostile variant: an unknown descriptor,
    a truncated stream, a decompression bomb (a few KB decoding to 64 MiB)."""
    try:
        import zstandard
        from torch.distributed.checkpoint.filesystem import _StorageInfo
    except ImportError:
        return None
    mds = [f for f in files if f.name == ".metadata" and f.is_file() and not f.is_symlink()]
    if not mds:
        return None
    p = rng.choice(mds)
    try:
        with open(p, "rb") as fh:
            md = _MetadataOnly(fh).load()
        storage = dict(md.storage_data)
    except Exception:  # noqa: BLE001 - a mutated .metadata: not this operator's case
        return None
    if not storage:
        return None
    index = rng.choice(sorted(storage, key=lambda i: (i.fqn, str(i.offset))))
    info = storage[index]
    data_file = p.parent / str(info.relative_path)
    if not data_file.is_file() or data_file.is_symlink() or ".." in str(info.relative_path):
        return None
    with open(data_file, "rb") as fh:
        fh.seek(info.offset)
        raw = fh.read(info.length)
    variant = rng.choice(["zstd", "zstd", "unknown", "truncated", "bomb"])
    blob = zstandard.ZstdCompressor().compress(b"\0" * (64 << 20) if variant == "bomb" else raw)
    if variant == "truncated":
        blob = blob[: max(1, len(blob) // 2)]
    offset = data_file.stat().st_size
    with open(data_file, "ab") as fh:
        fh.write(blob)
    md.storage_data[index] = _StorageInfo(info.relative_path, offset, len(blob),
                                          ["stream.lz4/1" if variant == "unknown" else "stream.zstd/1"])
    p.write_bytes(pickle.dumps(md))
    return f"compressed item ({variant}) {index.fqn} in {p.relative_to(root)}"


def op_safetensors_header(rng: random.Random, root: Path, t: Path | None, files: list[Path],
                          dirs: list[Path]) -> str | None:
    """(issue 28) A safetensors file's header made hostile: a 2**63 or past-EOF length, 10,000-deep JSON, or one
    entry's dtype / shape / data_offsets rewritten (overlap, gap, size mismatch, negative, huge)."""
    cands = [f for f in files if f.suffix == ".safetensors" and f.is_file() and not f.is_symlink()]
    if not cands:
        return None
    p = rng.choice(cands)
    raw = p.read_bytes()
    if len(raw) < 8:
        return None
    n = int.from_bytes(raw[:8], "little")
    kind = rng.choice(["length", "eof", "deep", "entry", "entry", "entry"])
    if kind == "length":
        p.write_bytes((1 << 63).to_bytes(8, "little") + raw[8:])
    elif kind == "eof":
        p.write_bytes((len(raw) - 8 + rng.randrange(1, 64)).to_bytes(8, "little") + raw[8:])
    elif kind == "deep":
        deep = b'{"a":' + b"[" * 10000 + b"]" * 10000 + b"}"
        p.write_bytes(len(deep).to_bytes(8, "little") + deep + raw[8 + n:])
    else:
        try:
            header = json.loads(raw[8:8 + n])
        except ValueError:
            return None
        names = [k for k in header if k != "__metadata__"]
        if not names:
            return None
        name = rng.choice(names)
        field = rng.choice(["dtype", "shape", "data_offsets"])
        header[name][field] = rng.choice({
            "dtype": ["F16", "F64", "X9", "", 7],
            "shape": [[], [0], [1 << 62], [0, 1 << 70], [-1], "x", [3] * 65],
            "data_offsets": [[0, 0], [0, 1 << 63], [5, 1], [-1, 2], None, [1, 2, 3]],
        }[field])
        text = json.dumps(header).encode()
        p.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])
        return f"safetensors {name[:40]}.{field} = {header[name][field]!r:.40} in {p.relative_to(root)}"
    return f"safetensors header {kind} in {p.relative_to(root)}"


HOSTILE_OPS = [op_member_case, op_duplicate_member, op_second_directory, op_pickle_in_storage, op_path_out_of_dir,
               op_huge_numbers, op_deep_nesting, op_protocol0_pickle, op_compressed_item, op_implicit_call,
               op_torchscript_member, op_tar_container, op_safetensors_header]
