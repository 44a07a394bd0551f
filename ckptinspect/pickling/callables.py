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

Kinds of call:
- REDUCE / OBJ / INST call `f(*args)`: `f` must be in `CALLABLE`;
- NEWOBJ / NEWOBJ_EX call `cls.__new__(cls, *args)` (and a later BUILD `cls.__setstate__(state)`): `cls` must be
  `creatable_safely`: a class allowed by an EXACT allowlist entry (`allowlist.allowed_exactly`), or one of the
  `PLAIN_CLASSES` below. A class allowed only through a module prefix (`megatron.core.*`) is a reference, not a
  vetted constructor: megatron-core 0.16.1 alone has prefix-allowed classes whose `__new__` builds modules
  (`transformer.torch_norm.WrappedTorchNorm`, `extensions.transformer_engine.TENorm`) or whose `__setstate__` opens
  files (`datasets.indexed_dataset.IndexedDataset`);
- `THROUGH` entries call (or keep to call) what they are given (`functools.partial`, torch's
  `_rebuild_from_type_v2(func, new_type, args, state)`): their arguments count as called;
- `copyreg._reconstructor(cls, base, state)` (`RECONSTRUCT`) runs `base.__new__(cls, state)` and, when `base` is not
  `object`, `base.__init__(obj, state)`: inert only when `base` is `object` or in `INIT_SAFE` (the inert
  constructors) and `cls` is `creatable_safely`. Anything else is judged by what it runs: `base`'s constructor.
