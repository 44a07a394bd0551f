"""Verdict parity for pickles a loader reaches through storage (issue 18 §1): Transformer Engine `_extra_state` uint8
tensors that Megatron-Core decodes with `pickle.loads`, pickled `BytesIO` values, and DCP byte items whose
`relative_path` leaves the checkpoint dir (DCP reads them from there). Each sample is loaded by the real loader in a
subprocess (the payload touches a marker), and `audit` and `scan` must say `unsafe`. Also: the reader's stand-ins
are per-load and immutable.
"""

from __future__ import annotations

import io
import pickle
import shutil
from pathlib import Path

import pytest

from ckptinspect.commands.audit.audit import audit
from ckptinspect.findings import Status
from ckptinspect.pickling.unpickle import PickleReport, load_pickle
from ckptinspect.pickling.torch_archive import read_torch_file
from ckptinspect.commands.scan.scan import scan_path
from hostile_samples import (payload, relay_item, run_real_loaders, torch_save_bytes, uint8_tensor_of, write_zip,
                             zip_entries)

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_ckpts"
EXTRA_KEY = "decoder.layers.mlp.linear_fc1._extra_state/shard_0_2"
DCP_KEY = "lr_scheduler.last_epoch"


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """name → (checkpoint dir, marker); every sample loaded once by its real loader (one subprocess)."""
    root = tmp_path_factory.mktemp("storage")
    out: dict[str, tuple[Path, Path]] = {}
    jobs = []
    for kind in ("os.system", "timeit", "import_module"):
        m = root / f"ran-extra-{kind}"
        ckpt = root / f"extra-{kind}" / "iter_0000001"
        shutil.copytree(SAMPLES / "torch_dist_fully" / "iter_0000001", ckpt)
        f, off, n = relay_item(ckpt, EXTRA_KEY, torch_save_bytes(uint8_tensor_of(payload(m, kind))))
        jobs.append(("extra_state", [str(f), str(off), str(n)]))
        out[f"extra:{kind}"] = (ckpt, m)
    # TE < 2.0: the extra state is a BytesIO of a torch.save, handed to torch.load on decode.
    m = root / "ran-bytesio"
    ckpt = root / "bytesio" / "iter_0000001"
    shutil.copytree(SAMPLES / "torch_dist_fully" / "iter_0000001", ckpt)
    inner = write_zip([(n, payload(m) if n.endswith("data.pkl") else d)
                       for n, d in zip_entries(torch_save_bytes({"x": 1}))])
    f, off, n = relay_item(ckpt, EXTRA_KEY, torch_save_bytes(io.BytesIO(inner)))
    out["bytesio"] = (ckpt, m)
    for where in ("parent", "absolute"):
        m = root / f"ran-dcp-{where}"
        ckpt = root / f"dcp-{where}" / "step-10"
        shutil.copytree(SAMPLES / "dcp" / "step-10", ckpt)
        outside = ckpt.parent / "outside.distcp"
        evil = write_zip([(n, payload(m, "timeit") if n.endswith("data.pkl") else d)
                          for n, d in zip_entries(torch_save_bytes(7))])
        rel = "../outside.distcp" if where == "parent" else str(outside)
        relay_item(ckpt, DCP_KEY, evil, relative_path=rel, target=outside)
        jobs.append(("dcp", [str(ckpt), DCP_KEY]))
        out[f"dcp:{where}"] = (ckpt, m)
    run_real_loaders(jobs)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["extra:os.system", "extra:timeit", "extra:import_module", "dcp:parent",
                                  "dcp:absolute"])
def test_the_real_loader_runs_it_and_ckptinspect_says_unsafe(name: str, samples: dict[str, tuple[Path, Path]]) -> None:
    ckpt, m = samples[name]
    assert m.exists(), "the real loader did not run the payload"
    s, a = scan_path(ckpt, "s"), audit(ckpt)
    assert s.status is Status.UNSAFE, s.findings
    assert a.status is Status.UNSAFE, a.findings


@pytest.mark.slow
def test_a_bytesio_holding_a_hostile_archive_is_unsafe(samples: dict[str, tuple[Path, Path]]) -> None:
    ckpt, _ = samples["bytesio"]
    assert scan_path(ckpt, "s").status is Status.UNSAFE
    assert audit(ckpt).status is Status.UNSAFE


@pytest.mark.slow
@pytest.mark.parametrize("where", ["parent", "absolute"])
def test_a_storage_path_leaving_the_checkpoint_dir_is_a_finding(where: str,
                                                                samples: dict[str, tuple[Path, Path]]) -> None:
    ckpt, _ = samples[f"dcp:{where}"]
    assert "CK207" in {f.code for f in audit(ckpt).findings}
    assert "CK207" in {f.code for f in scan_path(ckpt, "s").findings}


def test_a_clean_uint8_extra_state_tensor_is_not_flagged(tmp_path: Path) -> None:
    ckpt = tmp_path / "iter_0000001"
    shutil.copytree(SAMPLES / "torch_dist_fully" / "iter_0000001", ckpt)
    relay_item(ckpt, EXTRA_KEY, torch_save_bytes(uint8_tensor_of(pickle.dumps({"scale": [1.0, 2.0]}))))
    assert scan_path(ckpt, "s").status is Status.COMPLETE
    assert audit(ckpt).status is Status.COMPLETE


