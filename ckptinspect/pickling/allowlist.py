"""Classification of pickle globals: allowed, dangerous, or unknown.

Shared by the unpickler (`unpickle.py`, which never calls any of them) and the opcode scanner (`scan`). The allowlist
covers what torch DCP `.metadata`, `torch.save` archives, Megatron common state and numpy pickles reference; the
danger list is what a hostile pickle uses to run code. Everything else is "unknown": kept opaque, reported (CK602).
"""

from __future__ import annotations

import enum


class GlobalClass(enum.Enum):
    """Verdict on one `module.name` global referenced by a pickle."""

    ALLOWED = "allowed"
    UNKNOWN = "unknown"
    DANGEROUS = "dangerous"


# Exact (module, name) pairs that are allowed.
_ALLOWED_EXACT: frozenset[tuple[str, str]] = frozenset(
    {
        ("collections", "OrderedDict"),
        ("collections", "defaultdict"),
        ("collections", "deque"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "slice"),
        ("builtins", "complex"),
        ("builtins", "bytearray"),
        ("builtins", "range"),
        ("builtins", "tuple"),
        ("builtins", "list"),
        ("builtins", "dict"),
        ("builtins", "int"),
        ("builtins", "float"),
        ("builtins", "str"),
        ("builtins", "bytes"),
        ("builtins", "bool"),
        ("__builtin__", "set"),
        ("copy_reg", "_reconstructor"),
        ("copyreg", "_reconstructor"),
        ("builtins", "object"),
        ("argparse", "Namespace"),
        ("datetime", "datetime"),
        ("datetime", "date"),
        ("datetime", "timedelta"),
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PurePosixPath"),
        ("uuid", "UUID"),
        ("enum", "Enum"),
        ("functools", "partial"),
        ("_codecs", "encode"),
        ("torch", "Size"),
        ("torch._utils", "_rebuild_tensor"),
        ("torch._utils", "_rebuild_tensor_v2"),
        ("torch._utils", "_rebuild_tensor_v3"),
        ("torch._utils", "_rebuild_parameter"),
        ("torch._utils", "_rebuild_parameter_with_state"),
        ("torch._utils", "_rebuild_qtensor"),
        ("torch._utils", "_rebuild_sparse_tensor"),
        ("torch._utils", "_rebuild_meta_tensor_no_storage"),
        ("torch._utils", "_rebuild_wrapper_subclass"),
        ("torch._utils", "_rebuild_device_tensor_from_numpy"),
        ("torch._tensor", "_rebuild_from_type_v2"),
        ("torch._tensor", "_rebuild_from_type"),
        ("torch.nn.parameter", "Parameter"),
        ("torch", "Tensor"),
        ("torch.serialization", "_get_layout"),
        ("torch", "device"),
        ("torch.storage", "UntypedStorage"),
        ("torch.storage", "TypedStorage"),
        ("torch", "UntypedStorage"),
        ("torch", "strided"),
        ("torch", "sparse_coo"),
        ("torch", "contiguous_format"),
        ("torch", "channels_last"),
        ("torch", "preserve_format"),
        ("numpy", "dtype"),
        ("numpy", "ndarray"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.dtypes", "Float64DType"),
        ("numpy.dtypes", "Float32DType"),
        ("numpy.dtypes", "Int64DType"),
        ("numpy.dtypes", "UInt32DType"),
        ("numpy.random._pickle", "__randomstate_ctor"),
        ("numpy.random._pickle", "__bit_generator_ctor"),
        ("numpy.random._pickle", "__generator_ctor"),
        ("numpy.random.mtrand", "RandomState"),
        ("_io", "BytesIO"),
        ("io", "BytesIO"),
        # torch 2.13's `weights_only` default globals not covered above (`torch._weights_only_unpickler`
        # `_get_allowed_globals`; tests/test_policy.py checks every one of them resolves as allowed)
        ("collections", "Counter"),
        ("torch._utils", "_rebuild_device_tensor_from_cpu_tensor"),
        ("torch._utils", "_rebuild_nested_tensor"),
        # numpy 2.x pickles a RandomState / Generator with its bit generator CLASS (numpy 1.x: its name as a str),
        # which `__bit_generator_ctor` instantiates; a Generator's SeedSequence goes through Cython's unpickle helper
        ("numpy.random._mt19937", "MT19937"),
        ("numpy.random._pcg64", "PCG64"),
        ("numpy.random._pcg64", "PCG64DXSM"),
        ("numpy.random._philox", "Philox"),
        ("numpy.random._sfc64", "SFC64"),
        ("numpy.random.bit_generator", "SeedSequence"),
        ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence"),
        ("numpy.dtypes", "Int32DType"),
        ("numpy.dtypes", "UInt8DType"),
        ("numpy.dtypes", "Int8DType"),
        ("numpy.dtypes", "Int16DType"),
        ("numpy.dtypes", "UInt16DType"),
        ("numpy.dtypes", "UInt64DType"),
        ("numpy.dtypes", "Float16DType"),
        ("numpy.dtypes", "BoolDType"),
        # What torch 2.13 registers with `torch.serialization.add_safe_globals` for its `weights_only` unpickler
        # (`torch/distributed/tensor/__init__.py`, `device_mesh.py`, `nested/_internal/nested_tensor.py`): a pickled
        # DTensor (`torch.save` of one, a `flatten_state_dict=False` DCP byte item) is `_rebuild_from_type_v2(
        # _rebuild_wrapper_subclass, DTensor, ...)` with its `DTensorSpec` (mesh, placements, `TensorMeta`,
        # `ShardOrderEntry`s) and `DeviceMesh` (`_MeshLayout` / `_FlatLayout`) made by NEWOBJ + BUILD. The
        # placements (`Shard`, `Replicate`, `Partial`, `_StridedShard`) are allowed by module below.
        ("torch.distributed.tensor", "DTensor"),
        ("torch.distributed.tensor._dtensor_spec", "DTensorSpec"),
        ("torch.distributed.tensor._dtensor_spec", "TensorMeta"),
        ("torch.distributed.tensor._dtensor_spec", "ShardOrderEntry"),
        ("torch.distributed.device_mesh", "DeviceMesh"),
        ("torch.distributed._mesh_layout", "_MeshLayout"),
        ("torch.distributed._mesh_layout", "_FlatLayout"),
        ("torch.nested._internal.nested_tensor", "NestedTensor"),
        ("torch.nested._internal.nested_tensor", "_rebuild_njt"),
        # Megatron Energon's dataloader state (Megatron-Bridge's per-DP-rank `energon/iter_N/
        # train_dataloader_dprank*.pt`): exactly the classes Bridge's own restricted loader allows
        # (`utils/safe_pickle.py` `_EnergonUnpickler`, v0.6.0) that a real state file was seen to hold (Bridge also
        # allows `SavableCheckpoint` and webdataset's `SliceState`: not seen, not allowed). Slotted kw-only dataclasses made by NEWOBJ +
        # BUILD, and `FlexState`, a plain `dict` subclass (energon 7.4.1 `state.py`): data, no hook of their own.
        ("megatron.energon.state", "FlexState"),
        ("megatron.energon.rng", "SystemRngState"),
        ("megatron.energon.savable_loader", "SavableDataLoaderState"),
        ("megatron.energon.savable_loader", "SavableDatasetCheckpoint"),
        ("megatron.energon.savable_loader", "SavableDatasetState"),
    }
)

# Allowed classes that are `dict` subclasses: their stand-in must take SETITEMS (`standins.DictObj`).
DICT_SUBCLASSES: frozenset[tuple[str, str]] = frozenset({("megatron.energon.state", "FlexState")})

# Exact names allowed inside modules that are otherwise dangerous: what real checkpoints carry and the real loaders
# allow (Megatron-Core's `safe_globals.py` registers both with torch's `weights_only` unpickler). `signal.Signals` is
# the IntEnum whose members Megatron-LM stores in `args.exit_signal` (a lookup by value); `types.SimpleNamespace` is
# an attribute bag. `torch._dynamo.decorators._DimRange` is the frozen (dim, min, max) dataclass every jagged nested
# tensor (NJT) carries in `_dynamo_dynamic_range` (torch's weights_only asks for torch._dynamo to be imported to load
# one). Nothing else of `signal` / `types` / `torch._dynamo` is allowed.
_ALLOWED_IN_DANGEROUS: frozenset[tuple[str, str]] = frozenset(
    {("signal", "Signals"), ("types", "SimpleNamespace"), ("torch._dynamo.decorators", "_DimRange")}
)

# Modules whose every global is allowed (DCP metadata / planner classes, dtypes defined in torch itself).
_ALLOWED_MODULE_PREFIXES: tuple[str, ...] = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.planner",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint._extension",
    "torch.distributed.checkpoint.default_planner",
    "torch.distributed.checkpoint.storage",
    "torch.distributed.checkpoint._fsspec_filesystem",
    "torch.distributed.tensor.placement_types",
    "torch.distributed._tensor.placement_types",
    # Megatron-Core plain-data classes (enums, configs, MCoreSavePlan/MCoreMetadata): data, never run here.
    "megatron.core.",
    "megatron.training.",
    "transformer_engine.pytorch.",
)

