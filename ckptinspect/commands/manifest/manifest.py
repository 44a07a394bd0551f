"""Writing SHA-256 integrity manifests in Megatron-Core's `integrity.json` schema (`manifest write`).

The text is byte-identical to what Megatron's `save_integrity_manifest` writes for the same files. Verifying is
`ckptinspect.services.integrity_verify` (the audit's integrity check and `manifest verify` share it), hashing
`ckptinspect.services.integrity_hashing`, merging shard reports `report.py`.

A local manifest is written to a temp file (`integrity_verify.WRITE_TEMP`), fsynced, then renamed over the target:
a reader sees the old manifest or the new one, never a part. A writer killed in between leaves the temp file; such
files are never listed (they are not checkpoint content), `audit` / `manifest verify` report them (CK406), and the
next successful write into the same dir removes those whose writer process is gone. Into object storage the manifest
is one PUT (an object appears whole or not at all): no temp object exists.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from ckptinspect.services.integrity_hashing import ALGORITHM, hash_many, stat_entry_code
from ckptinspect.services.integrity_verify import MANIFEST_NAME, WRITE_TEMP, member, same_file, write_leftovers
from ckptinspect.errors import UNREAD_CODE, ReadError, UsageError, read_code
from ckptinspect.io.local import probe_dir, unread_scope
from ckptinspect.progress import ProgressHook
from ckptinspect.io.objpath import ObjectPath


@dataclass(frozen=True, slots=True)
class WrittenManifest:
    """What `write_manifest` wrote: the file, its entries in file order, and the bytes hashed."""

    path: str
    files: tuple[tuple[str, str], ...]
    bytes_hashed: int


# --- writing ---------------------------------------------------------------------------------------------------------


def _listing(ckpt_dir: Path, out: Path, recursive: bool) -> list[tuple[str, str | ObjectPath]]:
    """(key, path) of the files a manifest lists, in Megatron's order: `sorted(Path(dir).iterdir(), key=str)`;
    never the out file, nor a temp file of an interrupted write (ours, `WRITE_TEMP`)."""
    def keep(p: Path) -> bool:
        if WRITE_TEMP.match(p.name):
            return False
        return p.is_file() and not same_file(p, out)  # is_file follows symlinks, as Megatron's writer does

    top: list[tuple[str, str | ObjectPath]] = [
        (p.name, member(ckpt_dir, p.name)) for p in sorted(ckpt_dir.iterdir(), key=str)
        if p.name != MANIFEST_NAME and keep(p)]
    if not recursive:
        return top
    if isinstance(ckpt_dir, ObjectPath):
        found_objects = [(rel, ckpt_dir / rel) for rel, _ in ckpt_dir.walk_files(True) if "/" in rel]
        return sorted(top + [(k, p) for k, p in found_objects if keep(p)], key=lambda kp: str(kp[1]))
    found: list[tuple[str, str | ObjectPath]] = list(top)
    # symlinked dirs are not entered (no loops); a sub-dir that cannot be listed fails the write, never a silent gap
    for root, dirs, names in os.walk(ckpt_dir, followlinks=False, onerror=_raise):
        if Path(root) == ckpt_dir:
            continue
        for name in names:
            p = Path(root, name)
            if keep(p):
                found.append((p.relative_to(ckpt_dir).as_posix(), str(p)))
    return sorted(found, key=lambda kp: str(kp[1]))


def _raise(e: OSError) -> None:
    raise e


def write_manifest(
    ckpt_dir: Path,
    out: Path | None = None,
    *,
    recursive: bool = False,
    workers: int | None = None,
    progress: ProgressHook | None = None,
) -> WrittenManifest:
    """Write a manifest of `ckpt_dir` (default ``ckpt_dir/integrity.json``), atomically (temp file + `os.replace`).

    The text is byte-identical to what Megatron's `save_integrity_manifest` writes for the same files. `recursive`
    also lists regular files in sub-dirs under relative POSIX keys (``tokenizer/vocab.json``); Megatron's verifier
    checks those too, since it hashes ``join(dir, name)`` for every key. The out file is never listed.
    Raises `UsageError` when `ckpt_dir` is not a dir, `ReadError` (code CK402, or CK209 when this user may not read
    it) when a file cannot be read, and `OSError` (its message naming the target) when the manifest cannot be written
    there: nothing is written then.
    """
    if not ckpt_dir.is_dir():
        raise UsageError(f"{ckpt_dir} is not a directory")
    if out is None and isinstance(ckpt_dir, ObjectPath):
        raise UsageError(f"{ckpt_dir}: writing into object storage needs an explicit --out (a URL or a local file)")
    target = out if out is not None else ckpt_dir / MANIFEST_NAME
    with unread_scope():
        denied = probe_dir(ckpt_dir)
        if denied is not None:
            raise ReadError(f"cannot list {ckpt_dir}: {denied.reason} ({denied.what})", code=UNREAD_CODE)
        try:
            listing = _listing(ckpt_dir, target, recursive)
        except OSError as e:  # a sub-dir it may not enter (--recursive), a dir that went away
            raise ReadError(f"cannot list {e.filename or ckpt_dir}: {e.strerror or e}",
                            code=read_code(e, "CK402")) from e
    sizes: dict[str, int] = {}
    for key, path in listing:
        size, why, code = stat_entry_code(path)
        if size is None:
            raise ReadError(f"cannot hash {key}: {why}", code=code)
        sizes[key] = size
    hashed = hash_many([(k, p, sizes[k]) for k, p in listing], workers, progress, f"sha256 {ckpt_dir}")
    for key, _ in listing:
        h = hashed[key]
        if h.digest is None:
            raise ReadError(f"cannot hash {key}: {h.error}", code=h.code)
    entries = {key: str(hashed[key].digest) for key, _ in listing}
    text = json.dumps({"algorithm": ALGORITHM, "files": entries}, indent=2)  # == json.dump(..., f, indent=2)
    if isinstance(target, ObjectPath):  # one PUT: an object appears whole or not at all
        target.store.write(target.key, text.encode("utf-8"))
        return WrittenManifest(str(target), tuple(entries.items()), sum(h.size for h in hashed.values()))
    _replace_atomically(target, text)
    _remove_leftovers(target)
    return WrittenManifest(str(target), tuple(entries.items()), sum(h.size for h in hashed.values()))


def _replace_atomically(target: Path, text: str) -> None:
    """Write `text` to a temp file beside `target`, fsync it, rename it over `target`. An `OSError` names what could
    not be done ("cannot write run/integrity.json: Permission denied"); the temp file is gone then."""
    tmp = target.parent / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"  # matches WRITE_TEMP
    try:
        # 0o666 & ~umask, like Megatron's plain open('w'); O_EXCL so a stale or hostile temp name is never reused.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as e:
        raise OSError(e.errno, f"cannot write {target}: cannot create a file in {target.parent} "
                      f"({e.strerror or e})") from e
    try:
        with open(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, f"cannot write {target}: {e.strerror or e}") from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _remove_leftovers(target: Path) -> None:
    """Remove the temp files of earlier writes of `target` whose writer process is gone (killed in its write window).
    A live writer's (this host's pids) is left alone; one that cannot be removed stays reported (CK406)."""
    for name in write_leftovers(target.parent):
        m = WRITE_TEMP.match(name)
        if m is None or m.group("target") != target.name or _alive(int(m.group("pid"))):
            continue
        try:
            (target.parent / name).unlink()
        except OSError:
            pass


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's process (or a number no pid can be): keep its file
    return True
