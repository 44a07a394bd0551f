"""The pickle opcode table the scanner walks with: argument layout and stack effect of every opcode byte.

Built once from `pickletools.opcodes` (the standard library's own description of protocols 0–5) into flat per-byte
lists, so the walker's hot loop is a few list lookups per opcode.
"""

from __future__ import annotations

import pickletools
from dataclasses import dataclass

# Argument kinds: how the bytes after the opcode are laid out.
_A_INVALID, _A_NONE, _A_FIXED, _A_LEN, _A_LINE, _A_LINE2 = -1, 0, 1, 2, 3, 4
_FIXED_SIZES = {"uint1": 1, "uint2": 2, "int4": 4, "uint4": 4, "uint8": 8, "float8": 8}
# length-prefixed arguments: (header bytes, signed header)
_LEN_KINDS = {
    "long1": (1, False), "string1": (1, False), "bytes1": (1, False), "unicodestring1": (1, False),
    "long4": (4, True), "string4": (4, True),
    "bytes4": (4, False), "unicodestring4": (4, False),
    "bytes8": (8, False), "bytearray8": (8, False), "unicodestring8": (8, False),
}
_LINE_KINDS = {"decimalnl_short", "decimalnl_long", "floatnl", "stringnl", "stringnl_noescape", "unicodestringnl"}

# Actions: what an opcode does to the walker's model. GENERIC = pops/pushes untracked values (from pickletools).
(_GENERIC, _STR, _MARK, _PUT, _MEMOIZE, _GET, _DUP, _GLOBAL, _INST, _STACK_GLOBAL, _EXT, _PROTO, _FRAME, _POP,
 _STOP) = range(15)
_SPECIAL = {
    "STRING": _STR, "BINSTRING": _STR, "SHORT_BINSTRING": _STR, "UNICODE": _STR, "SHORT_BINUNICODE": _STR,
    "BINUNICODE": _STR, "BINUNICODE8": _STR, "MARK": _MARK, "PUT": _PUT, "BINPUT": _PUT, "LONG_BINPUT": _PUT,
    "MEMOIZE": _MEMOIZE, "GET": _GET, "BINGET": _GET, "LONG_BINGET": _GET, "DUP": _DUP, "GLOBAL": _GLOBAL,
    "INST": _INST, "STACK_GLOBAL": _STACK_GLOBAL, "EXT1": _EXT, "EXT2": _EXT, "EXT4": _EXT, "PROTO": _PROTO,
    "FRAME": _FRAME, "POP": _POP, "STOP": _STOP,
}


@dataclass(frozen=True, slots=True)
class _Tables:
    """Per-byte lookup tables (index = opcode byte), flattened for the hot loop."""

    names: list[str]
    argk: list[int]
    asize: list[int]
    asigned: list[bool]
    act: list[int]
    mark: list[bool]
    pops: list[int]
    pushes: list[int]


def _build_tables() -> _Tables:
    t = _Tables(["?"] * 256, [_A_INVALID] * 256, [0] * 256, [False] * 256, [_GENERIC] * 256, [False] * 256,
                [0] * 256, [0] * 256)
    for op in pickletools.opcodes:
        i = ord(op.code.encode("latin-1"))
        t.names[i] = op.name
        arg = op.arg
        if arg is None:
            t.argk[i] = _A_NONE
        elif arg.name in _FIXED_SIZES:
            t.argk[i], t.asize[i] = _A_FIXED, _FIXED_SIZES[arg.name]
        elif arg.name in _LEN_KINDS:
            t.argk[i] = _A_LEN
            t.asize[i], t.asigned[i] = _LEN_KINDS[arg.name]
        elif arg.name in _LINE_KINDS:
            t.argk[i] = _A_LINE
        elif arg.name == "stringnl_noescape_pair":
            t.argk[i] = _A_LINE2
        else:  # pragma: no cover - a future pickletools argument type
            raise RuntimeError(f"unknown pickletools argument type {arg.name}")
        t.act[i] = _SPECIAL.get(op.name, _GENERIC)
        before = op.stack_before
        t.mark[i] = pickletools.markobject in before
        if t.mark[i]:
            t.pops[i] = before.index(pickletools.markobject)
        else:
            t.pops[i] = sum(1 for s in before if s is not pickletools.stackslice)
        t.pushes[i] = sum(1 for s in op.stack_after if s is not pickletools.markobject)
    return t


_T = _build_tables()
VALID_OPCODES = frozenset(i for i in range(256) if _T.argk[i] != _A_INVALID)
HIGHEST_PROTOCOL = 5
_PROTO_BYTE, _STOP_BYTE = 0x80, ord(".")
_TEXT_MEMO = frozenset({ord("p"), ord("g")})  # PUT / GET carry their index as a decimal line
