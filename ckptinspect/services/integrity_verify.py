"""Verifying SHA-256 integrity manifests in Megatron-Core's `integrity.json` schema (the audit's integrity check and
`manifest verify`; writing is `commands/manifest/manifest.py`, merging shard reports `commands/manifest/report.py`).

Semantics follow `megatron/core/dist_checkpointing/validation.py` (core ≥0.17.1, reference §2): the manifest is
``{"algorithm": "sha256", "files": {name: hexdigest}}`` (`algorithm` absent means sha256), each entry is the
whole-file SHA-256 of ``join(ckpt_dir, name)``, and the writer lists the top-level regular files (symlinks followed,
as `Path.is_file` does) except `integrity.json`. Where Megatron would raise a raw exception (bad JSON, no `files`)
or silently pass (files not listed), this module reports findings CK400–CK404 instead. Two deliberate deviations,
both for hostile checkpoints: a name that escapes the dir (absolute, ``..``) is a schema error (CK404) instead of
being read, and only regular files are opened (a FIFO or device named by the manifest is CK402, never a hang).

Verification never writes to the checkpoint. Hashing runs on a thread pool (hashlib and `readinto` release the GIL),
biggest files first, each thread reading into one reused buffer, so memory is bounded by ``workers × 4 MiB``.

The hashing lives in `integrity_hashing.py`, the report types in `integrity_report.py`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

from ckptinspect.services.integrity_hashing import hash_many, stat_entry, stat_entry_code
from ckptinspect.progress import ProgressHook
from ckptinspect.errors import UsageError, read_code
from ckptinspect.findings import CODES, Finding, Status, status_of
from ckptinspect.io.local import probe_dir, unread_scope
from ckptinspect.io.findings import unread_findings
from ckptinspect.io.objpath import ObjectPath
from ckptinspect.services.integrity_hashing import ALGORITHM
from ckptinspect.services.integrity_report import FileResult, ManifestReport, sizes_from_report

MANIFEST_NAME = "integrity.json"  # Megatron's INTEGRITY_FNAME
# The temp file `manifest write` writes before its atomic rename: `.<manifest name>.<pid>.<8 hex>.tmp`. A writer
# killed between the two leaves it behind; it is never manifest content (never listed), is reported (CK406), and the
# next write into the same dir removes those of writers that are gone.
WRITE_TEMP = re.compile(r"^\.(?P<target>.+)\.(?P<pid>[0-9]+)\.(?P<token>[0-9a-f]{8})\.tmp$")
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_MAX_MANIFEST_BYTES = 128 * 1024 * 1024
_HEX64 = re.compile(r"[0-9a-f]{64}")  # Megatron compares `hexdigest()` strings exactly: lowercase only
_STALE_CODE = "CK405"  # proposed: manifest older than metadata.json; emitted only once the code table has it
_STALE_TOLERANCE_S = 2.0  # coarse mtime granularity (FAT, some network filesystems)


# --- reading and checking the manifest -------------------------------------------------------------------------------


def _f(code: str, message: str, subject: str | None, path: str, **details: Any) -> Finding:
    return Finding(code, message, subject, path, details)


def _bad_key(name: str) -> str | None:
    """Why `name` cannot be a manifest key we read, or None. Megatron would `join` it as is."""
    if not name or "\x00" in name:
        return "empty or contains NUL"
    p = PurePosixPath(name.replace("\\", "/"))
    if p.is_absolute() or ".." in p.parts or os.path.isabs(name):
        return "escapes the checkpoint dir"
    return None


def _load_manifest(manifest: Path, label: str) -> tuple[dict[str, Any] | None, str | None, list[Finding]]:
    """Parse `manifest`: (`files` mapping or None, digest of its bytes, CK404 findings). Never raises on bad input."""
    where = str(manifest)

    def bad(message: str, **details: Any) -> tuple[None, str | None, list[Finding]]:
        return None, None, [_f("CK404", message, where, label, **details)]

    try:
        if isinstance(manifest, ObjectPath):
            raw = _read_object(manifest)
        else:
            raw = _read_file(manifest)
    except ValueError as e:
        return bad(f"integrity manifest {where} {e}")
    except OSError as e:
        code = read_code(e, "CK404")  # a manifest this user may not read is not a broken one (CK209)
        return None, None, [_f(code, f"integrity manifest {where} is unreadable: {e.strerror or e}", where, label,
                               error=type(e).__name__)]
    return _parse_manifest(raw, where, bad)


def _read_object(manifest: ObjectPath) -> bytes:
    info = manifest.object_info()
    if info is None:
        raise ValueError("is a directory" if manifest.is_dir() else "does not exist")
    if info.size > _MAX_MANIFEST_BYTES:
        raise ValueError(f"is {info.size} bytes, over the {_MAX_MANIFEST_BYTES} limit")
    with manifest.open_reader() as fh:
        return fh.read(_MAX_MANIFEST_BYTES + 1)


def _read_file(manifest: Path) -> bytes:
    """The manifest's bytes; ValueError says why it is not a file we read, OSError that it is unreadable."""
    st = os.stat(manifest)
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise ValueError(f"is {kind}")
    if st.st_size > _MAX_MANIFEST_BYTES:
        raise ValueError(f"is {st.st_size} bytes, over the {_MAX_MANIFEST_BYTES} limit")
    with open(manifest, "rb") as fh:
        return fh.read(_MAX_MANIFEST_BYTES + 1)


