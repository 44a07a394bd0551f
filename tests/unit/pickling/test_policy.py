"""The one pickle policy (issue 24): `pickling.policy.resolve` judges every global for the walker, the safe unpickler
and the streaming `.metadata` reader; implicit calls are calls; bounds fail closed; what real checkpoints carry is
not a false alarm.

Hostile samples are put in every container the tool reads (a legacy file, a torch_dist `common.pt`, a DCP byte item,
an NVRx local file, a Megatron-Core 0.19 `common_state` item) and loaded for real (torch.load or DCP's load in one
subprocess, `hostile_samples.run_real_loaders`) to prove the loader runs their payload (a marker file appears); then
`audit` and `scan` must say `unsafe` without running it.
Benign probes are built with the real libraries (torch 2.13, megatron-core 0.16.1, numpy) and read back here.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import functools
import io
import pathlib
import pickle
import shutil
import signal
import types
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptinspect.commands.audit.audit import audit
from ckptinspect.commands.scan.scan import scan_path
from ckptinspect.findings import Status
from ckptinspect.formats.dcp.stream import read_metadata
from ckptinspect.pickling.allowlist import GlobalClass
from ckptinspect.pickling.policy import resolve
from ckptinspect.formats.dcp.vm_eval import resolve_global
from ckptinspect.pickling.unpickle import PickleReport, SafeUnpickler
from ckptinspect.pickling.walk import walk_pickle
from hostile_samples import payload, relay_item, run_real_loaders, write_zip, zip_entries

REPO = Path(__file__).resolve().parents[3]
SAMPLES = REPO / "sample_ckpts"
LEGACY_FILE = SAMPLES / "legacy" / "iter_0000001" / "mp_rank_00_000" / "distrib_optim.pt"
TORCH_DIST = SAMPLES / "torch_dist"
DCP_DIR = SAMPLES / "dcp" / "step-10"
DCP_KEY = "lr_scheduler.last_epoch"  # a byte item of the DCP sample: DCP's load torch.loads it
NVRX_FILE = SAMPLES / "nvrx_local" / "0" / "iter_0000002_0_local.pt"
ZARR = SAMPLES / "mcore_0_15_3_zarr"
# a sharded object of the zarr-era (<= 0.15) save: Megatron's zarr / torch_dist loaders `torch.load` each such file
ZARR_OBJECT = "iter_0000001/rng_state/shard_0.0_1.2.pt"
M19 = SAMPLES / "mcore_0_19_2"


def _u(s: str) -> bytes:
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b


def _g(module: str, name: str) -> bytes:
    return _u(module) + _u(name) + b"\x93"


def _stmt(marker: Path) -> str:
    """Python source that creates `marker` (what `timeit.timeit` / `cProfile.run` execute), then stops the loop."""
    return f"open({str(marker)!r}, 'w').close(); raise SystemExit"


# --- 0. the rule itself -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("module,name,verdict", [
    ("signal", "Signals", GlobalClass.ALLOWED),  # Megatron-LM's args.exit_signal
    ("signal", "signal", GlobalClass.DANGEROUS),
    ("types", "SimpleNamespace", GlobalClass.ALLOWED),
    ("types", "FunctionType", GlobalClass.DANGEROUS),
    ("torch", "serialization.os.system", GlobalClass.DANGEROUS),  # find_class walks the attribute chain
    ("torch", "_utils._rebuild_tensor_v2", GlobalClass.ALLOWED),  # a chain that spells an exact entry
    ("megatron.core.transformer", "spec_utils.import_module", GlobalClass.UNKNOWN),  # never allowed via a prefix
    ("torch._utils", "torch.channels_last", GlobalClass.ALLOWED),  # how torch pickles a memory format (protocol 4)
    ("torch._utils", "torch.load", GlobalClass.DANGEROUS),  # the same chain to a dangerous name
    ("builtins", "getattr.__call__", GlobalClass.DANGEROUS),
    ("megatron.core.x", "Cls.__init__", GlobalClass.UNKNOWN),
    ("__builtin__", "getattr", GlobalClass.DANGEROUS),  # Python 2 names judged as mapped
    ("__builtin__", "set", GlobalClass.ALLOWED),
    ("copy_reg", "_reconstructor", GlobalClass.ALLOWED),
    ("numpy.random._mt19937", "MT19937", GlobalClass.ALLOWED),
])
def test_resolve(module: str, name: str, verdict: GlobalClass) -> None:
    assert resolve(module, name).verdict is verdict


def test_every_torch_weights_only_default_global_is_allowed() -> None:
    from torch._weights_only_unpickler import _get_allowed_globals

    names = sorted(_get_allowed_globals())
    assert len(names) > 100
    refused = [q for q in names if resolve(*q.rsplit(".", 1)).verdict is not GlobalClass.ALLOWED]
    assert not refused, refused


def test_every_megatron_core_safe_global_is_allowed_and_inert() -> None:
    from megatron.core.safe_globals import SAFE_GLOBALS

    assert len(SAFE_GLOBALS) >= 16
    for obj in SAFE_GLOBALS:
        r = resolve(obj.__module__, obj.__qualname__)
        assert r.allowed and (r.call_ok or r.new_ok), (obj, r)


# --- 1. no false alarm on what real checkpoints carry ------------------------------------------------------------------


def _benign() -> dict[str, Callable[[], Any]]:
    import numpy as np
    import torch

    def optimizer_config() -> Any:
        from megatron.core.distributed.distributed_data_parallel_config import DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig

        return [OptimizerConfig(), DistributedDataParallelConfig()]

    def enums() -> Any:
        from megatron.core.enums import ModelType
        from megatron.core.rerun_state_machine import RerunMode
        from megatron.core.transformer.enums import AttnBackend

        return [ModelType.encoder_or_decoder, RerunMode.DISABLED, AttnBackend.auto]

    return {
        "megatron-lm args": lambda: argparse.Namespace(exit_signal=signal.SIGTERM, params_dtype=torch.bfloat16,
                                                      main_grads_dtype=torch.float32, save=pathlib.PosixPath("/x"),
                                                      lr=1e-4, data_path=["a", "b"]),
        "SimpleNamespace": lambda: types.SimpleNamespace(a=1, dtype=torch.float16),
        "OptimizerConfig": optimizer_config,
        "megatron enums": enums,
        "numpy RandomState": lambda: np.random.RandomState(0),
        "numpy Generator": lambda: np.random.default_rng(0),
        "numpy get_state": lambda: np.random.get_state(),
        "numpy scalars and arrays": lambda: [np.float32(1.5), np.int64(3), np.arange(4, dtype=np.uint32),
                                             np.dtype("float16"), np.str_("x")],
        "partial of an inert constructor": lambda: functools.partial(collections.OrderedDict, a=1),
        "datetime, Counter, deque, BytesIO": lambda: [datetime.datetime(2026, 1, 1), collections.Counter("aab"),
                                                     collections.deque([1]), io.BytesIO(b"x")],
        "torch objects": lambda: {"t": torch.ones(2, 3), "size": torch.Size([2]), "dev": torch.device("cpu"),
                                  "dtype": torch.bfloat16, "p": torch.nn.Parameter(torch.zeros(2)),
                                  "view": torch.arange(6.0).reshape(2, 3).t()},
        "torch rng state as Megatron saves it": lambda: {"random_rng_state": __import__("random").getstate(),
                                                   "np_rng_state": np.random.get_state(),
                                                   "torch_rng_state": torch.get_rng_state()},
    }


BENIGN = sorted(_benign())


@pytest.mark.parametrize("name", BENIGN)
@pytest.mark.parametrize("protocol", [2, 4])
def test_real_library_objects_are_no_call_and_read_back(name: str, protocol: int, tmp_path: Path) -> None:
    import torch

    obj = _benign()[name]()
    if "torch" not in name:  # tensors are pickled through torch.save's persistent ids only
        data = pickle.dumps(obj, protocol=protocol)
        walk = walk_pickle(data)
        assert not walk.called and walk.complete, walk.called
        assert all(v is GlobalClass.ALLOWED for v in walk.globals.values()), walk.globals
        SafeUnpickler(io.BytesIO(data), PickleReport()).load()
    # and as a file torch.save wrote, judged by both commands
    path = tmp_path / "obj.pt"
    torch.save({"obj": obj}, path, pickle_protocol=protocol)
    assert scan_path(path, "s").status is Status.COMPLETE
    assert audit(path).status is not Status.UNSAFE


def test_megatron_lm_args_in_a_real_torch_dist_checkpoint_stay_complete(tmp_path: Path) -> None:
    import torch

    save = tmp_path / "save"
    shutil.copytree(TORCH_DIST, save)
    for common in save.glob("iter_*/common.pt"):
        state = torch.load(common, weights_only=False)  # our own sample: trusted
        state["args"].exit_signal = signal.SIGTERM
        state["args"].cfg = types.SimpleNamespace(a=1)
        torch.save(state, common)
        assert b"Signals" in common.read_bytes()
    a = audit(save)
    assert a.status is Status.COMPLETE, a.findings
    assert scan_path(save, "s").status is Status.COMPLETE


# --- 2. implicit calls are calls; dotted names; bounds fail closed ----------------------------------------------------


def _hook(carrier: str, hook: str, fn: tuple[str, str], arg: str) -> bytes:
    """A carrier with an instance `__dict__`, a first BUILD that stores `fn` under `hook`, then the opcode that looks
    the hook up on the instance and calls it with `arg`."""
    make = {"OrderedDict": _g("collections", "OrderedDict") + b")R",
            "Namespace": _g("argparse", "Namespace") + b")R",
            "SimpleNamespace": _g("types", "SimpleNamespace") + b")R",
            "Namespace-newobj": _g("argparse", "Namespace") + b")\x81"}[carrier]
    a = _u(arg)
    if hook == "slot-__setstate__":  # BUILD (None, {"__setstate__": fn}): setattr
        return b"\x80\x04" + make + b"N}" + _u("__setstate__") + _g(*fn) + b"s\x86b" + a + b"b."
    if hook == "memo-aliased":  # the dict is memoized empty, filled, dropped, and reached again through the memo
        return (b"\x80\x04}\x94" + _u("__setstate__") + _g(*fn) + b"s0" + make + b"h\x00b" + a + b"b.")
    if hook == "computed-key":  # the key is str("__setstate__"): a value the walker cannot read
        return (b"\x80\x04" + make + b"}" + _g("builtins", "str") + _u("__setstate__") + b"\x85R" + _g(*fn)
                + b"sb" + a + b"b.")
    state = b"}" + _u(hook) + _g(*fn) + b"sb"
    call = {"__setstate__": a + b"b", "append": a + b"a", "extend": b"(" + a + b"e", "add": b"(" + a + b"\x90"}[hook]
    return b"\x80\x04" + make + state + call + b"."


TIMEIT, CPROFILE = ("timeit", "timeit"), ("cProfile", "run")
HOOKS: dict[str, Callable[[Path], bytes]] = {
    "OrderedDict __setstate__ timeit": lambda m: _hook("OrderedDict", "__setstate__", TIMEIT, _stmt(m)),
    "Namespace __setstate__ cProfile": lambda m: _hook("Namespace", "__setstate__", CPROFILE, _stmt(m)),
    "Namespace(NEWOBJ) __setstate__ timeit": lambda m: _hook("Namespace-newobj", "__setstate__", TIMEIT, _stmt(m)),
    "SimpleNamespace __setstate__ timeit": lambda m: _hook("SimpleNamespace", "__setstate__", TIMEIT, _stmt(m)),
    "Namespace append timeit": lambda m: _hook("Namespace", "append", TIMEIT, _stmt(m)),
    "OrderedDict append cProfile": lambda m: _hook("OrderedDict", "append", CPROFILE, _stmt(m)),
    "Namespace add timeit": lambda m: _hook("Namespace", "add", TIMEIT, _stmt(m)),
    # APPENDS calls `obj.extend(items)` with the list of items: an argv
    "Namespace extend (list argument)": lambda m: (b"\x80\x04" + _g("argparse", "Namespace") + b")R}" + _u("extend")
                                                   + _g("subprocess", "call") + b"sb(" + _u("touch") + _u(str(m))
                                                   + b"e."),
    "slot state __setstate__": lambda m: _hook("Namespace", "slot-__setstate__", TIMEIT, _stmt(m)),
    "memo-aliased state dict": lambda m: _hook("Namespace", "memo-aliased", TIMEIT, _stmt(m)),
    "computed key": lambda m: _hook("OrderedDict", "computed-key", TIMEIT, _stmt(m)),
    # find_class walks dotted names (protocol 4): torch.serialization imports os
    "dotted name through torch.serialization": lambda m: (b"\x80\x04" + _g("torch", "serialization.os.system")
                                                          + _u(f"touch {m}") + b"\x85R."),
    # a payload placed after 300 levels of nesting: past the walker's bound, judged unsafe (fail closed)
    "payload after 300 levels": lambda m: (b"\x80\x04]" + b"\x85" * 300 + b"0" + _g("timeit", "timeit")
                                           + _u(_stmt(m)) + b"\x85R."),
}


def _archive(evil: bytes, entries: list[tuple[str, bytes]]) -> bytes:
    return write_zip([(n, evil if n.endswith("/data.pkl") else d) for n, d in entries])


# Every container the hook samples are put in, and the real loader that reads it. Each (sample, container) gets its
# own marker, so each is proven live on its own.
CONTAINERS = ("legacy file", "torch_dist common.pt", "DCP byte item", "NVRx local file", "0.19 common_state item",
              "DCP .metadata", "zarr sharded object")


def _m19_common_state(ckpt: Path, blob: bytes) -> None:
    """Megatron-Core >= 0.19 keeps the common state as the byte item `common_state` (a `torch.save` archive)."""
    relay_item(ckpt, next(k for k in _byte_keys(ckpt) if k.startswith("common_state")), blob)


def _byte_keys(ckpt: Path) -> list[str]:
    from ckptinspect.formats.dcp.metadata import read_dcp_metadata

    md = read_dcp_metadata((ckpt / ".metadata").read_bytes())
    return [o.key for o in md.objects]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], tuple[Path, Path]]:
    """(sample, container) → (what to audit, marker): each proven live with the real loader in one subprocess."""
    root = tmp_path_factory.mktemp("hooks")
    legacy = zip_entries(LEGACY_FILE.read_bytes())
    nvrx = zip_entries(NVRX_FILE.read_bytes())
    commons = sorted(TORCH_DIST.glob("iter_*/common.pt"))
    m19_iter = next(p for p in sorted(M19.glob("iter_*")) if p.is_dir())
    out: dict[tuple[str, str], tuple[Path, Path]] = {}
    jobs: list[tuple[str, list[str]]] = []
    for i, (name, build) in enumerate(HOOKS.items()):
        for j, container in enumerate(CONTAINERS):
            marker = root / f"ran-{i}-{j}"
            evil = build(marker)
            if container == "legacy file":
                target = root / f"legacy-{i}.pt"
                target.write_bytes(_archive(evil, legacy))
                jobs.append(("torch.load", [str(target)]))
            elif container == "torch_dist common.pt":
                target = root / f"save-{i}"
                shutil.copytree(TORCH_DIST, target)
                for common in commons:  # every iteration's, the tracked one included
                    (target / common.relative_to(TORCH_DIST)).write_bytes(
                        _archive(evil, zip_entries(common.read_bytes())))
                jobs.append(("torch.load", [str(target / commons[-1].relative_to(TORCH_DIST))]))
            elif container == "DCP byte item":
                target = root / f"dcp-{i}"
                shutil.copytree(DCP_DIR, target)
                relay_item(target, DCP_KEY, _archive(evil, legacy))
                jobs.append(("dcp", [str(target), DCP_KEY]))
            elif container == "NVRx local file":
                target = root / f"nvrx-{i}.pt"
                target.write_bytes(_archive(evil, nvrx))
                jobs.append(("torch.load", [str(target)]))
            elif container == "DCP .metadata":  # FileSystemReader.read_metadata: pickle.load of the whole file
                target = root / f"meta-{i}"
                shutil.copytree(DCP_DIR, target)
                (target / ".metadata").write_bytes(evil)
                jobs.append(("dcp", [str(target), DCP_KEY]))
            elif container == "zarr sharded object":
                target = root / f"zarr-{i}"
                shutil.copytree(ZARR, target)
                obj = target / ZARR_OBJECT
                obj.write_bytes(_archive(evil, zip_entries(obj.read_bytes())))
                jobs.append(("torch.load", [str(obj)]))
            else:
                target = root / f"m19-{i}"
                shutil.copytree(m19_iter, target)
                _m19_common_state(target, _archive(evil, legacy))
                # the item's bytes, torch.load-ed as DCP's `load_bytes` does (a 0.19 load needs Megatron's loader)
                (root / f"m19-{i}.item.pt").write_bytes(_archive(evil, legacy))
                jobs.append(("torch.load", [str(root / f"m19-{i}.item.pt")]))
            out[(name, container)] = (target, marker)
    run_real_loaders(jobs)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("container", CONTAINERS)
@pytest.mark.parametrize("name", HOOKS)
def test_real_loader_runs_it_and_ckptinspect_says_unsafe(name: str, container: str,
                                                         live: dict[tuple[str, str], tuple[Path, Path]]) -> None:
    target, marker = live[(name, container)]
    assert marker.exists(), f"the real loader did not run {name} in the {container}"
    marker.unlink()
    s, a = scan_path(target, "s"), audit(target)
    assert s.status is Status.UNSAFE, (target, s.findings)
    assert a.status is Status.UNSAFE, (target, a.findings)
    codes = {f.code for f in s.findings} & {f.code for f in a.findings}
    assert codes & {"CK601", "CK604", "CK605"}, (s.findings, a.findings)
    assert not marker.exists()  # ckptinspect ran nothing


def test_hook_carriers_without_a_hook_name_stay_inert() -> None:
    """The same shapes with the callable stored under an ordinary attribute name run nothing: a reference (CK602),
    not a call."""
    for carrier in ("OrderedDict", "Namespace", "SimpleNamespace"):
        data = _hook(carrier, "__setstate__", TIMEIT, "x").replace(_u("__setstate__"), _u("not_a_hook"))
        data = data.replace(_u("x") + b"b.", b".")
        walk = walk_pickle(data)
        assert not walk.called and walk.globals["timeit.timeit"] is GlobalClass.UNKNOWN, walk.called


def test_a_payload_past_the_nesting_bound_is_judged() -> None:
    walk = walk_pickle(HOOKS["payload after 300 levels"](Path("/nonexistent")))
    assert not walk.unjudged and walk.limit is not None and "nesting" in walk.limit  # too deep to unpickle
    assert "timeit.timeit" in walk.called  # and judged to its end


def test_bounds_fail_closed_with_the_bound_named() -> None:
    """A bound of the walker's own (opcode count) stops the walk before a payload: `unsafe` (CK605), not `corrupt`."""
    data = b"\x80\x04" + b"N0" * 600 + _g("timeit", "timeit") + _u("x") + b"\x85R."
    walk = walk_pickle(data, max_ops=1000)
    assert walk.unjudged and walk.limit is not None and "opcodes" in walk.limit and not walk.called


