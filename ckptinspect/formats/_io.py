"""Opening checkpoint files safely: never block on a FIFO or device, never read an unbounded amount of text.

Every reader opens files through `open_regular`: the open itself is non-blocking (a FIFO in place of `.metadata`
would otherwise hang the tool forever), and anything that is not a regular file is refused with an `OSError`.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open a regular file for binary reading (symlinks followed). Raises `OSError` for anything else."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_small(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of a small regular file; `OSError` (EFBIG) when it holds more than `limit` bytes."""
    with open_regular(path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", os.fspath(path))
    return data
