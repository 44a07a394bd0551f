"""SARIF 2.1.0 (`-o sarif` of `audit`, `scan`, `manifest verify`): one run, the code table as its rules, one result
per finding.

Code scanning services (GitHub, GitLab, Azure DevOps) read SARIF; what they need from a checkpoint finding:

- rules: every row of `findings.CODES` (not only the codes found, so `ruleIndex` is the same in every document):
  id = the code, short description = the title, full description and help = what the code means for the
  checkpoint's status and how to act on it, default level = the severity (info → `note`).
- results: level from the severity, the finding's message, and one location. The *physical* location is the file
  the finding is about, relative to the PATH the command was given (`uriBaseId` `CHECKPOINT`, whose absolute URI
  is in the run's `originalUriBaseIds`), with the stored item's byte range (`byteOffset` / `byteLength`) when the
  finding names one; a finding about no file in particular (a tensor's coverage, an arg) points at its
  checkpoint's dir. The *logical* locations are the tensor, object, arg or pickle the finding is about, and the
  chunk regions of a coverage finding.
- the status of the checkpoint: in the run's `properties` (`status`, with `command`, `path`, counts by severity).

A finding of a leftover iteration that `audit` classified cheaply (not in the verdict, `AuditResult.
deciding_findings`) is kept, as `kind: informational` with level `none` (SARIF's spelling of "reported, does not
fail") and `properties.deciding: false`.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Collection, Iterable, Mapping
from pathlib import PurePosixPath
from typing import Any, TypeGuard
from urllib.parse import quote

from ckptinspect._version import __version__
from ckptinspect.findings import CODES, CodeInfo, Finding, Severity, Status

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
BASE_ID = "CHECKPOINT"
FINGERPRINT = "ckptinspect/v1"
MAX_REGIONS = 10  # chunk regions of one coverage finding given as logical locations (details has them all)

_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}

# docs/contract.md "Status of a checkpoint", one line each
_STATUS_MEANING = {
    Status.COMPLETE: "readable, every required file present, every byte range inside its file, coverage exact",
    Status.INCOMPLETE: "the shape of a save that did not finish",
    Status.CORRUPT: "present but wrong (truncated or missing data, coverage gaps or overlaps, hash mismatch, "
                    "unreadable metadata)",
    Status.UNSAFE: "a pickle the real loader would unpickle would run code (it was NOT executed here)",
    Status.UNRECOGNIZED: "not a checkpoint of any known format",
}


class FileBase(enum.Enum):
    """What a finding's `details["file"]` is relative to: its checkpoint (`audit`) or the scanned PATH (`scan`)."""

    CHECKPOINT = "checkpoint"
    ROOT = "root"


class Subject(enum.Enum):
    """What a finding's `subject` names."""

    FILE = "file"  # a file or dir of the checkpoint (relative to it), or an absolute path / URL
    PICKLE = "pickle"  # a pickle: a file, a stored item key, `key@offsets`, `file!member` (with details.file)
    TENSOR = "tensor"
    OBJECT = "object"
    ARG = "arg"

    @property
    def logical_kind(self) -> str:
        """The SARIF `logicalLocation.kind` of such a subject when it is not the physical location."""
        return {"tensor": "array", "arg": "parameter"}.get(self.value, "object")


# By check family; codes whose subject is something else are overridden below. A new family fails the test that
# every code has a subject kind.
_FAMILY_SUBJECT = {
    "format": Subject.FILE, "legacy": Subject.FILE, "stack": Subject.FILE, "storage": Subject.FILE,
    "integrity": Subject.FILE, "tracker": Subject.FILE, "safety": Subject.PICKLE, "coverage": Subject.TENSOR,
    "objects": Subject.OBJECT, "args": Subject.ARG, "estimate": Subject.FILE,
    "retain": Subject.FILE, "lineage": Subject.FILE, "safetensors": Subject.FILE, "values": Subject.TENSOR,
    "watch": Subject.FILE,
    "conversion": Subject.TENSOR,
}
_CODE_SUBJECT = {
    "CK205": Subject.TENSOR, "CK208": Subject.TENSOR,  # a stored item (details: file, offset, length)
    "CK304": Subject.TENSOR,
    "CK515": Subject.TENSOR, "CK516": Subject.OBJECT, "CK517": Subject.OBJECT,
    # safetensors findings about one tensor's entry or span (the others name the file)
    **{c: Subject.TENSOR for c in ("CK143", "CK144", "CK145", "CK146", "CK147", "CK150", "CK151", "CK155")},
}


def subject_kind(code: str) -> Subject:
    info = CODES[code]
    return _CODE_SUBJECT.get(code) or _FAMILY_SUBJECT[info.family]


