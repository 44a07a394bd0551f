"""The progress callback type shared by long-running work (`audit --deep`, hashing) and the CLI's progress bar.

It lives at the bottom of the import graph so that neither the checks nor the manifest code import each other for it.
"""

from __future__ import annotations

from collections.abc import Callable

# progress(advance_bytes, total_bytes, description): called by long-running checks (`--deep`, hashing).
ProgressHook = Callable[[int, int, str], None]