# --- stand-ins --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", [b"ccollections\nOrderedDict\n", b"ctorch._utils\n_rebuild_tensor_v2\n",
                                    b"cargparse\nNamespace\n", b"ctorch.distributed.checkpoint.metadata\nMetadata\n"])
def test_build_on_a_stand_in_class_changes_nothing_for_later_loads(target: bytes) -> None:
    # BUILD with a slot state on the class itself: setattr(OrderedDict, "get", None), ...
    hostile = b"\x80\x02" + target + b"N}X\x03\x00\x00\x00getNs\x86b."
    report = PickleReport()
    try:
        load_pickle(hostile, report)
    except Exception:  # noqa: BLE001 - refusing is fine
        pass
    assert report.called  # BUILD on a class object is a call (CK604)
    common = read_torch_file(SAMPLES / "torch_dist_fully" / "iter_0000001" / "common.pt")
    assert common.report.globals and not common.report.unsafe
    from ckptinspect.pickling.plain import to_plain

    state = to_plain(common.obj)
    assert isinstance(state, dict) and "args" in state and len(state) > 2


# --- pickles of any protocol in `_extra_state` tensors (issue 24 §2) -----------------------------------------------


def _proto_payload(marker: Path, protocol: int) -> bytes:
    """`os.system("touch marker")` pickled with protocol 0 or 1: no PROTO header, it starts with the GLOBAL opcode."""
    import os

    from hostile_samples import Reduce

    data = pickle.dumps(Reduce(os.system, (f"touch {marker}",)), protocol=protocol)
    assert data[:1] == b"c"
    return data


def _dcp_extra_state_tensor(ckpt: Path, data: bytes) -> tuple[Path, int, int]:
    """A plain DCP save (real `dcp.save`) whose TE `_extra_state` is a tensor item of `data`: (file, offset, length)."""
    import warnings

    import torch.distributed.checkpoint as dcp

    from hostile_samples import uint8_tensor_of

    key = "layers.0.self_attention.linear_qkv._extra_state"
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"layers.0.weight": torch.ones(4), key: uint8_tensor_of(data)}, checkpoint_id=ckpt)
    md = pickle.loads((ckpt / ".metadata").read_bytes())
    info = next(v for k, v in md.storage_data.items() if k.fqn == key)
    return ckpt / info.relative_path, info.offset, info.length


@pytest.mark.slow
@pytest.mark.parametrize("protocol", [0, 1])
def test_a_protocol_0_or_1_pickle_in_an_extra_state_tensor_runs_under_the_real_decoder_and_is_unsafe(
        tmp_path: Path, protocol: int) -> None:
    jobs, cases = [], []
    m = tmp_path / "ran-torch_dist"
    ckpt = tmp_path / "torch_dist" / "iter_0000001"
    shutil.copytree(SAMPLES / "torch_dist_fully" / "iter_0000001", ckpt)
    f, off, n = relay_item(ckpt, EXTRA_KEY, torch_save_bytes(uint8_tensor_of(_proto_payload(m, protocol))))
    jobs.append(("extra_state", [str(f), str(off), str(n)]))
    cases.append((ckpt, m))
    m = tmp_path / "ran-dcp"
    ckpt = tmp_path / "dcp"
    f, off, n = _dcp_extra_state_tensor(ckpt, _proto_payload(m, protocol))
    jobs.append(("extra_state", [str(f), str(off), str(n)]))
    cases.append((ckpt, m))
    for ckpt, m in cases:
        s, a = scan_path(ckpt, "s"), audit(ckpt)
        assert not m.exists()
        assert s.status is Status.UNSAFE, s.findings
        assert a.status is Status.UNSAFE, a.findings
        assert "CK601" in {f.code for f in s.findings} & {f.code for f in a.findings}
    run_real_loaders(jobs)
    for _, m in cases:
        assert m.exists(), "Megatron-Core's extra-state decoding (pickle.loads) did not run the payload"


def test_protocol_0_looking_bytes_are_data_outside_extra_state_and_clean_ones_inside_pass(tmp_path: Path) -> None:
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    # a clean protocol-0 extra state, and an ordinary uint8 tensor whose bytes are a protocol-0 pickle calling
    # os.system: nothing decodes a weight with pickle.loads, so it is data (no walk, no finding)
    ckpt = tmp_path / "dcp"
    evil = pickle.dumps(("cos\nsystem\n",), protocol=0)
    _dcp_extra_state_tensor(ckpt, pickle.dumps({"scale": [1.0, 2.0], "recipe": None}, protocol=0))
    weights = tmp_path / "weights"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"embedding.weight": uint8_tensor_of(b"cos\nsystem\n(S'true'\ntR." + evil)}, checkpoint_id=weights)
    for p in (ckpt, weights):
        assert scan_path(p, "s").status is Status.COMPLETE
        assert audit(p).status is Status.COMPLETE
