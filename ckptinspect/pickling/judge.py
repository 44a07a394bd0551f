"""What the opcode walker records about globals: each global referenced (with its allowlist verdict, judged as the
unpickler would import it) and each global CALLED that is not an inert constructor (`callables.py`: REDUCE / OBJ /
INST need an exact `CALLABLE` name, NEWOBJ a class `creatable_safely`, BUILD on a class object or a tainted value
counts as a call, `THROUGH` entries call their arguments, `copyreg._reconstructor` runs its `base`). Used by
`engine.py` only.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from ckptinspect.pickling.policy import DICT_MAKERS, SLOT_HOOK_NAMES, STR_MAKERS, Resolved, resolve
from ckptinspect.pickling.opcodes import T
from ckptinspect.pickling.callables import REBUILD_FROM_TYPE_KIND, RECONSTRUCT_KIND, THROUGH_CALL_KIND, THROUGH_CLASS_KIND
from ckptinspect.pickling.walkstate import (
    EMPTY,
    GlobalRef,
    Stop,
    Val,
)

if TYPE_CHECKING:
    from ckptinspect.pickling.walk import PickleWalk

MAX_GLOBAL_NAMES = 10_000  # distinct globals per stream

# Qualified name recorded for a STACK_GLOBAL whose module/name were not literal strings.
DYNAMIC_GLOBAL = "<dynamic STACK_GLOBAL>"

_NAMES = T.names
CALL_OPS = {ord("R"): "REDUCE", ord("\x81"): "NEWOBJ", ord("\x92"): "NEWOBJ_EX", ord("b"): "BUILD",
             ord("o"): "OBJ"}


def judge_call(walk: PickleWalk, code: int, consumed: list[object], offset: int) -> bool:
    """Record what a REDUCE / NEWOBJ / NEWOBJ_EX / OBJ / INST / BUILD calls (`consumed` = its operands, the callee
    first; for BUILD the object, then the state). True when the callee is a global whose call runs no code (the
    result then carries only its arguments' taint)."""
    op = CALL_OPS.get(code, _NAMES[code])
    callee, args = consumed[0], consumed[1:]
    if op == "BUILD" and args:
        # A BUILD state may install a hook on the instance that a later opcode calls (`hooked`).
        for q in hooked(args[0]):
            if q not in walk.called:
                walk.called[q] = f"BUILD at byte {offset} (stored where the unpickler calls it)"
    if not isinstance(callee, Val):
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
        if v.through == RECONSTRUCT_KIND:
            names |= _reconstructed(v.qual, op, args)
        elif v.through == THROUGH_CLASS_KIND:
            names |= _globals_called(op, args)
        elif v.through == REBUILD_FROM_TYPE_KIND:
            names |= _rebuilt_from_type(walk, op, args, offset)
        elif v.through:
            for a in args:
                if isinstance(a, Val):
                    names |= a.taint if v.through == THROUGH_CALL_KIND else a.ntaint
    for q in names:
        if q not in walk.called:
            walk.called[q] = f"{op} at byte {offset}"
    return ok


def hooked(state: object) -> frozenset[str]:
    """The globals a BUILD with `state` may get called although no opcode calls them. BUILD looks `__setstate__` up
    on the instance (its `__dict__` first) and APPEND / APPENDS / ADDITEMS look up `append` / `extend` / `add`, so a
    state that stores a callable under one of those names (`policy.HOOK_NAMES`) installs it and the next such opcode
    calls it (Lib/pickle.py `load_build`, Modules/_pickle.c the same); a slot state (`(state, slotstate)`) is applied
    with `setattr`, which can also change `__class__`. A dict built by DICT / SETITEM(S) had its keys checked as it
    was built (`dict_value`, which records what it stores under a hook name): nothing more here. A state of any other
    make counts whole (fail closed): a dict filled by a constructor from its arguments (`dict(pairs)`), or the result
    of a call that is not inert. Every other value is marked (`Val.hook`) where the walker makes it: literals,
    instances made by inert constructors, BUILD and APPEND results are no dict whose items the walker did not see."""
    if not isinstance(state, Val):
        return EMPTY
    parts = state.parts
    if parts is not None and len(parts) == 2:
        return hooked(parts[0]) | hooked(parts[1])
    if state.hook is not None:
        return EMPTY
    return state.taint


def _may_name_hook(key: object) -> bool:
    """True when a dict key may equal a name in `policy.SLOT_HOOK_NAMES`: a literal hook name, a value a str maker
    computed, or a value the walk did not keep apart (made by a call that is not inert). Ints, tuples, long strings and
    globals (classes, functions) never equal a str."""
    if isinstance(key, str):
        return key in SLOT_HOOK_NAMES
    return isinstance(key, Val) and (key.strish or key.qual is None and key.hook is None)


def makes_str(callee: object) -> bool:
    """True when an inert call of `callee` may return a str computed from its arguments (`policy.STR_MAKERS`)."""
    return isinstance(callee, Val) and callee.qual in STR_MAKERS


def makes_dict(callee: object) -> bool:
    """True when an inert call of `callee` may return a dict filled from its arguments (`policy.DICT_MAKERS`)."""
    return isinstance(callee, Val) and callee.qual in DICT_MAKERS


def dict_value(walk: PickleWalk, container: object, pairs: list[object], built: object, offset: int) -> object:
    """DICT (`container` None) or SETITEM(S) on `container` stored `pairs` (key, value, key, value ...); `built` is the
    resulting value. A global that may not be called, stored under a name the unpickler looks up and calls once the
    dict is a BUILD state or slot state (`policy.SLOT_HOOK_NAMES`, or a key that is not a literal str), is recorded
    as called now: the dict may be reached again through the memo after this, so the check cannot wait for the
    BUILD. `built` is marked a checked dict when the container was one (or a new dict)."""
    for i in range(0, len(pairs) - 1, 2):
        k, value = pairs[i], pairs[i + 1]
        if isinstance(value, Val) and value.taint and _may_name_hook(k):
            for q in value.taint:
                if q not in walk.called:
                    op = "SETITEM" if container is not None else "DICT"
                    under = repr(k) if isinstance(k, str) else "a key computed by the pickle"
                    walk.called[q] = f"{op} at byte {offset} (stored under {under}, a name the unpickler calls)"
    if isinstance(built, Val):
        checked = container is None or not isinstance(container, Val) or container.hook is not None
        built.hook = EMPTY if checked else None
    return built


def _globals_called(op: str, args: list[object]) -> set[str]:
    """What a `callables.THROUGH_CLASS` call runs: the globals among its arguments that may not be called (each one
    is called if it is a class or a function); an instance made by inert constructors is used as data. `args` are the
    operands (OBJ / INST) or the one argument tuple (REDUCE); a tuple whose items the walk did not keep counts whole."""
    if op == "REDUCE":
        packed = args[0] if args else None
        if not isinstance(packed, Val):
            return set()  # plain values only
        if packed.parts is None:
            return {*packed.taint}
        args = list(packed.parts)
    return {a.qual for a in args if isinstance(a, Val) and a.qual is not None and not a.call_ok}


def _rebuilt_from_type(walk: PickleWalk, op: str, args: list[object], offset: int) -> set[str]:
    """What torch's `_rebuild_from_type_v2(func, new_type, args, state)` (`callables.REBUILD_FROM_TYPE`) runs
    beyond itself: `func(*args)` (judged as that call: recorded here), `new_type.__setstate__(state)` (so `new_type`
    must be a class NEWOBJ may create) and what the state stores where a hook is looked up (`hooked`). The state's
    other values are set as attributes, never called. Operands the walk did not keep one by one count whole, as a
    `THROUGH_CALL` call's do (fail closed)."""
    if op == "REDUCE":
        packed = args[0] if args else None
        if not isinstance(packed, Val):
            return set()  # plain values only: the real call fails on them, running nothing
        if packed.parts is None or len(packed.parts) != 4:
            return {*packed.taint}
        args = list(packed.parts)
    if len(args) != 4:
        return {q for a in args if isinstance(a, Val) for q in a.taint}
    func, new_type, inner, state = args
    if isinstance(func, Val):
        judge_call(walk, ord("R"), [func, inner], offset)
    names: set[str] = set()
    if isinstance(new_type, Val):
        names |= set(new_type.ntaint) if new_type.qual is None else set() if new_type.new_ok else {new_type.qual}
    return names | hooked(state)


def _reconstructed(qual: str, op: str, args: list[object]) -> set[str]:
    """What `copyreg._reconstructor(cls, base, state)` runs that is not inert: `base.__new__(cls, state)` and
    `base.__init__(obj, state)` (so `base` must be `object` or an inert constructor), and later BUILDs call
    `cls.__setstate__` (so `cls` must be a class NEWOBJ may create). `args` are the operands (OBJ / INST) or the one
    argument tuple (REDUCE). Values that are not globals cannot be classes (only inert constructors made them): the
    real call fails on them, running nothing."""
    names: set[str] = set()
    if op == "REDUCE":
        packed = args[0] if args else None
        if not isinstance(packed, Val):
            return names  # a tuple of plain values: no class in it
        if packed.parts is None:
            return {qual, *packed.taint, *packed.ntaint}  # globals in positions the walk did not keep
        args = list(packed.parts)
    if args and isinstance(args[0], Val):
        cls = args[0]
        names |= cls.ntaint if cls.qual is None else set() if cls.new_ok else {cls.qual}
    if len(args) > 1 and isinstance(args[1], Val):
        base = args[1]
        names |= base.taint if base.qual is None else set() if base.init_ok else {base.qual}
    return names


def record(walk: PickleWalk, module: str, name: str, opcode: str, offset: int) -> Val:
    """Record a global reference; return its stack value. Judged by `policy.resolve`, under every protocol (a Python 2
    spelling as mapped and as written), so the protocol the pickle announced does not enter."""
    r = resolve(module, name)
    add_ref(walk, GlobalRef(module, name, opcode, offset, r.verdict))
    if len(walk._seen) > MAX_GLOBAL_NAMES:
        raise Stop(f"more than {MAX_GLOBAL_NAMES} distinct globals", offset, limit=True)
    return _value(r)


@functools.lru_cache(maxsize=4096)
def _value(r: Resolved) -> Val:
    me = frozenset({r.qual})
    return Val(r.qual, EMPTY if r.call_ok else me, EMPTY if r.new_ok else me, 0, r.call_ok, r.new_ok, r.through,
                r.init_ok)


def add_ref(walk: PickleWalk, ref: GlobalRef) -> None:
    key = (ref.module, ref.name, ref.verdict)
    if key not in walk._seen:
        walk._seen.add(key)
        walk.refs.append(ref)
