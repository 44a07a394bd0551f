"""Slow a real save down, or stop it at chosen points, from outside the libraries that write it.

Used by ``tests/unit/formats/test_inflight.py``: a real megatron-core save (``tools/make_sample_ckpts.py``) runs in worker
processes; with ``CKPTINSPECT_WRITE_GATE`` set in their environment, ``tools/_mcore_cpu.worker_entry`` calls
:func:`install` before anything is written. The gate wraps the Python-level file opens the save goes through —
``builtins.open`` (Megatron-Core's ``.distcp`` writer, ``metadata.json``, the tracker), ``io.open`` (torch DCP's
``.metadata.tmp`` via ``Path.open``) and ``torch.save`` to a path (``common.pt``: routed through the gated
``open``, the same zip archive torch writes to a path) — for files whose path contains the watched text (the
iteration being written, the tracker). Forked writer processes (Megatron's ``write_preloaded_data_multiproc``)
inherit it. Nothing else changes: the bytes come from the libraries, in their order.

``CKPTINSPECT_WRITE_GATE`` is a JSON object:

* ``watch``: list of substrings; a written path containing one of them is gated.
* ``stops``: ``[[name_regex, at], ...]``, fired strictly in this order. ``at`` null: stop just before the file is
  created; an int: stop once that many bytes (characters, for text files) of it are written, the prefix flushed to
  disk. A stop writes ``{"pid", "index", "name", "at"}`` to ``<dir>/stop-<index>.json`` and sends SIGSTOP to its
  own process; the test inspects the dir and sends SIGCONT. The marker files are the record of what fired, shared
  by the rank process and its forked writers.
* ``slow``: ``{name_regex: seconds}``: sleep that long before every write to a matching file (``"open"``: before
  every gated open), so a poller sees each intermediate state.
* ``dir``: where the stop markers go (outside the save dir).
"""

from __future__ import annotations

import builtins
import io
import json
import os
import re
import signal
import time
from typing import Any

ENV = "CKPTINSPECT_WRITE_GATE"

_real_open = builtins.open
_config: dict[str, Any] = {}


def _gated(path: Any, mode: str) -> bool:
    if not any(c in mode for c in "wax+"):
        return False
    try:
        text = os.fspath(path)
    except TypeError:
        return False
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return any(w in text for w in _config.get("watch", ()))


def _marker(index: int) -> str:
    return os.path.join(_config["dir"], f"stop-{index}.json")


def _stop(index: int, name: str, at: Any) -> None:
    marker = _marker(index)
    tmp = marker + ".tmp"
    with _real_open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), "index": index, "name": name, "at": at}, f)
    os.replace(tmp, marker)
    os.kill(os.getpid(), signal.SIGSTOP)


def _next_stop(name: str, opening: bool) -> tuple[int, Any] | None:
    """The first stop not fired yet, when it applies to this file and this moment (open or write)."""
    for i, (pattern, at) in enumerate(_config.get("stops", ())):
        if os.path.exists(_marker(i)):
            continue
        if re.search(pattern, name) and (at is None) == opening:
            return i, at
        return None
    return None


def _delay(name: str, key: str | None = None) -> None:
    for pattern, seconds in _config.get("slow", {}).items():
        if (key is not None and pattern == key) or (key is None and pattern != "open" and re.search(pattern, name)):
            time.sleep(float(seconds))
            return


class _GatedFile:
    """A file object whose writes are slowed or stopped at byte offsets; everything else is the real file's."""

    def __init__(self, f: Any, name: str) -> None:
        self._f = f
        self._name = name
        self._written = 0

    def write(self, data: Any) -> int:
        _delay(self._name)
        total = len(data)
        done = 0
        while True:
            stop = _next_stop(self._name, opening=False)
            if stop is None or stop[1] >= self._written + (total - done):
                break
            index, at = stop
            cut = max(at - self._written, 0)
            if cut:
                self._f.write(data[done:done + cut])
                done += cut
                self._written += cut
            self._f.flush()
            _stop(index, self._name, at)
        if done < total:
            self._f.write(data[done:])
            self._written += total - done
        return total

    def __enter__(self) -> _GatedFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._f.close()

    def __iter__(self) -> Any:
        return iter(self._f)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def _open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
    if not _gated(file, mode):
        return _real_open(file, mode, *args, **kwargs)
    name = os.path.basename(os.fspath(file) if not isinstance(file, int) else str(file))
    if isinstance(name, bytes):
        name = name.decode("utf-8", "replace")
    _delay(name, "open")
    stop = _next_stop(name, opening=True)
    if stop is not None:
        _stop(stop[0], name, None)
    return _GatedFile(_real_open(file, mode, *args, **kwargs), name)


def install() -> None:
    """Read ``CKPTINSPECT_WRITE_GATE`` and wrap the opens (no-op without it). Call before anything is written."""
    raw = os.environ.get(ENV)
    if not raw or _config:
        return
    _config.update(json.loads(raw))
    builtins.open = _open
    io.open = _open
    import torch

    real_save = torch.save

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(f, (str, os.PathLike)) and _gated(f, "wb"):
            with _open(f, "wb") as stream:
                return real_save(obj, stream, *args, **kwargs)
        return real_save(obj, f, *args, **kwargs)

    torch.save = save
