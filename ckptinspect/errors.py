"""The one exception tree of ckptinspect.

A broken checkpoint is never an exception that reaches the user: readers and checks turn it into findings. These
exceptions are for the tool's own boundaries: a usage problem (the CLI maps it to exit 2) or a reader that cannot
go on (caught by the caller and turned into a finding).
"""

from __future__ import annotations

import enum
import errno

# What a failed read of a local file says when the bytes were never seen: no permission (EACCES, EPERM: a mode, an
# ACL, a read-only mount's policy) or the device failed (EIO). The file may be perfectly good; the verdict on it is
# missing (CK209), which is not what the code of a broken file (CK106, CK206, ...) says.
ACCESS_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EIO})
UNREAD_CODE = "CK209"


def access_failure(e: BaseException) -> bool:
    """Whether `e` is a local read that failed for access (see `ACCESS_ERRNOS`). Object-storage errors are not:
    they have codes of their own (CK220-CK224), reported from the storage session."""
    if not isinstance(e, OSError) or e.errno not in ACCESS_ERRNOS:
        return False
    return not isinstance(e, StorageError)


def caused_by_access(e: BaseException) -> bool:
    """Whether `e` or an exception it was raised from / while handling is an access failure."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if access_failure(cur):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def read_code(e: BaseException, code: str) -> str:
    """The finding code for a read that failed with `e`: `code` (the file's own: CK106 for `.metadata`, ...), or
    CK209 when the read failed for access (`caused_by_access`). The one rule every reader and check applies."""
    return UNREAD_CODE if caused_by_access(e) else code


class CkptInspectError(Exception):
    """Root of every exception ckptinspect raises on purpose."""


class UsageError(CkptInspectError):
    """The user asked for something impossible: a path that does not exist, a bad option value (exit 2)."""


class ReadError(CkptInspectError):
    """A checkpoint file could not be read or decoded; callers turn it into a finding.

    `code` is the finding code the caller should report (e.g. ``CK106`` for an unreadable `.metadata`): the code
    it was raised with, or CK209 when it was raised from a read that failed for access (`read_code`), so every
    reader that turns a `ReadError` into a finding reports a permission problem as one, never as a broken file.
    """

    def __init__(self, message: str, code: str = "CK206") -> None:
        super().__init__(message)
        self.raised_code = code
        # What the pickles read before the failure referenced and called (a `PickleReport`), or None: a pickle that
        # calls `os.system` and then fails to parse is unsafe, not merely corrupt.
        self.report: object | None = None

    @property
    def code(self) -> str:
        return read_code(self, self.raised_code)


class BrokenSaveDir(CkptInspectError):
    """A save dir has no checkpoint to pick (bad tracker, tracker naming a missing iteration, no iterations).

    Not a usage error: the save dir is broken. `findings` (CK100 / CK502 / CK503) say why; the CLI renders them
    and exits 1.
    """

    def __init__(self, message: str, findings: tuple[object, ...]) -> None:
        super().__init__(message)
        self.findings = findings


class LimitExceeded(ReadError):
    """Input claimed more than the reader's resource bounds allow (huge string, deep nesting, zip bomb)."""


# Object-storage errors (raised by `io/` backends and the storage session). They derive from `OSError`, so the
# readers turn a failed read into the same findings as a failed local read.


class Fault(enum.Enum):
    """What an exception from a backend client means."""

    TRANSIENT = "transient"  # throttling, 5xx, timeouts, dropped connections: retried with backoff
    MISSING = "missing"  # 404 / no such key or bucket
    DENIED = "denied"  # 401 / 403 / no credentials
    CHANGED = "changed"  # 412: the conditional read saw another ETag
    UNREACHABLE = "unreachable"  # DNS failure, connection refused, bad endpoint
    OTHER = "other"


class StorageError(OSError):
    """A storage operation failed for good (after retries when the fault was transient)."""

    fault = Fault.OTHER

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(_ERRNO[self.fault], message)
        self.key = key

    def __str__(self) -> str:
        return str(self.strerror)


class ObjectMissing(StorageError):
    fault = Fault.MISSING


class AccessDenied(StorageError):
    fault = Fault.DENIED


class ObjectChanged(StorageError):
    fault = Fault.CHANGED


class Unreachable(StorageError):
    fault = Fault.UNREACHABLE


class RetriesExhausted(StorageError):
    fault = Fault.TRANSIENT


class ObjectTruncated(StorageError):
    """The server sent fewer bytes than the listing's size promised."""


_ERRNO = {Fault.MISSING: errno.ENOENT, Fault.DENIED: errno.EACCES, Fault.CHANGED: errno.ESTALE,
          Fault.UNREACHABLE: errno.EHOSTUNREACH, Fault.TRANSIENT: errno.ETIMEDOUT, Fault.OTHER: errno.EIO}

ERRORS: dict[Fault, type[StorageError]] = {Fault.MISSING: ObjectMissing, Fault.DENIED: AccessDenied,
                                           Fault.CHANGED: ObjectChanged, Fault.UNREACHABLE: Unreachable,
                                           Fault.TRANSIENT: RetriesExhausted, Fault.OTHER: StorageError}


class StorageUnavailable(UsageError):
    """The location cannot be reached or authenticated at all (exit 2): wrong endpoint, no credentials, 403 on
    the first listing, no such bucket."""
