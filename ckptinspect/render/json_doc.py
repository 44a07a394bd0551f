"""JSON documents of every command (docs/contract.md "JSON output"): plain dicts with the envelope keys."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from typing import TYPE_CHECKING

from ckptinspect._version import __version__
from ckptinspect.findings import Finding

if TYPE_CHECKING:  # type-only: `info` / `sniff` must not import the checks
    from ckptinspect.commands.audit.audit import AuditReport, Listing
    from ckptinspect.model import Checkpoint
    from ckptinspect.commands.audit.summary import Summary

SCHEMA_VERSION = 1


def envelope(command: str, body: Mapping[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "tool": "ckptinspect", "version": __version__,
                           "command": command}
    doc.update(body)
    from ckptinspect.io.session import session

    if session().used:  # a URL was read: what it cost (requests, bytes received, retries)
        doc["storage"] = session().stats.snapshot().to_dict()
    return doc


def dumps(doc: Mapping[str, Any]) -> str:
    """Strict JSON, ASCII only: valid UTF-8 whatever `PYTHONIOENCODING` says, lone surrogates and control
    characters from checkpoint content escaped (`\\udcff`, `\\u001b`)."""
    try:
        return _indented(doc)
    except (_Unsupported, ValueError, RecursionError):
        pass  # something only `json.dumps` spells (through `_default`), or refuses: its own text or error
    try:
        return json.dumps(doc, indent=2, default=_default, ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        # Checkpoint content (args, common state) can hold what strict JSON cannot: tuple keys, NaN, infinity,
        # integers beyond CPython's 4300-digit str() limit, nesting deeper than the recursion limit.
        return json.dumps(_str_keys(doc, 0), indent=2, default=_default, ensure_ascii=True, allow_nan=False)


class _Unsupported(Exception):
    pass


_ascii = json.encoder.encode_basestring_ascii
_INF = (float("inf"), float("-inf"))


def _indented(doc: Any) -> str:
    """`json.dumps(doc, indent=2, ensure_ascii=True, allow_nan=False)`, the same text, for documents of plain
    dicts (str keys), lists, tuples, str, int, float, bool and None; `_Unsupported` for anything else. CPython's
    C encoder does not indent, its Python one costs ~0.2 s on an audit of 13,440 ranks (two 13,440-entry maps):
    this is 3-4 times faster."""
    out: list[str] = []
    _value(doc, "\n", out)
    return "".join(out)


def _value(o: Any, nl: str, out: list[str]) -> None:
    t = type(o)
    if t is str:
        out.append(_ascii(o))
    elif t is int:
        out.append(int.__repr__(o))  # ValueError beyond str()'s digit limit, as json.dumps
    elif o is None:
        out.append("null")
    elif o is True:
        out.append("true")
    elif o is False:
        out.append("false")
    elif t is dict:
        if not o:
            out.append("{}")
            return
        inner = nl + "  "
        sep = "{" + inner
        for k, v in o.items():
            if type(k) is not str:
                raise _Unsupported
            tv = type(v)
            if tv is int:  # leaves inline: most values of a large document are ints and names
                out.append(f"{sep}{_ascii(k)}: {int.__repr__(v)}")
            elif tv is str:
                out.append(f"{sep}{_ascii(k)}: {_ascii(v)}")
            else:
                out.append(f"{sep}{_ascii(k)}: ")
                _value(v, inner, out)
            sep = "," + inner
        out.append(nl + "}")
    elif t is list or t is tuple:
        if not o:
            out.append("[]")
            return
        inner = nl + "  "
        sep = "[" + inner
        for v in o:
            out.append(sep)
            _value(v, inner, out)
            sep = "," + inner
        out.append(nl + "]")
    elif t is float:
        if o != o or o in _INF:
            raise _Unsupported
        out.append(float.__repr__(o))
    else:
        raise _Unsupported


_MAX_INT_BITS = 13_000  # ~3,900 decimal digits: below CPython's int-to-str limit (4,300 digits)


def safe_repr(o: Any, limit: int = 200) -> str:
    """`repr` that never raises (huge ints, deep nesting) and is at most `limit` characters."""
    if isinstance(o, int) and not isinstance(o, bool) and o.bit_length() > _MAX_INT_BITS:
        return f"<{o.bit_length()}-bit int>"
    try:
        text = repr(o)
    except (ValueError, RecursionError, MemoryError):
        return f"<{type(o).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


def _str_keys(o: Any, depth: int) -> Any:
    if depth > 100:
        return f"<{type(o).__name__} nested deeper than 100 levels>"
    if isinstance(o, Mapping):
        return {k if isinstance(k, str) else safe_repr(k): _str_keys(v, depth + 1) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_str_keys(v, depth + 1) for v in o]
    if isinstance(o, float) and (o != o or o in (float("inf"), float("-inf"))):
        return repr(o)
    if isinstance(o, int) and not isinstance(o, bool) and o.bit_length() > _MAX_INT_BITS:
        return safe_repr(o)
    if not isinstance(o, (str, int, float, bool, type(None))):
        return _str_keys(_default(o), depth + 1) if hasattr(o, "to_dict") or isinstance(o, (set, frozenset)) \
            else _default(o)
    return o


def _default(o: Any) -> Any:
    if isinstance(o, (set, frozenset)):
        return sorted(o, key=repr)
    if isinstance(o, bytes):
        return f"<{len(o)} bytes>"
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "__dataclass_fields__"):
        return {k: getattr(o, k) for k in o.__dataclass_fields__}
    try:
        return str(o)[:10_000]
    except (ValueError, RecursionError):
        return f"<{type(o).__name__}>"


def findings_list(findings: Iterable[Finding]) -> list[dict[str, Any]]:
    return [f.to_dict() for f in findings]


def counts(findings: Iterable[Finding]) -> dict[str, int]:
    out = {"error": 0, "warning": 0, "info": 0}
    for f in findings:
        out[f.severity.value] += 1
    return out


def audit_doc(r: AuditReport) -> dict[str, Any]:
    summary: dict[str, Any] = {"findings": counts(r.findings), "checkpoints": len(r.checkpoints)}
    if r.summary is not None:
        summary.update(r.summary.to_dict())
    picked = r.picked.checkpoint if r.picked else None
    if picked is not None:
        summary["topology"] = picked.topology.to_dict()
        summary["optimizer_sharding"] = picked.optimizer_sharding
        summary["generation"] = picked.generation
    body: dict[str, Any] = {
        "path": r.path, "kind": r.kind.value, "format": r.format.value if r.format else None, "iteration": r.iteration,
        "status": r.status.value, "findings": findings_list(r.findings),
        "checkpoints": [a.to_dict() for a in r.checkpoints], "summary": summary,
    }
    if r.save_dir is not None:
        body["tracker"] = r.save_dir.tracker.to_dict()
        body["picked"] = r.picked.name if r.picked else None
    if r.picked is not None and r.picked.values is not None:
        body["values"] = r.picked.values_dict()  # `audit --values`: the picked checkpoint's scan
    return envelope("audit", body)


def ls_doc(listing: Listing) -> dict[str, Any]:
    return envelope("ls", {
        "path": listing.path, "tracker": dict(listing.tracker),
        "iterations": [row.to_dict() for row in listing.iterations],
        "findings": findings_list(listing.findings),
    })


def info_doc(c: Checkpoint, s: Summary) -> dict[str, Any]:
    return envelope("info", {
        "path": c.path,
        "format": c.format.value if c.format else None,
        "generation": c.generation,
        "iteration": c.iteration,
        "topology": c.topology.to_dict(),
        "topology_sources": dict(c.topology.sources),
        "optimizer_sharding": c.optimizer_sharding,
        "dataloader": c.dataloader.to_dict() if c.dataloader is not None else None,
        "tensors": [
            {"key": t.key, "shape": list(t.shape), "dtype": t.dtype, "chunks": len(t.chunks), "bytes": t.nbytes,
             "stored_bytes": t.stored_bytes, **({"shard": t.shard} if t.shard else {}),
             **({"orig_shape": list(t.orig_shape)} if t.orig_shape else {})}
            for t in c.tensors
        ],
        "objects": [
            {"key": o.key, "family": o.family, "offset": list(o.offset) if o.offset is not None else None,
             "grid": list(o.grid) if o.grid is not None else None,
             "bytes": o.storage.length if o.storage else None}
            for o in c.objects
        ],
        "bytes": c.data_bytes,
        "files": [{"name": f.name, "size": f.size, "role": f.role.value} for f in c.files],
        "args": dict(c.args) if c.args is not None else None,
        "common": dict(c.common) if c.common is not None else None,
        "summary": s.to_dict(),
        "findings": findings_list(c.findings),
    })


def broken_save_dir_json(command: str, findings: list[Finding]) -> str:
    """The JSON document of a command whose save dir has no checkpoint to pick (`BrokenSaveDir`): its findings."""
    from ckptinspect.findings import status_of

    return dumps(envelope(command, {"path": findings[0].path if findings else None,
                                    "status": status_of(findings).value, "findings": findings_list(findings)}))
