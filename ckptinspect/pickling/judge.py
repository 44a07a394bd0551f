"""What the opcode walker records about globals: each global referenced (with its allowlist verdict, judged as the
unpickler would import it) and each global CALLED that is not an inert constructor (`callables.py`: REDUCE / OBJ /
INST need an exact `CALLABLE` name, NEWOBJ a class `creatable_safely`, BUILD on a class object or a tainted value
counts as a call, `THROUGH` entries call their arguments, `copyreg._reconstructor` runs its `base`). Used by
`engine.py` only.
"""

from __future__ import annotations

import _compat_pickle
import functools
from typing import TYPE_CHECKING

from ckptinspect.pickling.allowlist import GlobalClass, classify
from ckptinspect.pickling.callables import (
    RECONSTRUCT,
    THROUGH_CALL,
    THROUGH_NEW,
    callable_safely,
    creatable_safely,
    init_safely,
)
from ckptinspect.pickling.opcodes import _T
from ckptinspect.pickling.walkstate import (
    _EMPTY,
    _RECONSTRUCT,
    _THROUGH_CALL,
    _THROUGH_NEW,
    GlobalRef,
    Stop,
    _Val,
)

if TYPE_CHECKING:
    from ckptinspect.pickling.walk import PickleWalk

MAX_GLOBAL_NAMES = 10_000  # distinct globals per stream

# Qualified name recorded for a STACK_GLOBAL whose module/name were not literal strings.
DYNAMIC_GLOBAL = "<dynamic STACK_GLOBAL>"

_NAMES = _T.names
_CALL_OPS = {ord("R"): "REDUCE", ord("\x81"): "NEWOBJ", ord("\x92"): "NEWOBJ_EX", ord("b"): "BUILD",
             ord("o"): "OBJ"}


def _call(walk: PickleWalk, code: int, consumed: list[object], offset: int) -> bool:
    """Record what a REDUCE / NEWOBJ / NEWOBJ_EX / OBJ / INST / BUILD calls (`consumed` = its operands, the callee
    first; for BUILD the object, then the state). True when the callee is a global whose call runs no code (the
    result then carries only its arguments' taint)."""
    op = _CALL_OPS.get(code, _NAMES[code])
    callee, args = consumed[0], consumed[1:]
    if not isinstance(callee, _Val):
        return False  # a plain value built from inert parts: calling it runs nothing the allowlist did not vet
    v = callee
    if op == "BUILD":
        # BUILD calls `type(obj).__setstate__`: an instance's class was judged when it was created. BUILD on a
        # class object itself runs `cls.__setstate__(state)` as a function, or sets the class's attributes (changed
        # for the rest of the process); no pickler writes that.
        names: set[str] = {v.qual} if v.qual is not None else set()
        ok = False
    elif v.qual is None or v.qual == DYNAMIC_GLOBAL:
        names, ok = set(v.taint), False  # calling a computed value: whatever it was built from is called
    else:
        if op in ("NEWOBJ", "NEWOBJ_EX"):
            names, ok = (set() if v.new_ok else {v.qual}), False  # the result stays tainted: an instance
        else:
            names, ok = (set() if v.call_ok else {v.qual}), v.call_ok
        if v.through == _RECONSTRUCT:
            names |= _reconstructed(v.qual, op, args)
        elif v.through:
            for a in args:
                if isinstance(a, _Val):
                    names |= a.taint if v.through == _THROUGH_CALL else a.ntaint
    for q in names:
        if q not in walk.called:
            walk.called[q] = f"{op} at byte {offset}"
    return ok


def _reconstructed(qual: str, op: str, args: list[object]) -> set[str]:
    """What `copyreg._reconstructor(cls, base, state)` runs that is not inert: `base.__new__(cls, state)` and
    `base.__init__(obj, state)` (so `base` must be `object` or an inert constructor), and later BUILDs call
    `cls.__setstate__` (so `cls` must be a class NEWOBJ may create). `args` are the operands (OBJ / INST) or the one
    argument tuple (REDUCE). Values that are not globals cannot be classes (only inert constructors made them): the
    real call fails on them, running nothing."""
    names: set[str] = set()
    if op == "REDUCE":
        packed = args[0] if args else None
        if not isinstance(packed, _Val):
            return names  # a tuple of plain values: no class in it
        if packed.parts is None:
            return {qual, *packed.taint, *packed.ntaint}  # globals in positions the walk did not keep
        args = list(packed.parts)
    if args and isinstance(args[0], _Val):
        cls = args[0]
        names |= cls.ntaint if cls.qual is None else set() if cls.new_ok else {cls.qual}
    if len(args) > 1 and isinstance(args[1], _Val):
        base = args[1]
        names |= base.taint if base.qual is None else set() if base.init_ok else {base.qual}
    return names


def _record(walk: PickleWalk, module: str, name: str, opcode: str, offset: int, proto: int) -> _Val:
    """Record a global reference; return its stack value."""
    verdict, mapped = _verdict(module, name, proto < 3)
    _add(walk, GlobalRef(module, name, opcode, offset, verdict))
    if len(walk._seen) > MAX_GLOBAL_NAMES:
        raise Stop(f"more than {MAX_GLOBAL_NAMES} distinct globals", offset, limit=True)
    return _value(module, name, verdict, mapped)


@functools.lru_cache(maxsize=4096)
def _value(module: str, name: str, verdict: GlobalClass, mapped: tuple[str, str]) -> _Val:
    qual = f"{module}.{name}"
    allowed = verdict is GlobalClass.ALLOWED
    call_ok = allowed and callable_safely(*mapped)
    new_ok = allowed and creatable_safely(*mapped)
    init_ok = allowed and init_safely(*mapped)
    through = (_THROUGH_CALL if mapped in THROUGH_CALL else _THROUGH_NEW if mapped in THROUGH_NEW
               else _RECONSTRUCT if mapped in RECONSTRUCT else 0)
    me = frozenset({qual})
    return _Val(qual, _EMPTY if call_ok else me, _EMPTY if new_ok else me, 0, call_ok, new_ok, through, init_ok)


@functools.lru_cache(maxsize=4096)
def _verdict(module: str, name: str, py2_names: bool) -> tuple[GlobalClass, tuple[str, str]]:
    """The allowlist verdict of a global, and the (module, name) the unpickler would import."""
    verdict = classify(module, name)
    mapped = (module, name)
    if py2_names:
        # For protocols < 3 the unpickler imports the Python 3 name (`fix_imports`, `_compat_pickle`):
        # `__builtin__.eval` is `builtins.eval`. Judge what it would import; a name dangerous as written stays so.
        m = _compat_pickle.NAME_MAPPING.get((module, name))
        if m is None and module in _compat_pickle.IMPORT_MAPPING:
            m = (_compat_pickle.IMPORT_MAPPING[module], name)
        if m is not None:
            mapped = m
            if verdict is not GlobalClass.DANGEROUS:
                verdict = classify(*m)
    return verdict, mapped


def _add(walk: PickleWalk, ref: GlobalRef) -> None:
    key = (ref.module, ref.name, ref.verdict)
    if key not in walk._seen:
        walk._seen.add(key)
        walk.refs.append(ref)