# --- 3. one policy: the three verdict paths agree ----------------------------------------------------------------------


def _sample_pickles() -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    for p in sorted(SAMPLES.rglob("*")):
        if p.is_file() and p.name == ".metadata":
            out.append((str(p.relative_to(SAMPLES)), p.read_bytes()))
        elif p.is_file() and p.suffix == ".pt" and zipfile.is_zipfile(p):
            with zipfile.ZipFile(p) as z:
                for n in z.namelist():
                    if n.endswith(".pkl"):
                        out.append((f"{p.relative_to(SAMPLES)}!{n}", z.read(n)))
    return out


def _hostile_pickles() -> list[tuple[str, bytes]]:
    m = Path("/nonexistent/marker")
    out = [(f"payload {k}", payload(m, k)) for k in ("os.system", "timeit", "pipepager", "import_module")]
    out += [(f"hook {k}", build(m)) for k, build in HOOKS.items()]
    return out


def _paths_agree(data: bytes) -> None:
    walk = walk_pickle(data)
    report = PickleReport()
    try:
        SafeUnpickler(io.BytesIO(data), report).load()
        loaded = True
    except Exception:  # noqa: BLE001 - a hostile or broken pickle may fail to load; what it saw still counts
        loaded = False
    # every global the unpickler resolved has the walker's verdict (a walk stopped at a bound saw fewer: it fails
    # closed on the rest)
    for q, v in report.globals.items():
        if walk.complete or q in walk.globals:
            assert walk.globals.get(q) is v, (q, v, walk.globals.get(q))
    if loaded and walk.complete:
        assert set(report.globals) == set(walk.globals)
    # and the streaming reader's resolution (`vm_eval.resolve_global`) of every name the walker saw
    for ref in walk.refs:
        if not ref.module:
            continue
        r = PickleReport()
        try:
            resolve_global(ref.module, ref.name, r, {})
        except Exception:  # noqa: BLE001 - Fallback for anything not allowed: the verdict is recorded first
            pass
        assert r.globals[ref.qualname] is walk.globals[ref.qualname], ref


