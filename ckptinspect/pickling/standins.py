"""The stand-ins `SafeUnpickler` (`unpickle.py`) hands back instead of the classes and functions a pickle names:
`Obj` / `StatefulObj` for instances of allowed classes, `Rec` / `CRec` for the records a reader names
(`unpickle.Records`: the classes a file holds millions of, such as a DCP `.metadata`'s chunks), `Opaque`
placeholders for globals outside the allowlist. Every stand-in class is made per load with the `FrozenClass`
metaclass (a pickle cannot change it); allowed builder functions are wrapped in `FrozenCall`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from ckptinspect.pickling.allowlist import GlobalClass

HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python (mutable); builtin types are not


class FrozenClass(type):
    """Metaclass of every stand-in class: a pickle cannot set or delete its attributes (BUILD's slot state would
    `setattr` on the class). The reader itself sets them with `type.__setattr__`."""

    def __setattr__(cls, name: str, value: Any) -> None:
        raise AttributeError(f"stand-in class {cls.__name__} is immutable")

    def __delattr__(cls, name: str) -> None:
        raise AttributeError(f"stand-in class {cls.__name__} is immutable")


def frozen_class(name: str, bases: tuple[type, ...], namespace: dict[str, Any]) -> Any:
    return FrozenClass(name, bases, namespace)


class FrozenCall:
    """An allowed builder function as one load sees it: callable, immutable, no `__dict__`."""

    __slots__ = ("_fn",)
    _fn: Callable[..., Any]

    def __init__(self, fn: Callable[..., Any]) -> None:
        object.__setattr__(self, "_fn", fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("stand-in builders are immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("stand-in builders are immutable")


class Obj:
    """Stand-in for an instance of an allowed class: its pickled state lands in `__dict__`.

    No `__setstate__` on purpose: for dict states the C unpickler then updates `__dict__` itself, which keeps
    million-chunk `.metadata` files fast. Positional constructor arguments are kept in ``_args``.
    """

    qualname: ClassVar[str] = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> Obj:
        self = object.__new__(cls)
        if args:
            self.__dict__["_args"] = args
        if kwargs:
            self.__dict__["_kwargs"] = kwargs
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def get(self, name: str, default: Any = None) -> Any:
        return self.__dict__.get(name, default)

    def __repr__(self) -> str:
        return f"<{self.qualname} {self.__dict__!r}>"


class Rec(list):  # type: ignore[type-arg]
    """Stand-in for a record class (`unpickle.Records.classes`: what a file holds millions of).

    A `list` subclass whose `__setstate__` is `list.append`: NEWOBJ creates it and BUILD stores the pickled state
    as item 0, both in C. The state dict pickle built is kept as is — no per-object `__dict__` copy — which halves
    the memory of a large `.metadata` compared with torch's own dataclasses. `rec.get(field)` reads the state.
    """

    qualname: ClassVar[str] = "?"
    __setstate__ = list.append
    # Records can be dict keys (DCP's MetadataIndex in `storage_data`): hash and compare by identity, as objects do.
    __hash__ = object.__hash__  # type: ignore[assignment]
    __eq__ = object.__eq__
    __ne__ = object.__ne__

    def get(self, name: str, default: Any = None) -> Any:
        state = self[0] if self else None
        return state.get(name, default) if isinstance(state, dict) else default

    @property
    def state(self) -> Any:
        return self[0] if self else None

    def __repr__(self) -> str:
        return f"<{self.qualname} {self.state!r}>"


class CRec(Rec):
    """A `Rec` for a compact record class (`unpickle.Records.compact`; DCP: its three per-chunk classes): BUILD keeps
    only the tuple of the `fields` values and empties the pickled dict, which the memo would otherwise keep alive
    until the load ends (~170 bytes per object; three objects per chunk)."""

    fields: ClassVar[tuple[str, ...]] = ()

    def __setstate__(self, state: Any) -> None:
        if type(state) is dict:
            self.append(tuple(map(state.get, self.fields)))
            state.clear()
        else:
            self.append(state)

    def values(self) -> tuple[Any, ...]:
        """The field values in `fields` order (missing fields are None)."""
        state = self[0] if self else None
        if type(state) is tuple and len(state) == len(self.fields):
            return state
        if isinstance(state, dict):
            return tuple(map(state.get, self.fields))
        raise TypeError(f"{self.qualname} has an unexpected state {type(state).__name__}")

    def get(self, name: str, default: Any = None) -> Any:
        if name not in self.fields:
            return default
        value = self.values()[self.fields.index(name)]
        return default if value is None else value


class StatefulObj(Obj):
    """An `Obj` that also accepts non-dict states (tuples), kept in ``_state``."""

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, dict):
            self.__dict__.update(state)
        elif (
            isinstance(state, tuple)
            and len(state) == 2
            and (state[0] is None or isinstance(state[0], dict))
            and isinstance(state[1], dict)
        ):
            self.__dict__.update(state[0] or {})
            self.__dict__.update(state[1])
        else:
            self.__dict__["_state"] = state


class DictObj(dict):  # type: ignore[type-arg]
    """Stand-in for an allowed `dict` subclass (`allowlist.DICT_SUBCLASSES`: Energon's `FlexState`): NEWOBJ makes an
    empty one, SETITEMS fills it through dict's own item assignment, a BUILD state lands in its `__dict__`; readers
    see a dict."""

    qualname: ClassVar[str] = "?"


class Opaque(StatefulObj):
    """Placeholder for a global outside the allowlist (unknown or dangerous). It is never called for real."""

    verdict: ClassVar[GlobalClass] = GlobalClass.UNKNOWN

    def __call__(self, *args: Any, **kwargs: Any) -> Opaque:
        # A hostile pickle may REDUCE on the result of a placeholder; record, never run.
        return type(self)(*args, **kwargs)
