"""Which globals a pickle may CALL without the real loader running code: the allowlist of inert constructors.

`torch.load(weights_only=False)`, DCP's `load_bytes` and Transformer Engine's `pickle.loads` call whatever a pickle
tells them to (REDUCE, NEWOBJ, OBJ, INST, BUILD with `__setstate__`). A global that is merely referenced (a class
stored as a value) runs nothing; a global that is called runs its code. So the safety verdict does not ask "is the
name on a list of known-dangerous callables" (a deny list misses `timeit.timeit`, `pydoc.pipepager`,
`_posixsubprocess.fork_exec`, ...), it asks "is every called global on this list of constructors that are inert for
every argument". Anything else that is called makes the pickle unsafe (CK604).

Module-prefix allowlists (`megatron.core.*`, `torch.distributed.checkpoint.*` in `allowlist.py`) say which names may be
*referenced*; they also contain functions, some of them `getattr` gadgets (Megatron-Core's
`transformer.spec_utils.import_module(("os", "system"))` returns `os.system` from two strings). Calling such a name is
judged here, by exact name only.

Three kinds of call:
- REDUCE / OBJ / INST call `f(*args)`: `f` must be in `CALLABLE`;
- NEWOBJ / NEWOBJ_EX call `cls.__new__(cls, *args)` and fail for anything that is not a type: every referenceable
  (allowed) class may be created this way, its `__init__` never runs;
- `THROUGH` entries call (or keep to call) what they are given (`functools.partial`, torch's
  `_rebuild_from_type_v2(func, new_type, args, state)`, `copyreg._reconstructor(cls, base, state)`): their arguments
  count as called.
"""

from __future__ import annotations

# Constructors and torch/numpy rebuild helpers that are inert for every argument (torch 2.13, numpy 1.x/2.x).
_INERT: frozenset[tuple[str, str]] = frozenset(
    {
        ("collections", "OrderedDict"), ("collections", "deque"),
        ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "slice"), ("builtins", "complex"),
        ("builtins", "bytearray"), ("builtins", "range"), ("builtins", "tuple"), ("builtins", "list"),
        ("builtins", "dict"), ("builtins", "int"), ("builtins", "float"), ("builtins", "str"), ("builtins", "bytes"),
        ("builtins", "bool"), ("builtins", "object"), ("__builtin__", "set"),
        ("argparse", "Namespace"), ("datetime", "datetime"), ("datetime", "date"), ("datetime", "timedelta"),
        ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"), ("uuid", "UUID"),
        ("_codecs", "encode"), ("_io", "BytesIO"), ("io", "BytesIO"),
        ("torch", "Size"), ("torch", "device"), ("torch.serialization", "_get_layout"),
        ("torch._utils", "_rebuild_tensor"), ("torch._utils", "_rebuild_tensor_v2"),
        ("torch._utils", "_rebuild_tensor_v3"), ("torch._utils", "_rebuild_parameter"),
        ("torch._utils", "_rebuild_qtensor"), ("torch._utils", "_rebuild_sparse_tensor"),
        ("torch._utils", "_rebuild_meta_tensor_no_storage"), ("torch._utils", "_rebuild_device_tensor_from_numpy"),
        ("torch.nn.parameter", "Parameter"), ("torch", "Tensor"),
        ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("numpy.dtypes", "Float64DType"), ("numpy.dtypes", "Float32DType"), ("numpy.dtypes", "Int64DType"),
        ("numpy.dtypes", "UInt32DType"), ("numpy.random.mtrand", "RandomState"),
    }
)

# Call what they are given (now or later): their arguments count as called.
THROUGH_CALL: frozenset[tuple[str, str]] = frozenset(
    {
        ("functools", "partial"), ("collections", "defaultdict"),
        ("torch._tensor", "_rebuild_from_type_v2"), ("torch._tensor", "_rebuild_from_type"),
        ("numpy.random._pickle", "__randomstate_ctor"), ("numpy.random._pickle", "__bit_generator_ctor"),
        ("numpy.random._pickle", "__generator_ctor"),
    }
)
# Create instances of the classes they are given (`cls.__new__`, no `__init__`): their arguments must be allowed
# classes, as for NEWOBJ. (`copyreg._reconstructor(cls, base, state)` also calls `base.__init__` when base is not
# `object`; Python writes it only for protocols 0/1, with `base` a builtin type.)
THROUGH_NEW: frozenset[tuple[str, str]] = frozenset(
    {
        ("copyreg", "_reconstructor"), ("copy_reg", "_reconstructor"),
        ("torch._utils", "_rebuild_parameter_with_state"), ("torch._utils", "_rebuild_wrapper_subclass"),
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    }
)
THROUGH = THROUGH_CALL | THROUGH_NEW

# DCP data classes and enums (torch 2.13 `distributed/checkpoint/{metadata,planner,filesystem}.py`,
# `distributed/tensor/placement_types.py`): dataclass constructors and Enum lookups.
_DCP: dict[str, tuple[str, ...]] = {
    "torch.distributed.checkpoint.metadata": (
        "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "StorageMeta", "Metadata", "MetadataIndex",
    ),
    "torch.distributed.checkpoint.planner": (
        "WriteItemType", "LoadItemType", "BytesIOWriteData", "TensorWriteData", "WriteItem", "ReadItem", "SavePlan",
        "LoadPlan",
    ),
    "torch.distributed.checkpoint.filesystem": ("_StorageInfo", "_StoragePrefix", "SerializationFormat"),
    "torch.distributed.tensor.placement_types": ("Shard", "_StridedShard", "Replicate", "Partial"),
    "torch.distributed._tensor.placement_types": ("Shard", "_StridedShard", "Replicate", "Partial"),
    # Megatron-Core Enum classes (megatron-core 0.16.1, found by scanning its source for Enum subclasses): a pickled
    # enum member is `Enum(value)`, a lookup. Other generations add members, not classes, in these modules.
    "megatron.core.enums": ("ModelType", "Fp8Recipe", "Fp4Recipe"),
    "megatron.core.transformer.enums": (
        "ModelType", "LayerType", "AttnType", "AttnMaskType", "AttnBackend", "CudaGraphScope",
    ),
    "megatron.core.rerun_state_machine": ("RerunDiagnostic", "RerunMode", "RerunState", "RerunValidationStatus"),
    "megatron.core.extensions.transformer_engine": ("TransformerEngineConfigType",),
    "megatron.core.datasets.utils": ("Split",),
    "megatron.core.distributed.param_and_grad_buffer": ("BufferType",),
    "megatron.core.dist_checkpointing.validation": ("StrictHandling",),
    "megatron.core.dist_checkpointing.strategies.base": ("StrategyAction",),
    "megatron.core.transformer.moe.router_replay": ("RouterReplayAction",),
    "megatron.core.distributed.fsdp.src.megatron_fsdp.fully_shard": ("ShardingStrategy",),
}

CALLABLE: frozenset[tuple[str, str]] = _INERT | THROUGH | frozenset(
    (m, n) for m, names in _DCP.items() for n in names
)


def callable_safely(module: str, name: str) -> bool:
    """True when the real loader calling `module.name(*args)` runs no code for any `args` (or, for `THROUGH`
    entries, only what the arguments name — judged separately)."""
    return (module, name) in CALLABLE