SAMPLE_PICKLES = _sample_pickles()


def test_the_three_paths_agree_on_every_sample_and_hostile_pickle() -> None:
    assert len(SAMPLE_PICKLES) > 40
    for name, data in SAMPLE_PICKLES + _hostile_pickles():
        try:
            _paths_agree(data)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from e


def test_the_streaming_metadata_reader_agrees_with_the_walker_on_every_sample() -> None:
    metas = [(n, d) for n, d in SAMPLE_PICKLES if n.endswith(".metadata")]
    assert len(metas) > 10
    for name, data in metas:
        report = PickleReport()
        read_metadata(data, report)
        walk = walk_pickle(data)
        assert {q: v for q, v in report.globals.items()} == walk.globals, name


_NAMES = st.sampled_from([
    ("collections", "OrderedDict"), ("argparse", "Namespace"), ("os", "system"), ("timeit", "timeit"),
    ("__builtin__", "eval"), ("__builtin__", "set"), ("copy_reg", "_reconstructor"), ("torch", "float32"),
    ("torch", "serialization.os.system"), ("torch", "_utils._rebuild_tensor_v2"), ("signal", "Signals"),
    ("types", "SimpleNamespace"), ("megatron.core.enums", "ModelType"), ("megatron.core.x", "a.b"),
    ("builtins", "getattr"), ("numpy.random._pickle", "__randomstate_ctor"),
])
_OPS = st.sampled_from([b")", b"N", b"K\x01", b"}", b"]", b"R", b"b", b"s", b"a", b"\x81", b"\x85", b"\x86", b"0",
                        b"2", b"(", b"t", b"u", b"e", b"\x94", b"h\x00"] + [_u(h) for h in ("__setstate__", "x")])


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_NAMES.map(lambda mn: _g(*mn)), _OPS), min_size=1, max_size=30),
       st.sampled_from([b"\x80\x02", b"\x80\x04", b""]))
