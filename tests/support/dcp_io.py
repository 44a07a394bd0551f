"""Real torch DCP writes and reads for tests: `save_dcp` (single-process `dcp.save`, one chunk per tensor) and
`load_dcp` (every tensor of a DCP / torch_dist dir read back by torch into CPU tensors). Import only where torch is."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata


def save_dcp(path: Path, state: dict[str, Any]) -> Path:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path)), no_dist=True)
    return path


def load_dcp(path: Path) -> dict[str, Any]:
    md = dcp.FileSystemReader(str(path)).read_metadata()
    state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in md.state_dict_metadata.items()
             if isinstance(m, TensorStorageMetadata)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore")
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(path)), no_dist=True)
    return state
