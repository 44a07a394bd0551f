"""The walker's model of values and input: stack values (`Val`, plain depth ints), the byte source (`Source`:
a buffer, or a stream read in windows), the `Stop` signal, `GlobalRef`, and the decoding of opcode arguments (string
and memo-index arguments, length claims). Used by `engine.py` and `judge.py` only.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import IO

from ckptinspect.pickling.allowlist import GlobalClass

MAX_LINE = 1 << 20  # protocol-0 argument lines
WINDOW = 8 << 20  # stream read size
MAX_TRACKED_STR = 1024  # longer strings cannot be module/attribute names worth tracking: kept as opaque values


@dataclass(frozen=True, slots=True)
class GlobalRef:
    """One global a pickle references: where (byte offset of the opcode) and through which opcode."""

    module: str
    name: str
    opcode: str
    offset: int
    verdict: GlobalClass

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}" if self.module else self.name


class Val:
    """A tracked non-string stack value: a global, or a value built from globals that may not be called."""

    __slots__ = ("qual", "call_ok", "new_ok", "init_ok", "through", "taint", "ntaint", "depth", "parts", "hook",
                 "strish")

    def __init__(self, qual: str | None, taint: frozenset[str], ntaint: frozenset[str], depth: int,
                 call_ok: bool = False, new_ok: bool = False, through: int = 0, init_ok: bool = False,
                 parts: tuple[object, ...] | None = None) -> None:
        self.qual = qual  # set for a global as pushed; None for a derived value
        self.call_ok = call_ok  # REDUCE / OBJ / INST on it runs no code
        self.new_ok = new_ok  # NEWOBJ on it runs no code (`callables.creatable_safely`)
        self.init_ok = init_ok  # `copyreg._reconstructor` may take it as `base` (`callables.init_safely`)
        self.through = through  # 0, or what it does to its arguments (`callables.*_KIND`)
        self.taint = taint  # globals inside that may not be called
        self.ntaint = ntaint  # globals inside that may not even be instantiated (outside the allowlist)
        self.depth = depth
        # a tuple of at most 3 items holding a global (TUPLE1/2/3, TUPLE): its items, for the calls whose verdict
        # depends on which argument is which (`copyreg._reconstructor(cls, base, state)`)
        self.parts = parts
        # what a BUILD with this value as its state may call beyond what was already recorded (`judge.hooked`): the
        # empty set for a value whose make the walker saw (literals, dicts whose keys `judge.dict_value` checked as
        # they were stored, instances of inert constructors, BUILD / APPEND results); None for one it did not (a dict
        # filled by a constructor from its arguments, a call that is not inert): then all its taint counts
        self.hook: frozenset[str] | None = None
        # made by an inert constructor that may return a str (`policy.STR_MAKERS`): as a dict key it may spell a hook
        self.strish = False




EMPTY: frozenset[str] = frozenset()


def depth_of(v: object) -> int:
    if isinstance(v, int):
        return v
    if isinstance(v, Val):
        return v.depth
    return 0


def combine(values: list[object], extra: int = 1) -> object:
    """The value built from `values`: depth 1 + the deepest, the union of their taints."""
    depth = 0
    taint: frozenset[str] = EMPTY
    ntaint: frozenset[str] = EMPTY
    for v in values:
        c = v.__class__
        if c is int:
            if v > depth:  # type: ignore[operator]
                depth = v  # type: ignore[assignment]
        elif c is Val:
            if v.depth > depth:  # type: ignore[attr-defined]
                depth = v.depth  # type: ignore[attr-defined]
            if v.taint:  # type: ignore[attr-defined]
                taint = taint | v.taint  # type: ignore[attr-defined]
                if v.ntaint:  # type: ignore[attr-defined]
                    ntaint = ntaint | v.ntaint  # type: ignore[attr-defined]
    depth += extra
    return Val(None, taint, ntaint, depth) if taint else depth


def tuple_of(items: list[object]) -> Val:
    """The value of a small tuple that holds a global: as `combine`, with its items kept."""
    v = combine(items)
    if isinstance(v, Val):
        v.parts = tuple(items)
        return v
    return Val(None, EMPTY, EMPTY, depth_of(v), parts=tuple(items))


class Stop(Exception):
    """The current segment cannot be walked further (malformed, or `limit`: a resource bound was hit)."""

    def __init__(self, message: str, offset: int, limit: bool = False, claim: bool = False) -> None:
        super().__init__(message)
        self.offset = offset
        self.limit = limit
        # a length claim past the end of the data (the rest does not exist) rather than a bound of the scanner's own
        # (opcodes, stack, nesting, memo, globals, line length): after one of those the rest was not judged
        self.claim = claim


class Source:
    """The bytes being walked: a whole buffer, or a stream of `total` bytes read in windows.

    `buf[pos]` is the byte at absolute offset `base + pos`.
    """

    def __init__(self, data: bytes | None, stream: IO[bytes] | None = None, total: int | None = None) -> None:
        self.buf = data if data is not None else b""
        self.stream = stream
        self.base = 0
        self.total = len(self.buf) if total is None else total

    def fill(self, pos: int, need: int) -> int:
        """Make `need` bytes from `pos` available; return the new `pos` (the buffer may have moved). Raises `Stop`
        when the data ends first."""
        absolute = self.base + pos
        if self.stream is None or absolute + need > self.total:
            raise Stop(f"truncated at byte {absolute}: {need} bytes needed, {self.total - absolute} remain", absolute)
        keep = self.buf[pos:]
        want = max(WINDOW, need - len(keep))
        more = self.stream.read(min(want, self.total - absolute - len(keep)))
        self.buf = keep + more
        self.base = absolute
        if len(self.buf) < need:
            self.total = self.base + len(self.buf)
            raise Stop(f"truncated at byte {self.base + len(self.buf)}: the stream ended early", absolute)
        return 0

    def skip(self, pos: int, n: int) -> int:
        """Move past `n` bytes without keeping them; return the new `pos`."""
        if pos + n <= len(self.buf):
            return pos + n
        absolute = self.base + pos
        if self.stream is None or absolute + n > self.total:
            raise Stop(f"truncated at byte {absolute}", absolute)
        left = n - (len(self.buf) - pos)
        while left > 0:
            got = self.stream.read(min(left, WINDOW))
            if not got:
                raise Stop(f"truncated at byte {absolute}: the stream ended early", absolute)
            left -= len(got)
        self.buf = b""
        self.base = absolute + n
        return 0

    def line(self, pos: int) -> tuple[int, int]:
        """(pos, index of the next newline at or after pos), refilling as needed."""
        nl = self.buf.find(b"\n", pos)
        while nl < 0:
            if len(self.buf) - pos > MAX_LINE:
                raise Stop(f"argument line at byte {self.base + pos} longer than {MAX_LINE} bytes",
                           self.base + pos, limit=True)
            have = len(self.buf) - pos
            pos = self.fill(pos, have + 1)
            nl = self.buf.find(b"\n", pos + have)
        return pos, nl


# --- opcode arguments -------------------------------------------------------------------------------------------------


def length_claim(name: str, offset: int, claimed: int, remaining: int, total: int) -> Stop:
    """A length field pointing past the data: a resource-bound violation when the claim is absurd for the stream
    (beyond 4 GiB or 16× the whole pickle), otherwise plain truncation."""
    if claimed > (1 << 32) or claimed > 16 * total:
        return Stop(f"{name} at byte {offset} claims {claimed} bytes, only {remaining} remain", offset, limit=True,
                    claim=True)
    return Stop(f"truncated: {name} at byte {offset} claims {claimed} bytes, only {remaining} remain", offset)


def text_index(arg: bytes, offset: int) -> int:
    """The memo index of a protocol-0 PUT / GET (a decimal line)."""
    text = arg.decode("ascii", "replace").strip()
    if not text.isdigit() or len(text) > 12:
        raise Stop(f"bad memo index {arg[:20]!r} at byte {offset}", offset)
    return int(text)


_S, _V, _T_OP, _U = ord("S"), ord("V"), ord("T"), ord("U")


def decode_str(code: int, raw: bytes | None) -> object:
    """The str a string opcode pushes (as the unpickler decodes it), 0 (an untracked scalar) when too long /
    undecodable, None for a protocol-0 STRING that is not quoted (the unpickler rejects it)."""
    if raw is None:
        return 0
    try:
        if code == _S:
            # STRING: a repr-quoted line, escape-decoded (pickle.py load_string).
            if len(raw) < 2 or raw[0] != raw[-1] or raw[:1] not in (b"'", b'"'):
                return None
            value = codecs.escape_decode(raw[1:-1])[0].decode("utf-8")
        elif code == _V:
            value = raw.decode("raw-unicode-escape")
        elif code == _T_OP or code == _U:
            value = raw.decode("utf-8")
        else:
            value = raw.decode("utf-8", "surrogatepass")
    except (UnicodeDecodeError, ValueError):
        return 0
    return value if len(value) <= MAX_TRACKED_STR else 0


def line_pair(arg: bytes | None, name: str, offset: int) -> tuple[str, str]:
    if arg is None or b"\n" not in arg:
        raise Stop(f"{name} at byte {offset} lacks module/name lines", offset)
    module_b, name_b = arg.split(b"\n", 1)
    return module_b.decode("utf-8", "replace"), name_b.decode("utf-8", "replace")