_Loaded = tuple[dict[str, Any] | None, str | None, list[Finding]]


def _parse_manifest(raw: bytes, where: str, bad: Callable[..., _Loaded]) -> _Loaded:
    digest = hashlib.sha256(raw).hexdigest()
    if not raw.strip():
        return bad(f"integrity manifest {where} is empty")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return bad(f"integrity manifest {where} is not valid JSON: {e}")
    if not isinstance(data, dict):
        return bad(f"integrity manifest {where} is a JSON {type(data).__name__}, not an object")
    algorithm = data.get("algorithm", ALGORITHM)
    if algorithm != ALGORITHM:
        return bad(f"integrity manifest {where} uses unsupported hash algorithm {algorithm!r} (only sha256)",
                   algorithm=algorithm)
    files = data.get("files")
    if not isinstance(files, dict):
        what = "has no 'files' object" if files is None else f"has 'files' of type {type(files).__name__}"
        return bad(f"integrity manifest {where} {what}")
    return files, digest, []


def _entries(files: Mapping[str, Any], label: str) -> tuple[dict[str, str], list[Finding]]:
    """The well-formed entries of `files`, and CK404 for each malformed one (the rest is still verified)."""
    good: dict[str, str] = {}
    bad: list[Finding] = []
    for name, value in files.items():
        why = _bad_key(name)
        if why is not None:
            bad.append(_f("CK404", f"manifest entry {name!r}: the name {why}", name, label))
        elif not isinstance(value, str) or not _HEX64.fullmatch(value):
            bad.append(_f("CK404", f"manifest entry {name!r}: {value!r} is not a lowercase 64-hex SHA-256 digest",
                          name, label, value=value if isinstance(value, (str, int, float, bool)) else repr(value)))
        else:
            good[name] = value
    return good, bad


def parse_shard(shard: str | tuple[int, int] | None, flag: str = "shard") -> tuple[int, int] | None:
    """The one reading of a verification shard: `"K/N"` (the CLI's `--shard`) or `(K, N)` (the API's), 0 <= K < N.
    Raises `UsageError` naming `flag` for anything else."""
    if shard is None:
        return None
    if isinstance(shard, str):
        try:
            k, n = (int(x) for x in shard.split("/", 1))
        except ValueError:
            raise UsageError(f"{flag} {shard!r}: expected K/N, e.g. 0/4") from None
        spelled = repr(shard)
    else:
        k, n = shard
        spelled = f"{k}/{n}"
    if not (n > 0 and 0 <= k < n):
        raise UsageError(f"{flag} {spelled}: need 0 <= K < N")
    return k, n