def test_the_three_paths_agree_on_random_pickles(parts: list[bytes], head: bytes) -> None:
    _paths_agree(head + b"".join(parts) + b".")


# --- 4. DTensor / DeviceMesh pickles (issue 25 §4): judged as torch's own `weights_only` allowlist judges them ---------

DCP_WRITERS = SAMPLES / "dcp_writers"


def test_every_torch_registered_safe_global_is_allowed_and_creatable() -> None:
    """What torch 2.13 adds to its `weights_only` allowlist with `add_safe_globals` once `torch.distributed.tensor`
    is imported (DCP imports it): DTensor, DTensorSpec, TensorMeta, ShardOrderEntry, DeviceMesh and its layouts, the
    placements, NestedTensor and `_rebuild_njt`."""
    import torch.distributed.tensor  # noqa: F401 - registers them
    from torch.serialization import get_safe_globals

    # (other torch modules register theirs when imported, e.g. `torch._dynamo`'s `_DimRange`: not checkpoint state)
    found = [g for g in get_safe_globals() if not isinstance(g, tuple)
             and g.__module__.startswith(("torch.distributed", "torch.nested"))]
    assert len(found) >= 12
    for g in found:
        r = resolve(g.__module__, g.__qualname__)
        assert r.allowed and (r.new_ok or r.call_ok), (g, r)