def rule(info: CodeInfo) -> dict[str, Any]:
    """One `reportingDescriptor`: the code table's row, with what it means and how to act on it."""
    status = (f"A checkpoint with this finding is `{info.status.value}`: {_STATUS_MEANING[info.status]}."
              if info.status is not None else "It does not change the checkpoint's status.")
    full = f"{info.title[0].upper()}{info.title[1:]} ({info.family} check, severity {info.severity.value}). {status}"
    help_text = (f"{info.code}: {info.title}. {status} The result's message names the file, tensor or object and "
                 "the numbers; its properties.details hold the same facts as `-o json`. "
                 f"`--ignore {info.code}` drops this code, `--select {info.code}` keeps only it; `--fail-on` decides "
                 "which severities fail the command. The codes are listed in docs/contract.md, \"Finding codes\".")
    tags = [info.family, "checkpoint"] + (["security"] if info.status is Status.UNSAFE else [])
    return {
        "id": info.code,
        "shortDescription": {"text": info.title},
        "fullDescription": {"text": full},
        "defaultConfiguration": {"level": _LEVEL[info.severity]},
        "help": {"text": help_text},
        "properties": {"family": info.family, "severity": info.severity.value,
                       "implied_status": info.status.value if info.status else None, "tags": tags},
    }


RULE_INDEX = {code: i for i, code in enumerate(CODES)}


def _uri_ref(rel: str) -> str:
    """A relative URI reference for a POSIX path (percent-encoded; a non-UTF-8 name's bytes as they were)."""
    return quote(rel, safe="/", errors="surrogateescape")


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _is_url(text: str) -> bool:
    return _SCHEME.match(text) is not None


def _absolute_uri(text: str, directory: bool = False) -> str:
    """`text` (a local path or a URL) as an absolute URI; with a trailing slash for a directory."""
    if _is_url(text):
        scheme, _, rest = text.partition("://")
        uri = f"{scheme}://{quote(rest, safe='/@:', errors='surrogateescape')}"
    else:
        from pathlib import Path

        uri = Path(text).absolute().as_uri()
    return uri.rstrip("/") + "/" if directory else uri


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


class _Locator:
    """Turns a finding's path / subject / details into SARIF locations relative to the command's PATH."""

    def __init__(self, root: str, root_is_file: bool, file_base: FileBase) -> None:
        self.root = root.rstrip("/") or root
        self.root_is_file = root_is_file
        self.file_base = file_base
        if root_is_file and not _is_url(root):
            from pathlib import Path

            parent = Path(root).absolute().parent
            self.base_uri = _absolute_uri(str(parent), directory=True)
            self.root_rel = Path(root).name
        elif root_is_file:
            head, _, name = root.rpartition("/")
            self.base_uri, self.root_rel = _absolute_uri(head, directory=True), name
        else:
            self.base_uri, self.root_rel = _absolute_uri(root, directory=True), ""

    def checkpoint_rel(self, f: Finding) -> str | None:
        """The finding's checkpoint relative to the base (None: not under PATH)."""
        path = (f.path or self.root).rstrip("/") or "/"
        if path == self.root:
            return self.root_rel
        if path.startswith(self.root + "/"):
            return _join(self.root_rel, path[len(self.root) + 1:])
        return None

    def artifact(self, f: Finding, rel: str | None) -> dict[str, Any]:
        """artifactLocation of `rel` (relative to the base), or of the finding's checkpoint when not under PATH."""
        if rel is None:
            return {"uri": _absolute_uri(f.path or self.root)}
        return {"uri": _uri_ref(rel) if rel else "./", "uriBaseId": BASE_ID}

    def location(self, f: Finding) -> tuple[dict[str, Any], str]:
        """The result's location and the artifact's key (for the fingerprint)."""
        kind = subject_kind(f.code)
        details = f.details
        ckpt = self.checkpoint_rel(f)
        physical: dict[str, Any]
        logical: list[dict[str, Any]] = []
        file = details.get("file")
        url = details.get("url")
        subject = f.subject
        if isinstance(url, str) and _is_url(url):
            physical = {"artifactLocation": {"uri": _absolute_uri(url)}}
            key = url
        elif isinstance(file, str) and file:
            rel = self._file_rel(file, ckpt)
            physical = {"artifactLocation": self.artifact(f, rel)}
            key = rel if rel is not None else file
            offset, length = details.get("offset"), details.get("length")
            if _natural(offset) and _natural(length):
                physical["region"] = {"byteOffset": offset, "byteLength": length}
            if subject and subject != PurePosixPath(file).name and subject != file:
                logical.append(_logical(subject, kind.logical_kind))
        elif kind is Subject.FILE and subject:
            rel = self._file_rel(subject, ckpt, subject_is_ckpt_relative=True)
            physical = {"artifactLocation": self.artifact(f, rel) if rel is not None or not _absolute(subject)
                        else {"uri": _absolute_uri(subject)}}
            key = rel if rel is not None else subject
            size, end = details.get("file_size"), details.get("max_end")
            if _natural(size) and _natural(end) and end > size:  # CK202: the bytes the items need past the end
                physical["region"] = {"byteOffset": size, "byteLength": end - size}
        else:
            physical = {"artifactLocation": self.artifact(f, ckpt)}
            key = ckpt if ckpt is not None else (f.path or self.root)
            if subject:
                logical.append(_logical(subject, kind.logical_kind))
        regions = details.get("regions")
        if subject and isinstance(regions, list):
            for r in regions[:MAX_REGIONS]:
                chunk = _chunk_name(subject, r)
                if chunk is not None:
                    logical.append(_logical(chunk, "element"))
        loc: dict[str, Any] = {"physicalLocation": physical}
        if logical:
            loc["logicalLocations"] = logical
        return loc, key

    def _file_rel(self, name: str, ckpt: str | None, subject_is_ckpt_relative: bool = False) -> str | None:
        """A file named by a finding, relative to the base; None when it is absolute (outside PATH or a URL)."""
        if _absolute(name):
            if not _is_url(name) and not _is_url(self.root):
                from pathlib import Path

                try:
                    return _join(self.root_rel, str(Path(name).absolute().relative_to(Path(self.root).absolute())))
                except ValueError:
                    return None
            return None
        if ckpt is None:
            return None
        if self.root_is_file and ckpt == self.root_rel and name == self.root_rel:
            return ckpt  # the checkpoint is the file itself (`audit model.pt`: subject `model.pt`)
        if self.file_base is FileBase.ROOT and not subject_is_ckpt_relative:
            return _join(self.root_rel, name) if not self.root_is_file else self.root_rel
        return _join(ckpt, name)


