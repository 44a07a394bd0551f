"""The lines `watch` prints, one per event: a JSON object on one line (`-o jsonl`, for log collectors: the envelope
keys, `path`, then the event's keys) or a readable text line (UTC time, event, iteration dir, status, codes).
Returns strings; never prints."""

from __future__ import annotations

import json
import time
from typing import Any

from ckptinspect.commands.watch import Event, EventKind
from ckptinspect.render.json_doc import envelope

_VERB = {
    EventKind.TRACKER_MOVED: "tracker names", EventKind.IN_FLIGHT: "in flight", EventKind.STALLED: "STALLED",
    EventKind.COMPLETE: "complete", EventKind.AUDITED: "audited", EventKind.REMOVED: "removed",
    EventKind.ERROR: "ERROR",
}


def event_doc(event: Event, path: str) -> dict[str, Any]:
    """The JSON object of one event line (docs/schema/watch.schema.json)."""
    return envelope("watch", {"path": path, **event.to_dict()})


def event_json(event: Event, path: str) -> str:
    """One JSON line, ASCII only (names from the save dir escaped)."""
    return json.dumps(event_doc(event, path), ensure_ascii=True, separators=(",", ":"), allow_nan=False)


def event_text(event: Event) -> str:
    """One readable line (no markup; control characters of checkpoint names are the caller's to escape)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(event.time))
    parts = [stamp, _VERB[event.kind]]
    if event.kind is EventKind.TRACKER_MOVED:
        parts.append("nothing (removed)" if event.iteration is None else str(event.iteration))
    if event.name is not None:
        parts.append(event.name)
    if event.status is not None and event.kind is not EventKind.COMPLETE:
        parts.append(event.status.value)
    if event.seconds is not None:
        parts.append(f"unchanged for {event.seconds:.0f} s")
    if event.codes:
        parts.append(" ".join(event.codes))
    if event.message is not None:
        parts.append(event.message)
    return "  ".join(parts)