# Modules of torch's legacy tensor / storage type objects (`torch.cuda.FloatStorage`, `torch.sparse.FloatTensor`),
# allowed by torch's `weights_only` unpickler.
_TORCH_LEGACY_TYPE_MODULES: frozenset[str] = frozenset({"torch.cuda", "torch.sparse", "torch.cuda.sparse"})

# torch names that are dtypes or storage classes (e.g. `torch.float32`, `torch.FloatStorage`).
_TORCH_ALLOWED_SUFFIXES: tuple[str, ...] = ("Storage", "Tensor")

# Dangerous modules: anything in them can run code, touch files, or reach the network.
_DANGEROUS_MODULES: frozenset[str] = frozenset(
    {
        "os", "posix", "nt", "subprocess", "sys", "socket", "pty", "shutil", "importlib", "runpy",
        "marshal", "types", "webbrowser", "ctypes", "code", "codeop", "commands", "multiprocessing",
        "threading", "_thread", "asyncio", "signal", "pickle", "_pickle", "cPickle", "dill", "cloudpickle",
        "shelve", "tempfile", "urllib", "urllib.request", "http", "http.client", "ftplib", "smtplib",
        "telnetlib", "requests", "pdb", "bdb", "inspect", "platform", "zipimport", "pkgutil", "imp",
        "builtins.__import__", "operator", "functools.reduce", "pip", "setuptools", "distutils", "gc",
        "torch.hub", "torch.ops", "torch.classes", "torch._ops", "torch.jit", "torch.package",
        "torch.utils.cpp_extension", "torch._dynamo", "torch._inductor", "numpy.testing", "numpy.f2py",
        "nt.system", "posixpath", "ntpath", "io.open", "_io.open", "fcntl", "resource", "mmap",
    }
)