"""

from __future__ import annotations

from ckptinspect.pickling.allowlist import TORCH_CONSTANTS, TORCH_DTYPES, allowed_exactly

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
        ("numpy.dtypes", "Int32DType"), ("numpy.dtypes", "UInt8DType"), ("numpy.dtypes", "Int8DType"),
        ("numpy.dtypes", "Int16DType"), ("numpy.dtypes", "UInt16DType"), ("numpy.dtypes", "UInt64DType"),
        ("numpy.dtypes", "Float16DType"), ("numpy.dtypes", "BoolDType"),
        # numpy 2.x bit generators (`__bit_generator_ctor` instantiates the class it is given: seeds from its
        # argument or the OS), Megatron-Core `safe_globals.py`'s `Signals` (an IntEnum lookup by value: Megatron-LM's
        # `args.exit_signal`) and `SimpleNamespace` (an attribute bag), torch's Counter and rebuild helpers
        ("numpy.random._mt19937", "MT19937"), ("numpy.random._pcg64", "PCG64"), ("numpy.random._pcg64", "PCG64DXSM"),
        ("numpy.random._philox", "Philox"), ("numpy.random._sfc64", "SFC64"),
        ("signal", "Signals"), ("types", "SimpleNamespace"), ("collections", "Counter"),
        ("torch._utils", "_rebuild_device_tensor_from_cpu_tensor"), ("torch._utils", "_rebuild_nested_tensor"),
        # torch 2.13 `weights_only` safe global (`nested/_internal/nested_tensor.py`): `_rebuild_njt(kwargs)` is
        # `NestedTensor(**kwargs)`, a tensor wrapper built from the tensors it is given
        ("torch.nested._internal.nested_tensor", "_rebuild_njt"),
        ("torch._dynamo.decorators", "_DimRange"),  # a frozen dataclass of three ints (an NJT's dynamic range)
    }
    # torch dtypes, layouts, memory formats and qschemes are constants, not callables: "calling" one raises
    # TypeError, so one stored where the unpickler may call it (a BUILD state, `policy.HOOK_NAMES`) runs nothing.
    | {("torch", n) for n in TORCH_DTYPES} | {("torch", n) for n in TORCH_CONSTANTS}
)

# Call what they are given (now or later): their arguments count as called.
THROUGH_CALL: frozenset[tuple[str, str]] = frozenset({("functools", "partial"), ("collections", "defaultdict")})
# torch's tensor-subclass rebuilders (torch/_tensor.py, torch 2.13): `_rebuild_from_type_v2(func, new_type, args,
# state)` runs `ret = func(*args)`, then `ret.as_subclass(new_type)` and `new_type.__setstate__(state)` when the
# class defines one (else `torch._utils._set_obj_state`: `setattr` of each state item); `_rebuild_from_type(func,
# type, args, dict)` the same with `ret.__dict__ = dict`. So `func` is called with `args` (judged as that call),
# `new_type` must be a class NEWOBJ may create, and the state is data, except what it stores where the unpickler
# looks a hook up. A DTensor pickles as `_rebuild_from_type_v2(_rebuild_wrapper_subclass, DTensor, (DTensor, ...),
# {"_spec": DTensorSpec(...)})`.
REBUILD_FROM_TYPE: frozenset[tuple[str, str]] = frozenset(
    {("torch._tensor", "_rebuild_from_type_v2"), ("torch._tensor", "_rebuild_from_type")}
)
# Call the globals they are given, and use anything else as data (numpy 2.x `numpy/random/_pickle.py`:
# `__bit_generator_ctor(cls)` instantiates a class, looks a str up by name; `__randomstate_ctor(x, ctor)` /
# `__generator_ctor(x, ctor)` use a BitGenerator instance `x` as it is and call `ctor(x)` otherwise). An argument that
# is a global counts as called; an instance made by inert constructors is not called (fail closed: arguments the walk
# did not keep one by one count whole).
THROUGH_CLASS: frozenset[tuple[str, str]] = frozenset(
    {
        ("numpy.random._pickle", "__randomstate_ctor"), ("numpy.random._pickle", "__bit_generator_ctor"),
        ("numpy.random._pickle", "__generator_ctor"),
    }
)
# Create instances of the classes they are given (`cls.__new__`, no `__init__`): their arguments must be classes
# NEWOBJ may create (`creatable_safely`).
THROUGH_NEW: frozenset[tuple[str, str]] = frozenset(
    {
        ("torch._utils", "_rebuild_parameter_with_state"), ("torch._utils", "_rebuild_wrapper_subclass"),
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        # Cython's `__pyx_unpickle_SeedSequence(type, checksum, state)`: `SeedSequence.__new__(type)`, then its state
        ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence"),
    }
)
# `copyreg._reconstructor(cls, base, state)` (Lib/copyreg.py): `obj = base.__new__(cls, state)`, then
# `base.__init__(obj, state)` unless base's `__init__` is `object.__init__`. Python's pickler writes it for protocols
# 0/1 only, with `base` the nearest builtin base of `cls` (`object`, `dict`, `list`, ...).
RECONSTRUCT: frozenset[tuple[str, str]] = frozenset({("copyreg", "_reconstructor"), ("copy_reg", "_reconstructor")})
THROUGH = THROUGH_CALL | THROUGH_NEW | RECONSTRUCT | THROUGH_CLASS | REBUILD_FROM_TYPE
# What a call of a `THROUGH` global does with its arguments (`through_kind`).
THROUGH_NONE, THROUGH_NEW_KIND, THROUGH_CALL_KIND, RECONSTRUCT_KIND, THROUGH_CLASS_KIND, REBUILD_FROM_TYPE_KIND = \
    0, 1, 2, 3, 4, 5
# What `copyreg._reconstructor` may take as `base`: `object` and the inert constructors (whose `__new__` and
# `__init__` run no code for any argument).
INIT_SAFE: frozenset[tuple[str, str]] = _INERT

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

# Classes allowed only through a module prefix that NEWOBJ may create: plain data classes (dataclasses, NamedTuple-
# free, no `__new__` / `__setstate__` of their own anywhere in their MRO beyond `object`; checked against the real
# classes by `tests/test_hostile_calls.py`) that real checkpoints store as instances: the DCP classes above and
# Megatron-Core's dist-checkpointing records (megatron-core 0.13-0.19: `dist_checkpointing/mapping.py`,
# `strategies/torch.py`, `tensor_aware_state_dict.py`; the samples under `sample_ckpts/` hold every one but
# `ShardedTensorFactory`, `LocalNonpersistentObject` and `WriteResult`).
PLAIN_CLASSES: frozenset[tuple[str, str]] = frozenset(
    {(m, n) for m, names in _DCP.items() for n in names}
    | {
        ("megatron.core.dist_checkpointing.mapping", "ShardedTensor"),
        ("megatron.core.dist_checkpointing.mapping", "ShardedObject"),
        ("megatron.core.dist_checkpointing.mapping", "ShardedTensorFactory"),
        ("megatron.core.dist_checkpointing.mapping", "LocalNonpersistentObject"),
        ("megatron.core.dist_checkpointing.strategies.torch", "MCoreMetadata"),
        ("megatron.core.dist_checkpointing.strategies.torch", "MCoreSavePlan"),
        ("megatron.core.dist_checkpointing.tensor_aware_state_dict", "MCoreTensorAwareStateDict"),
        ("torch.distributed.checkpoint.storage", "WriteResult"),
        # Megatron-Core `safe_globals.py` (0.16.1): the optimizer config dataclass, pickled as NEWOBJ + BUILD; and
        # the other config dataclasses a training stack pickles beside it (NEWOBJ skips `__init__`, so their
        # `__post_init__` never runs either)
        ("megatron.core.optimizer.optimizer_config", "OptimizerConfig"),
        ("megatron.core.distributed.distributed_data_parallel_config", "DistributedDataParallelConfig"),
        ("megatron.core.model_parallel_config", "ModelParallelConfig"),
        ("megatron.core.transformer.transformer_config", "TransformerConfig"),
    }
)


def through_kind(module: str, name: str) -> int:
    """What calling `module.name` does with its arguments: one of the `*_KIND` constants (THROUGH_NONE: nothing)."""
    key = (module, name)
    return (THROUGH_CALL_KIND if key in THROUGH_CALL else THROUGH_NEW_KIND if key in THROUGH_NEW
            else RECONSTRUCT_KIND if key in RECONSTRUCT else THROUGH_CLASS_KIND if key in THROUGH_CLASS
            else REBUILD_FROM_TYPE_KIND if key in REBUILD_FROM_TYPE else THROUGH_NONE)


def callable_safely(module: str, name: str) -> bool:
    """True when the real loader calling `module.name(*args)` runs no code for any `args` (or, for `THROUGH`
    entries, only what the arguments name — judged separately)."""
    return (module, name) in CALLABLE


def creatable_safely(module: str, name: str) -> bool:
    """True when NEWOBJ / NEWOBJ_EX on the allowed global `module.name` (`cls.__new__(cls, *args)`, then BUILD)
    runs no code: an exact allowlist entry, or a plain data class (`PLAIN_CLASSES`)."""
    return allowed_exactly(module, name) or (module, name) in PLAIN_CLASSES


def init_safely(module: str, name: str) -> bool:
    """True when `copyreg._reconstructor` may take `module.name` as `base` without running code."""
    return (module, name) in INIT_SAFE