def _absolute(name: str) -> bool:
    return name.startswith("/") or _is_url(name)


def _natural(v: object) -> TypeGuard[int]:
    return type(v) is int and v >= 0


def _logical(name: str, kind: str) -> dict[str, Any]:
    return {"name": name, "fullyQualifiedName": name, "kind": kind}


def _chunk_name(key: str, region: object) -> str | None:
    """`key[64:128, 0:16]` for a coverage region `{"offsets": [64, 0], "sizes": [64, 16]}`."""
    if not isinstance(region, Mapping):
        return None
    offsets, sizes = region.get("offsets"), region.get("sizes")
    if not (isinstance(offsets, list) and isinstance(sizes, list) and len(offsets) == len(sizes)
            and all(type(v) is int for v in offsets + sizes)):
        return None
    return f"{key}[{', '.join(f'{o}:{o + s}' for o, s in zip(offsets, sizes))}]"


def _fingerprint(f: Finding, key: str) -> str:
    """Stable across runs for the same problem (code, where, what), whatever the message's numbers."""
    raw = "\0".join((f.code, key, f.subject or "")).encode("utf-8", "surrogateescape")
    return hashlib.sha256(raw).hexdigest()[:32]


def _result(f: Finding, locator: _Locator, deciding: bool) -> dict[str, Any]:
    loc, key = locator.location(f)
    result: dict[str, Any] = {
        "ruleId": f.code,
        "ruleIndex": RULE_INDEX[f.code],
        "level": _LEVEL[f.severity] if deciding else "none",
        "message": {"text": f.message or CODES[f.code].title},
        "locations": [loc],
        "partialFingerprints": {FINGERPRINT: _fingerprint(f, key)},
        "properties": {"severity": f.severity.value, "subject": f.subject, "checkpoint": f.path,
                       "deciding": deciding, "details": dict(f.details)},
    }
    if not deciding:
        result["kind"] = "informational"
    return result


def sarif_document(command: str, root: str, status: Status, findings: Iterable[Finding], *,
                   deciding: Collection[int] | None = None, root_is_file: bool = False,
                   file_base: FileBase = FileBase.CHECKPOINT,
                   properties: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The SARIF log of one command's run over `root` (the PATH as the user named it).

    deciding: `id()`s of the findings the verdict rests on (None: all of them).
    root_is_file: PATH is one file (its dir is the base URI).
    file_base: what `details["file"]` is relative to.
    properties: more run properties (the command's counts).
    """
    found = list(findings)
    locator = _Locator(root, root_is_file, file_base)
    results = [_result(f, locator, deciding is None or id(f) in deciding) for f in found]
    counts = {s.value: sum(1 for f in found if f.severity is s) for s in (Severity.ERROR, Severity.WARNING,
                                                                           Severity.INFO)}
    run_props: dict[str, Any] = {"command": command, "path": root, "status": status.value, "findings": counts}
    run_props.update(properties or {})
    return {
        "$schema": SARIF_SCHEMA,
        "version": SARIF_VERSION,
        "runs": [{
            "tool": {"driver": {"name": "ckptinspect", "version": __version__, "semanticVersion": __version__,
                                "rules": [rule(info) for info in CODES.values()]}},
            "invocations": [{"executionSuccessful": True}],
            "originalUriBaseIds": {BASE_ID: {"uri": locator.base_uri,
                                             "description": {"text": "the PATH given to ckptinspect (its dir, "
                                                                     "when PATH is a file)"}}},
            "results": results,
            "properties": run_props,
        }],
    }


def sarif_text(doc: Mapping[str, Any]) -> str:
    from ckptinspect.render.json_doc import dumps

    return dumps(doc) + "\n"


def broken_save_dir_sarif(command: str, findings: list[Finding]) -> str:
    """The SARIF log of a command whose save dir has no checkpoint to pick (`BrokenSaveDir`): its findings."""
    from ckptinspect.findings import status_of

    root = next((f.path for f in findings if f.path), None) or "."
    return sarif_text(sarif_document(command, root, status_of(findings), findings))
