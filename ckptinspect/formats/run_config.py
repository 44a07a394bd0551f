"""Megatron-Bridge `run_config.yaml`: parsed with PyYAML's *safe* loader, never instantiated.

Bridge writes it with `ConfigContainer.to_yaml` (megatron/bridge/training/utils/config_utils.py: `yaml.safe_dump` of
`to_dict()`); every section and every callable carries a `_target_` (a Python import path) and sometimes `_call_` /
`_partial_`, which Bridge's own loader would import and call. Here they stay strings: the safe loader builds only
dicts, lists and scalars (python/* tags are refused), so nothing in the file is imported or run.

Why PyYAML (a core dependency, `pyyaml>=6,<7`): it is small, has wheels everywhere, and its `SafeLoader` is the
reference YAML 1.1 reader Bridge itself writes with; a hand-written subset parser would misread anchors, flow style,
multi-line strings or tags that a user's edited config may hold. Size and nesting are bounded before and after.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ckptinspect.errors import ReadError
from ckptinspect.io.local import read_small

RUN_CONFIG = "run_config.yaml"
MAX_RUN_CONFIG_BYTES = 8 << 20
MAX_NODES = 200_000
MAX_DEPTH = 64

# run_config section → the Megatron argument names its fields stand for (Bridge uses TransformerConfig names for the
# model, which are Megatron's arg names; a few other sections rename them).
_RENAMES: Mapping[str, Mapping[str, str]] = {
    "checkpoint": {"fully_parallel_save": "ckpt_fully_parallel_save", "fully_parallel_load": "ckpt_fully_parallel_load"},
    "rng": {},
    "train": {},
    "optimizer": {},
    "ddp": {},
    "scheduler": {},
    "dataset": {"sequence_length": "seq_length"},
}
_SECTIONS = ("checkpoint", "dataset", "scheduler", "ddp", "optimizer", "train", "rng", "model")  # later ones win


def load_run_config(path: Path, code: str = "CK120") -> dict[str, Any]:
    """Parse `path` safely. Raises `ReadError` (`code`) when it is unreadable, not YAML or not a mapping."""
    try:
        return _load(path)
    except ReadError as e:
        raise ReadError(str(e).replace(RUN_CONFIG, path.name), code) from e


def _load(path: Path) -> dict[str, Any]:
    try:
        import yaml
    except ImportError as e:  # pragma: no cover - a core dependency
        raise ReadError("PyYAML is not installed: cannot read run_config.yaml", "CK120") from e
    try:
        text = read_small(path, MAX_RUN_CONFIG_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ReadError(f"{RUN_CONFIG} unreadable: {getattr(e, 'strerror', None) or e}", "CK120") from e
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        data = yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader: plain data only
    except yaml.YAMLError as e:
        raise ReadError(f"{RUN_CONFIG} is not safe plain YAML ({str(e).splitlines()[0]})", "CK120") from e
    except RecursionError as e:
        raise ReadError(f"{RUN_CONFIG} nests too deeply", "CK120") from e
    if not isinstance(data, dict):
        raise ReadError(f"{RUN_CONFIG} holds a {type(data).__name__}, not a mapping of sections", "CK120")
    _bound(data)
    return data


def _bound(data: Any) -> None:
    """Reject alias bombs and deep nesting (YAML anchors share nodes, so a small file can be a huge graph)."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    seen = 0
    while stack:
        obj, depth = stack.pop()
        seen += 1
        if seen > MAX_NODES or depth > MAX_DEPTH:
            raise ReadError(f"{RUN_CONFIG} exceeds {MAX_NODES} nodes or depth {MAX_DEPTH}", "CK120")
        if isinstance(obj, dict):
            stack.extend((v, depth + 1) for v in obj.values())
        elif isinstance(obj, list):
            stack.extend((v, depth + 1) for v in obj)


def _value(v: Any) -> Any:
    """A `_target_` node becomes its import path as a string (`<torch.float32>`); plain values stay."""
    if isinstance(v, dict) and isinstance(v.get("_target_"), str):
        return f"<{v['_target_']}>"
    return v


def args_from_run_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Megatron-style args (flat, arg names) from a Bridge run config, for info / diff / resume."""
    args: dict[str, Any] = {}
    for section in _SECTIONS:
        sec = cfg.get(section)
        if not isinstance(sec, dict):
            continue
        renames = _RENAMES.get(section, {})
        for k, v in sec.items():
            if not isinstance(k, str) or k.startswith("_"):
                continue
            args[renames.get(k, k)] = _value(v)
    model = cfg.get("model")
    if isinstance(model, dict):
        tp = model.get("tensor_model_parallel_size")
        if isinstance(tp, int) and "vocab_size" in model:
            args.setdefault("padded_vocab_size", model["vocab_size"])
    ckpt = cfg.get("checkpoint")
    if isinstance(ckpt, dict) and isinstance(ckpt.get("ckpt_format"), str):
        args["ckpt_format"] = ckpt["ckpt_format"]
    return args
