"""The one rule that judges a pickle global: `resolve(module, name)`.

Every reader of pickles asks this module, and only this module, what a GLOBAL / STACK_GLOBAL / INST / OBJ name is:
the opcode walker (`judge.py`, which gives the verdict), the safe unpickler's `find_class` (`unpickle.py`) and the
streaming `.metadata` reader (`formats/dcp/vm_eval.py`). The tables behind it are `allowlist.py` (which names may be
referenced) and `callables.py` (which may be called); this module decides how a name as spelled in a pickle maps
onto them.

How a name resolves is judged for every way a real unpickler may resolve it (fail closed):
- Python 2 names (`__builtin__.eval`, `copy_reg._reconstructor`): CPython's unpickler maps them through
  `_compat_pickle` when the protocol is below 3 (`fix_imports`, the default of `torch.load`). The name is judged as
  it would be imported, and a name that is dangerous as written or as mapped is dangerous.
- Dotted names (`torch` + `serialization.os.system`): from protocol 4 on, `find_class` walks the dotted name as an
  attribute chain from the imported module, so any module an attribute chain passes through can be reached. A dotted
  name is allowed only when the chain spells an exact allowlist entry (`torch` + `_utils._rebuild_tensor_v2` is
  `torch._utils._rebuild_tensor_v2`); a chain through a dangerous module (or to a dangerous name) is dangerous;
  anything else is outside the allowlist, never allowed through a module prefix.
- Dunder names (`__builtins__`, `__globals__`, `__class__`) under a prefix-allowed module reach interpreter
  internals: outside the allowlist, dangerous when they spell a known escape.

What a resolved name may do when called (`call_ok`, `new_ok`, `init_ok`, `through`) comes from `callables.py`.
"""

from __future__ import annotations

import _compat_pickle
import functools
from dataclasses import dataclass

from ckptinspect.pickling.allowlist import GlobalClass, allowed_exactly, classify
from ckptinspect.pickling.callables import callable_safely, creatable_safely, init_safely, through_kind

# Names the unpickler looks up on an INSTANCE (its `__dict__` first) and then calls: BUILD looks up `__setstate__`,
# APPEND `append`, APPENDS `extend` (then `append`), ADDITEMS `add` (Lib/pickle.py `load_build` / `load_append(s)` /
# `load_additems`; Modules/_pickle.c the same). A BUILD state that stores a callable under one of these names
# installs it as a hook that the next such opcode calls. A slot state is applied with `setattr`, which may also
# change `__class__` (and so which type-level `__setstate__` the next BUILD calls).
HOOK_NAMES: frozenset[str] = frozenset({"__setstate__", "append", "extend", "add"})
SLOT_HOOK_NAMES: frozenset[str] = HOOK_NAMES | {"__class__"}
# Inert constructors that may return a str (or a str subclass, equal to it as a dict key) computed from their
# arguments: `str(x)`, `copyreg._reconstructor(str, str, s)`, numpy's `scalar` of a unicode dtype (`numpy.str_`).
# As a dict key such a value may spell a hook name the walker cannot read (`judge.dict_value`).
STR_MAKERS: frozenset[str] = frozenset(
    {"builtins.str", "copyreg._reconstructor", "copy_reg._reconstructor", "numpy.core.multiarray.scalar",
     "numpy._core.multiarray.scalar"}
)

# Inert constructors that return a dict filled from their arguments (`dict(pairs)`, `copyreg._reconstructor` with a
# dict base): the walker does not see which key such a dict stores what under, so as a BUILD state all that went
# into it counts (`judge.hooked`). Spelled as pickles spell them.
DICT_MAKERS: frozenset[str] = frozenset(
    {"builtins.dict", "collections.OrderedDict", "collections.Counter", "collections.defaultdict",
     "copyreg._reconstructor", "copy_reg._reconstructor"}
)


@dataclass(frozen=True, slots=True)
class Resolved:
    """What a pickle global resolves to, and what the real loader may do with it without running code."""

    module: str  # as spelled in the pickle
    name: str
    target: tuple[str, str]  # (module, name) the unpickler would import (after `_compat_pickle` and an attribute walk)
    verdict: GlobalClass
    call_ok: bool  # REDUCE / OBJ / INST on it runs no code (`callables.callable_safely`)
    new_ok: bool  # NEWOBJ / NEWOBJ_EX on it runs no code (`callables.creatable_safely`)
    init_ok: bool  # `copyreg._reconstructor` may take it as `base` (`callables.init_safely`)
    through: int  # `callables.*_KIND`: what a call does to its arguments

    @property
    def qual(self) -> str:
        """The name as the pickle spells it (how reports name it)."""
        return f"{self.module}.{self.name}"

    @property
    def allowed(self) -> bool:
        return self.verdict is GlobalClass.ALLOWED


def _py3_name(module: str, name: str) -> tuple[str, str] | None:
    """The name CPython's unpickler imports for a Python 2 spelling (`fix_imports`), or None."""
    m = _compat_pickle.NAME_MAPPING.get((module, name))
    if m is None and module in _compat_pickle.IMPORT_MAPPING:
        m = (_compat_pickle.IMPORT_MAPPING[module], name)
    return m


def _dotted(module: str, name: str) -> tuple[GlobalClass, tuple[str, str]]:
    """Judge a dotted name (`find_class` from protocol 4 on: `getattr` down the chain from `module`)."""
    parts = name.split(".")
    chain = [*module.split("."), *parts]
    target = (".".join(chain[:-1]), chain[-1])
    # Any module the chain passes through may be an attribute of the one before it (`torch.serialization.os`), and
    # any link may be a dangerous name of the module before it (`builtins.getattr.__call__`): every (module path,
    # attribute) split of every suffix of the chain is judged.
    for i in range(len(chain) - 1):
        for k in range(i + 1, len(chain)):
            if classify(".".join(chain[i:k]), chain[k]) is GlobalClass.DANGEROUS:
                return GlobalClass.DANGEROUS, target
    if any(p.startswith("__") for p in parts):
        return GlobalClass.UNKNOWN, target
    if len(parts) == 2 and parts[0] == "torch" and (module == "torch" or module.startswith("torch.")):
        # Torch's own pickles spell a memory format `torch._utils` + `torch.channels_last` (the format's
        # `__reduce__` names it `torch.<name>` in the module `torch._utils`, which imports torch): the chain ends at
        # the torch module, and is judged as `torch.<name>` (a submodule without that attribute fails to load).
        return classify("torch", parts[1]), ("torch", parts[1])
    if allowed_exactly(*target):
        return GlobalClass.ALLOWED, target
    return GlobalClass.UNKNOWN, target


@functools.lru_cache(maxsize=8192)
def resolve(module: str, name: str) -> Resolved:
    """The verdict on the global `module.name` as a pickle spells it, under every protocol (see the module doc)."""
    if "." in name:
        verdict, target = _dotted(module, name)
    else:
        verdict, target = classify(module, name), (module, name)
        mapped = _py3_name(module, name)
        if mapped is not None:
            target = mapped
            if verdict is not GlobalClass.DANGEROUS:
                verdict = classify(*mapped)  # `_compat_pickle` maps to plain names, never dotted ones
    allowed = verdict is GlobalClass.ALLOWED
    through = through_kind(*target)
    return Resolved(module, name, target, verdict, allowed and callable_safely(*target),
                    allowed and creatable_safely(*target), allowed and init_safely(*target), through)
