"""The pickle opcode table the scanner walks with: argument layout and stack effect of every opcode byte.

Built once from `pickletools.opcodes` (the standard library's own description of protocols 0–5) into flat per-byte
lists, so the walker's hot loop is a few list lookups per opcode.
"""

from __future__ import annotations

import pickletools
from dataclasses import dataclass

# Argument kinds: how the bytes after the opcode are laid out.
A_INVALID, A_NONE, A_FIXED, A_LEN, _A_LINE, A_LINE2 = -1, 0, 1, 2, 3, 4
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
(ACT_GENERIC, STR, ACT_MARK, ACT_PUT, ACT_MEMOIZE, ACT_GET, ACT_DUP, ACT_GLOBAL, ACT_INST, ACT_STACK_GLOBAL, ACT_EXT, ACT_PROTO, ACT_FRAME, ACT_POP,
 ACT_STOP) = range(15)
_SPECIAL = {
    "STRING": STR, "BINSTRING": STR, "SHORT_BINSTRING": STR, "UNICODE": STR, "SHORT_BINUNICODE": STR,
    "BINUNICODE": STR, "BINUNICODE8": STR, "MARK": ACT_MARK, "PUT": ACT_PUT, "BINPUT": ACT_PUT, "LONG_BINPUT": ACT_PUT,
    "MEMOIZE": ACT_MEMOIZE, "GET": ACT_GET, "BINGET": ACT_GET, "LONG_BINGET": ACT_GET, "DUP": ACT_DUP, "GLOBAL": ACT_GLOBAL,
    "INST": ACT_INST, "STACK_GLOBAL": ACT_STACK_GLOBAL, "EXT1": ACT_EXT, "EXT2": ACT_EXT, "EXT4": ACT_EXT, "PROTO": ACT_PROTO,
    "FRAME": ACT_FRAME, "POP": ACT_POP, "STOP": ACT_STOP,
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
    t = _Tables(["?"] * 256, [A_INVALID] * 256, [0] * 256, [False] * 256, [ACT_GENERIC] * 256, [False] * 256,
                [0] * 256, [0] * 256)
    for op in pickletools.opcodes:
        i = ord(op.code.encode("latin-1"))
        t.names[i] = op.name
        arg = op.arg
        if arg is None:
            t.argk[i] = A_NONE
        elif arg.name in _FIXED_SIZES:
            t.argk[i], t.asize[i] = A_FIXED, _FIXED_SIZES[arg.name]
        elif arg.name in _LEN_KINDS:
            t.argk[i] = A_LEN
            t.asize[i], t.asigned[i] = _LEN_KINDS[arg.name]
        elif arg.name in _LINE_KINDS:
            t.argk[i] = _A_LINE
        elif arg.name == "stringnl_noescape_pair":
            t.argk[i] = A_LINE2
        else:  # pragma: no cover - a future pickletools argument type
            raise RuntimeError(f"unknown pickletools argument type {arg.name}")
        t.act[i] = _SPECIAL.get(op.name, ACT_GENERIC)
        before = op.stack_before
        t.mark[i] = pickletools.markobject in before
        if t.mark[i]:
            t.pops[i] = before.index(pickletools.markobject)
        else:
            t.pops[i] = sum(1 for s in before if s is not pickletools.stackslice)
        t.pushes[i] = sum(1 for s in op.stack_after if s is not pickletools.markobject)
    return t


T = _build_tables()
VALID_OPCODES = frozenset(i for i in range(256) if T.argk[i] != A_INVALID)
HIGHEST_PROTOCOL = 5
PROTO_BYTE, STOP_BYTE = 0x80, ord(".")
TEXT_MEMO = frozenset({ord("p"), ord("g")})  # PUT / GET carry their index as a decimal line