_DANGEROUS_EXACT: frozenset[tuple[str, str]] = frozenset(
    {
        ("builtins", "eval"), ("builtins", "exec"), ("builtins", "compile"), ("builtins", "open"),
        ("builtins", "__import__"), ("builtins", "getattr"), ("builtins", "setattr"), ("builtins", "delattr"),
        ("builtins", "globals"), ("builtins", "locals"), ("builtins", "vars"), ("builtins", "input"),
        ("builtins", "breakpoint"), ("builtins", "help"), ("builtins", "exit"), ("builtins", "quit"),
        ("builtins", "memoryview"), ("builtins", "type"), ("builtins", "print"),
        ("__builtin__", "eval"), ("__builtin__", "exec"), ("__builtin__", "execfile"), ("__builtin__", "open"),
        ("__builtin__", "__import__"), ("__builtin__", "getattr"), ("__builtin__", "compile"),
        ("torch", "load"), ("torch.serialization", "load"), ("torch", "save"), ("torch.serialization", "save"),
        ("torch", "from_file"), ("torch.storage", "_load_from_bytes"), ("numpy", "load"), ("numpy", "save"),
        ("numpy", "fromfile"), ("numpy", "loadtxt"), ("numpy.lib.npyio", "load"), ("functools", "reduce"),
        ("copyreg", "_reconstructor_with_hooks"), ("codecs", "open"), ("io", "open"), ("_io", "open"),
        ("io", "FileIO"), ("_io", "FileIO"), ("pathlib", "Path"), ("logging", "config"),
    }
)


def classify(module: str, name: str) -> GlobalClass:
    """Classify the global `module.name` referenced by a pickle (GLOBAL / STACK_GLOBAL / INST / OBJ opcodes), as
    spelled: `policy.resolve` maps Python 2 spellings and dotted names onto calls of this."""
    if (module, name) in _DANGEROUS_EXACT:
        return GlobalClass.DANGEROUS
    if (module, name) in _ALLOWED_IN_DANGEROUS:
        return GlobalClass.ALLOWED
    root = module.split(".", 1)[0]
    if module in _DANGEROUS_MODULES or root in _DANGEROUS_MODULES:
        # `torch` itself is not in the list; `torch.hub` etc. are matched as whole modules below.
        return GlobalClass.DANGEROUS
    for dangerous in _DANGEROUS_MODULES:
        if "." in dangerous and module.startswith(dangerous + "."):
            return GlobalClass.DANGEROUS
    if (module, name) in _ALLOWED_EXACT:
        return GlobalClass.ALLOWED
    if module.startswith(_ALLOWED_MODULE_PREFIXES):
        # A dotted name can still reach a callable through an attribute chain (`megatron.core.x.os.system`).
        if "." in name or name.startswith("__"):
            return GlobalClass.DANGEROUS if _attr_chain_is_dangerous(name) else GlobalClass.UNKNOWN
        return GlobalClass.ALLOWED
    if module == "torch" and "." not in name:
        if name in _TORCH_DTYPE_NAMES or name in TORCH_CONSTANTS or name.endswith(_TORCH_ALLOWED_SUFFIXES):
            return GlobalClass.ALLOWED
        return GlobalClass.UNKNOWN
    if module in _TORCH_LEGACY_TYPE_MODULES and "." not in name and name.endswith(_TORCH_ALLOWED_SUFFIXES):
        return GlobalClass.ALLOWED  # `torch.cuda.FloatStorage`, `torch.sparse.FloatTensor`: legacy type objects
    return GlobalClass.UNKNOWN


