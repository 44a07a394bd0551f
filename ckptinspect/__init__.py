"""ckptinspect: inspect and validate distributed training checkpoints offline.

Reads Megatron-LM / Megatron-Core (`torch_dist`, legacy per-rank `torch`) and plain PyTorch DCP checkpoints into one
neutral model without torch, without a process group, and without executing code from the checkpoint.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
