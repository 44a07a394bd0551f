"""Fast paths of the streaming `.metadata` reader (placeholder)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckptinspect.formats._stream_walk import Walker


def install_fast_paths(w: Walker) -> None:
    return None