def allowed_exactly(module: str, name: str) -> bool:
    """True when `module.name` is allowed by an exact entry (not merely by a module prefix)."""
    return ((module, name) in _ALLOWED_EXACT or (module, name) in _ALLOWED_IN_DANGEROUS) \
        and classify(module, name) is GlobalClass.ALLOWED


def _attr_chain_is_dangerous(name: str) -> bool:
    parts = set(name.split("."))
    return bool(parts & {"system", "popen", "eval", "exec", "__import__", "__builtins__", "__globals__", "os"})


# torch dtype attribute names (`torch.float32`, `torch.bfloat16`, ...) → the neutral dtype name: every `torch.dtype`
# torch 2.13 defines (`tests/test_policy.py` enumerates `dir(torch)`), aliases included (`torch.half`, `torch.bit`).
# A pickle names a dtype by its canonical name (`torch.float4_e2m1fn_x2`); older releases define fewer of them
# (torch never renamed one). The neutral name is `str(dtype)` without ``torch.``.
TORCH_DTYPES: dict[str, str] = {
    "float64": "float64", "double": "float64", "float32": "float32", "float": "float32",
    "float16": "float16", "half": "float16", "bfloat16": "bfloat16",
    "complex128": "complex128", "cdouble": "complex128", "complex64": "complex64", "cfloat": "complex64",
    "complex32": "complex32", "chalf": "complex32",
    "int64": "int64", "long": "int64", "int32": "int32", "int": "int32", "int16": "int16", "short": "int16",
    "int8": "int8", "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "bool": "bool",
    "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2", "float8_e4m3fnuz": "float8_e4m3fnuz",
    "float8_e5m2fnuz": "float8_e5m2fnuz", "float8_e8m0fnu": "float8_e8m0fnu", "float4_e2m1fn_x2": "float4_e2m1fn_x2",
    "qint8": "qint8", "quint8": "quint8", "qint32": "qint32", "quint4x2": "quint4x2", "quint2x4": "quint2x4",
    "bits8": "bits8", "bits16": "bits16", "bits1x8": "bits1x8", "bits2x4": "bits2x4", "bits4x2": "bits4x2",
    "bit": "uint1", **{f"uint{i}": f"uint{i}" for i in range(1, 8)}, **{f"int{i}": f"int{i}" for i in range(1, 8)},
}
_TORCH_DTYPE_NAMES = frozenset(TORCH_DTYPES)

# torch attributes that are plain, non-callable constants other than dtypes: quantization schemes, layouts and
# memory formats (torch 2.13's `weights_only` allows them all). Calling one raises TypeError: nothing runs.
TORCH_CONSTANTS: frozenset[str] = frozenset(
    {
        "per_channel_affine", "per_channel_affine_float_qparams", "per_channel_symmetric", "per_tensor_affine",
        "per_tensor_symmetric",
        "strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "_mkldnn", "jagged",
        "contiguous_format", "channels_last", "channels_last_3d", "preserve_format",
    }
)

# Legacy typed storage classes (`torch.FloatStorage`) → dtype, as torch.save writes them in persistent ids.
TORCH_STORAGE_DTYPES: dict[str, str] = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
    "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16", "CharStorage": "int8",
    "ByteStorage": "uint8", "BoolStorage": "bool", "ComplexDoubleStorage": "complex128",
    "ComplexFloatStorage": "complex64", "QInt8Storage": "qint8", "QUInt8Storage": "quint8",
    "QInt32Storage": "qint32", "QUInt4x2Storage": "quint4x2", "UntypedStorage": "uint8",
    "Float8_e4m3fnStorage": "float8_e4m3fn", "Float8_e5m2Storage": "float8_e5m2",
}
