"""Every dtype torch defines has its own name and element size in the model (issue 25 §4).

`model.DTYPE_SIZES` and `pickling.allowlist.TORCH_DTYPES` are checked against the real `torch.dtype` objects of the
installed torch (2.13: `dir(torch)`, aliases such as `torch.half` and `torch.bit` included), then every dtype DCP can
save is written by the real `dcp.save`, loaded back by torch's own `dcp.load` (the oracle) and read here: the dtype
keeps its name (`float4_e2m1fn_x2`, not a stand-in class), the bytes are numel x itemsize, and `audit --deep`
(which checks each archive's payload against shape x dtype) says `complete`. The dtypes DCP's planner refuses
(sub-byte `uint1`..`int7`, `bits*`, quantized: `torch._utils._element_size` raises in `dedup_save_plans`) are
written with `torch.save` instead and read back from the archive's pickle.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Any

import pytest

from ckptinspect.commands.audit.audit import AuditOptions, audit
from ckptinspect.findings import Status
from ckptinspect.formats import read_checkpoint
from ckptinspect.model import DTYPE_SIZES, dtype_size
from ckptinspect.pickling.allowlist import TORCH_DTYPES, GlobalClass
from ckptinspect.pickling.policy import resolve
from ckptinspect.pickling.torch_archive import read_torch_archive

def _torch_dtypes() -> dict[str, Any]:
    """Every attribute of `torch` that is a `torch.dtype`, by attribute name."""
    import torch

    return {n: v for n in dir(torch) if isinstance(v := getattr(torch, n), torch.dtype)}


def _creatable(dt: Any) -> Any:
    import torch

    return torch.zeros(6, dtype=dt)


def test_every_torch_dtype_has_its_name_and_itemsize() -> None:
    found = _torch_dtypes()
    assert len(found) >= 40
    for attr, dt in found.items():
        name = str(dt).removeprefix("torch.")
        assert TORCH_DTYPES.get(attr) == name, (attr, TORCH_DTYPES.get(attr), name)
        assert dtype_size(name) == dt.itemsize, (name, dtype_size(name), dt.itemsize)
        assert resolve("torch", attr).verdict is GlobalClass.ALLOWED, attr
    # nothing in the tables that torch does not define
    canonical = {str(dt).removeprefix("torch.") for dt in found.values()}
    assert set(DTYPE_SIZES) == canonical
    assert set(TORCH_DTYPES) == set(found)


def _dcp_savable() -> list[str]:
    """Dtypes DCP's planner can size (`torch._utils._element_size`): the ones a real `dcp.save` writes."""
    import torch

    out = []
    for attr, dt in sorted(_torch_dtypes().items()):
        if attr != str(dt).removeprefix("torch."):
            continue  # an alias
        try:
            torch._utils._element_size(dt)
            _creatable(dt)
        except (TypeError, RuntimeError):
            continue
        out.append(attr)
    return out


DCP_DTYPES = _dcp_savable()


def test_dcp_savable_dtypes_include_every_float8_and_float4() -> None:
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
                 "float4_e2m1fn_x2", "complex32", "uint16", "uint32", "uint64", "bool"):
        assert name in DCP_DTYPES


@pytest.mark.parametrize("name", DCP_DTYPES)
def test_dcp_save_of_each_dtype_reads_back_named_and_sized(name: str, tmp_path: Path) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    dt = getattr(torch, name)
    ckpt = tmp_path / name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"t": _creatable(dt).reshape(2, 3)}, checkpoint_id=str(ckpt))
        back = _load_state_dict_from_keys(checkpoint_id=str(ckpt))  # the oracle: torch reads it back
    assert back["t"].dtype is dt and tuple(back["t"].shape) == (2, 3)
    model = read_checkpoint(ckpt, str(ckpt))
    (t,) = model.tensors
    assert t.dtype == name and t.nbytes == 6 * dt.itemsize
    report = audit(ckpt, AuditOptions(deep=True))
    assert report.status is Status.COMPLETE, [f.to_dict() for f in report.findings]
    assert not [f for f in report.findings if f.code == "CK602"]


def _torch_savable() -> list[str]:
    """The other canonical dtypes a plain `torch.save` writes (torch 2.13 refuses `uint1`..`uint7` / `int1`..`int7`
    tensors, and quantized tensors are no DCP or Megatron state)."""
    import torch

    out = []
    for attr, dt in sorted(_torch_dtypes().items()):
        if attr in DCP_DTYPES or attr != str(dt).removeprefix("torch.") or attr.startswith(("qint", "quint")):
            continue
        try:
            torch.save(torch.zeros(6, dtype=dt), io.BytesIO())
        except (KeyError, TypeError, RuntimeError):
            continue
        out.append(attr)
    return out


def test_torch_savable_dtypes_include_the_bits_types() -> None:
    assert {"bits8", "bits16", "bits1x8", "bits2x4", "bits4x2"} <= set(_torch_savable())


@pytest.mark.parametrize("name", _torch_savable())
def test_torch_save_of_each_other_dtype_reads_back_named(name: str) -> None:
    import torch

    dt = getattr(torch, name)
    buf = io.BytesIO()
    torch.save({"t": torch.zeros(6, dtype=dt)}, buf)
    buf.seek(0)
    archive = read_torch_archive(buf)
    assert not archive.report.dangerous
    ref = archive.obj["t"]
    assert ref.dtype == name, ref
    assert ref.nbytes == 6 * dt.itemsize