def test_a_real_unflattened_dtensor_byte_item_is_inert() -> None:
    """`dcp.save(..., planner=DefaultSavePlanner(flatten_state_dict=False))` of a nested dict of DTensors on a 2-D
    mesh (Shard, Replicate, `_StridedShard`): the dict is one byte item, `torch.save` of the DTensors with their
    DTensorSpec and DeviceMesh (NEWOBJ + BUILD) rebuilt by `_rebuild_from_type_v2(_rebuild_wrapper_subclass, DTensor,
    ...)`. torch's own load reads it back (`tools/_dcp_writers.py`); nothing in it is called."""
    ckpt = DCP_WRITERS / "unflattened"
    s = scan_path(ckpt, "s")
    assert s.status is Status.COMPLETE, s.findings
    item = next(p for p in s.pickles if p.subject == "model")
    for cls in ("DTensor", "DTensorSpec", "DeviceMesh", "Shard", "Replicate", "_StridedShard"):
        assert any(q.endswith("." + cls) and v == "allowed" for q, v in item.globals.items()), (cls, item.globals)
    assert audit(ckpt).status is Status.COMPLETE


def _rebuild_from_type(func: tuple[str, str], new_type: tuple[str, str], inner: bytes, state: bytes = b"}") -> bytes:
    """`torch._tensor._rebuild_from_type_v2(func, new_type, inner, state)` as a protocol-4 pickle."""
    return (b"\x80\x04" + _g("torch._tensor", "_rebuild_from_type_v2") + b"(" + _g(*func) + _g(*new_type) + inner
            + state + b"tR.")