def shard_of(name: str, n: int) -> int:
    """The shard (0-based, of `n`) that verifies manifest entry `name`: stable across runs, machines, Pythons."""
    h = hashlib.sha256(name.encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(h[:8], "big") % n


def _mismatch(name: str, expected: str, actual: str, label: str, size: int) -> Finding:
    return _f("CK401", f"{name}: hash mismatch (expected {expected[:16]}..., got {actual[:16]}...)", name, label,
              expected=expected[:16], actual=actual[:16], expected_sha256=expected, actual_sha256=actual, size=size)


def _unlisted(ckpt_dir: Path, listed: Mapping[str, str], manifest: Path, label: str) -> list[Finding]:
    """CK403 for top-level regular files the manifest does not list (Megatron's writer would have); CK406 for a
    temp file an interrupted `manifest write` left (never content, so never CK403)."""
    out: list[Finding] = []
    names = {os.path.normpath(k) for k in listed}  # "./x" names the same file as "x"
    try:
        entries = sorted(ckpt_dir.iterdir(), key=str)
    except OSError:
        return out
    for entry in entries:
        if entry.name == MANIFEST_NAME or entry.name in names or same_file(entry, manifest):
            continue
        if WRITE_TEMP.match(entry.name):
            out.append(_leftover(entry.name, label))
        elif stat_entry(member(ckpt_dir, entry.name))[0] is not None:
            out.append(_f("CK403", f"{entry.name} is not listed in the integrity manifest", entry.name, label))
    return out


def write_leftovers(ckpt_dir: Path) -> list[str]:
    """Names of the `manifest write` temp files (`WRITE_TEMP`) at the top of `ckpt_dir`, sorted."""
    try:
        return sorted(p.name for p in ckpt_dir.iterdir() if WRITE_TEMP.match(p.name))
    except OSError:
        return []


def _leftover(name: str, label: str) -> Finding:
    m = WRITE_TEMP.match(name)
    pid = int(m.group("pid")) if m else None
    return _f("CK406", f"{name} is the temp file of a `manifest write` (pid {pid}) that was interrupted before its "
              "atomic rename: not manifest content; the next `manifest write` here removes it", name, label,
              pid=pid, target=m.group("target") if m else None)


def member(ckpt_dir: Path, name: str) -> str | ObjectPath:
    """What `_hashing` opens for manifest key `name`: ``join(dir, name)`` as Megatron does, or the object."""
    return ckpt_dir / name if isinstance(ckpt_dir, ObjectPath) else os.path.join(ckpt_dir, name)


def _lexists(p: Path) -> bool:
    return p.exists() if isinstance(p, ObjectPath) else os.path.lexists(p)


def same_file(a: Path, b: Path) -> bool:
    if isinstance(a, ObjectPath) or isinstance(b, ObjectPath):
        return str(a) == str(b)
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def manifest_is_stale(ckpt_dir: Path, manifest: Path) -> bool:
    """True when `manifest` is older than the dir's `metadata.json`, which Megatron writes just before it.
    Not decided for objects (their listing's modification times are not kept): False."""
    if isinstance(manifest, ObjectPath) or isinstance(ckpt_dir, ObjectPath):
        return False
    try:
        return os.stat(manifest).st_mtime + _STALE_TOLERANCE_S < os.stat(ckpt_dir / "metadata.json").st_mtime
    except OSError:
        return False


def verify_manifest(
    ckpt_dir: Path,
    manifest: Path | None = None,
    *,
    shard: tuple[int, int] | None = None,
    workers: int | None = None,
    progress: ProgressHook | None = None,
    path_label: str | None = None,
    known_sizes: Mapping[str, int] | None = None,
    hash_files: bool = True,
) -> ManifestReport:
    """Verify `manifest` (default ``ckpt_dir/integrity.json``) against the files of `ckpt_dir`, read-only.

    1. Parse the manifest (CK400 when the default one is absent, CK404 when it is unusable or an entry is malformed).
    2. Cheap checks, before reading a byte: listed files missing / not regular (CK402); an empty file whose listed
       digest is not the empty digest, or a size that differs from `known_sizes` (sizes of the files those digests
       were taken from, e.g. `sizes_from_report` of an earlier report) (CK401).
    3. Hash the rest in parallel, biggest first (CK401 mismatch, CK402 unreadable) — unless `hash_files` is False
       (`audit` without `--hash` / `--deep`: work proportional to a metadata-level verdict).
    4. Unless verifying a shard K > 0: top-level regular files the manifest does not list (CK403, warning).

    shard: ``(K, N)`` verifies only entries with ``shard_of(name, N) == K``; N runs cover the manifest once.
    path_label: the checkpoint as the user named it, for the findings' `path` (default `str(ckpt_dir)`).
    Raises `UsageError` only for a `ckpt_dir` that is not a dir or an impossible `shard`; a broken checkpoint or
    manifest is findings.
    """
    label = path_label if path_label is not None else str(ckpt_dir)
    if not ckpt_dir.is_dir():
        raise UsageError(f"{ckpt_dir} is not a directory")
    shard = parse_shard(shard)
    with unread_scope():
        if probe_dir(ckpt_dir) is not None:  # a dir this user may not list or enter: nothing verified (CK209)
            denied = unread_findings(ckpt_dir, label)
            return ManifestReport(status_of(denied), denied, 0, 0, None, (), shard, None, label)
        report = _verify(ckpt_dir, manifest, shard, workers, progress, label, known_sizes, hash_files)
        late = unread_findings(ckpt_dir, label, report.findings)  # what the listing and hashing could not read
        if not late:
            return report
        return replace(report, findings=report.findings + late, status=status_of(report.findings + late))


def _verify(ckpt_dir: Path, manifest: Path | None, shard: tuple[int, int] | None, workers: int | None,
            progress: ProgressHook | None, label: str, known_sizes: Mapping[str, int] | None,
            hash_files: bool) -> ManifestReport:
    mpath = manifest if manifest is not None else ckpt_dir / MANIFEST_NAME
    if manifest is None and not _lexists(mpath):
        info = _f("CK400", f"no integrity manifest ({MANIFEST_NAME}) in {label}", None, label)
        left = tuple(_leftover(n, label) for n in write_leftovers(ckpt_dir))  # a first write that was killed
        return ManifestReport(Status.COMPLETE, (info, *left), 0, 0, None, (), shard, None, label)
    files, mdigest, findings = _load_manifest(mpath, label)
    if files is None:
        return ManifestReport(status_of(findings), tuple(findings), 0, 0, str(mpath), (), shard, mdigest, label)
    listed, malformed = _entries(files, label)
    findings += malformed
    mine = {n: d for n, d in listed.items() if shard is None or shard_of(n, shard[1]) == shard[0]}

    results: dict[str, FileResult] = {}
    jobs: list[tuple[str, str | ObjectPath, int]] = []
    for name, expected in mine.items():
        size, why, code = stat_entry_code(member(ckpt_dir, name))
        if size is None:
            findings.append(_f(code, f"{name}: {why}", name, label, reason=why))
            results[name] = FileResult(name, expected, None, None, False)
        elif size == 0 and expected != EMPTY_SHA256:
            findings.append(_mismatch(name, expected, EMPTY_SHA256, label, 0))
            results[name] = FileResult(name, expected, EMPTY_SHA256, 0, False)
        elif known_sizes is not None and name in known_sizes and known_sizes[name] != size:
            findings.append(_f("CK401", f"{name}: size {size} differs from the {known_sizes[name]} bytes the listed "
                               f"digest was taken from (not hashed)", name, label, expected=expected[:16],
                               expected_sha256=expected, actual=None, size=size, expected_size=known_sizes[name]))
            results[name] = FileResult(name, expected, None, size, False)
        elif hash_files:
            jobs.append((name, member(ckpt_dir, name), size))
        else:
            results[name] = FileResult(name, expected, None, size, False)  # not hashed: no claim either way

    hashed = hash_many(jobs, workers, progress, f"sha256 {label}")
    for name, _, _ in jobs:  # report in manifest order, whatever order the threads finished in
        h, expected = hashed[name], mine[name]
        if h.digest is None and h.code != "CK402":  # could not be read here: not verified, not broken
            findings.append(_f(h.code, f"{name}: {h.error}; not hashed, so its manifest entry is not verified", name,
                               label, reason=h.error))
        elif h.digest is None:
            findings.append(_f("CK402", f"{name}: file missing or unreadable ({h.error})", name, label,
                               reason=h.error))
        elif h.digest != expected:
            findings.append(_mismatch(name, expected, h.digest, label, h.size))
        results[name] = FileResult(name, expected, h.digest, h.size, h.digest == expected)

    if shard is None or shard[0] == 0:
        findings += _unlisted(ckpt_dir, files, mpath, label)
    hash_errors = any(f.code in ("CK401", "CK402") for f in findings)
    if hash_errors and _STALE_CODE in CODES and manifest_is_stale(ckpt_dir, mpath):
        findings.append(_f(_STALE_CODE, f"integrity manifest {mpath} is older than metadata.json: probably left "
                           "over from an earlier save into the same dir", str(mpath), label))
    ordered = tuple(results[n] for n in mine)
    return ManifestReport(status_of(findings), tuple(findings), len(mine), sum(h.size for h in hashed.values()),
                          str(mpath), ordered, shard, mdigest, label)
