"""The one exception tree of ckptinspect.

A broken checkpoint is never an exception that reaches the user: readers and checks turn it into findings. These
exceptions are for the tool's own boundaries: a usage problem (the CLI maps it to exit 2) or a reader that cannot
go on (caught by the caller and turned into a finding).
"""

from __future__ import annotations


class CkptInspectError(Exception):
    """Root of every exception ckptinspect raises on purpose."""


class UsageError(CkptInspectError):
    """The user asked for something impossible: a path that does not exist, a bad option value (exit 2)."""


class ReadError(CkptInspectError):
    """A checkpoint file could not be read or decoded; callers turn it into a finding.

    `code` is the finding code the caller should report (e.g. ``CK106`` for an unreadable `.metadata`).
    """

    def __init__(self, message: str, code: str = "CK206") -> None:
        super().__init__(message)
        self.code = code
        # What the pickles read before the failure referenced and called (a `PickleReport`), or None: a pickle that
        # calls `os.system` and then fails to parse is unsafe, not merely corrupt.
        self.report: object | None = None


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