@pytest.mark.slow
def test_rebuild_from_type_still_judges_what_it_calls(tmp_path: Path) -> None:
    """`_rebuild_from_type_v2` runs `func(*args)`: a callee that is not inert is a call (CK604) — torch.load runs it
    (the marker appears) — and the class must be one NEWOBJ may create; only the state is data."""
    from hostile_samples import run_real_loader

    marker = tmp_path / "ran"
    evil = _rebuild_from_type(TIMEIT, ("torch", "Tensor"), _u(_stmt(marker)) + b"\x85")
    path = tmp_path / "evil.pt"
    path.write_bytes(evil)
    run_real_loader("torch.load", str(path))
    assert marker.exists(), "torch.load did not run the callee"
    marker.unlink()
    assert "timeit.timeit" in walk_pickle(evil).called
    assert scan_path(path, "s").status is Status.UNSAFE and not marker.exists()
    created = _rebuild_from_type(("torch._utils", "_rebuild_wrapper_subclass"), (IDX_CLS := (
        "megatron.core.datasets.indexed_dataset", "IndexedDataset")), b"(" + _g(*IDX_CLS) + b"t")
    assert f"{IDX_CLS[0]}.{IDX_CLS[1]}" in walk_pickle(created).called  # created: its `__setstate__` may run
    # a hook in the state is judged as a BUILD state's is
    hooked = _rebuild_from_type(("torch._utils", "_rebuild_tensor_v2"), ("torch", "Tensor"), b")",
                                b"}" + _u("__setstate__") + _g(*TIMEIT) + b"s")
    assert "timeit.timeit" in walk_pickle(hooked).called
