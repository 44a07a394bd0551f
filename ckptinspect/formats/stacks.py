"""Training stacks around a Megatron / DCP payload: what wrote the checkpoint, and that stack's own completeness.

- Megatron-Bridge (megatron/bridge/training/checkpointing.py `save_checkpoint`, 0.3-0.6): `iter_N/` = torch_dist
  payload + `train_state.pt` + `run_config.yaml` (+ `tokenizer/`); the save root holds `latest_train_state.pt` and the
  Megatron tracker. Write order: payload (metadata.json last) → train_state.pt → latest_train_state.pt → tracker →
  run_config.yaml → tokenizer assets. The common state has no `args`: without run_config.yaml Bridge's load falls
  back to `_extract_megatron_lm_args_from_state_dict`, which raises ("Legacy checkpoint missing 'args'").
- NeMo 2 (nemo/lightning/ckpt_utils.py, io/pl.py, pytorch/callbacks/model_checkpoint.py): `<ckpt>/weights/` =
  torch_dist payload, `<ckpt>/context/` (`io.json`, `model.yaml`); the sibling file `<ckpt>-unfinished` exists while
  a save (or a removal) runs, and NeMo deletes such checkpoints on the next start.
- torchtitan vs Megatron FSDP (`fsdp_dtensor`): both plain DCP without metadata.json; told apart by their keys
  (torchtitan's CheckpointManager flattens model keys to the top level and adds `train_state.*` / `lr_scheduler.*`;
  Megatron FSDP keys are `model.module.*`, `optimizer.state.module.*`, `optimizer.param_to_group_meta.*`).
- Per-DP-rank dataloader state (Bridge `energon/`, torchtitan `dataloader.dp_rank_*`): `formats/dataloader_state.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ckptinspect.errors import ReadError
from ckptinspect.findings import Finding
from ckptinspect.formats.dataloader_state import bridge_dataloader, titan_dataloader
from ckptinspect.formats.files import pickle_findings
from ckptinspect.formats.megatron_fsdp import fsdp_enrich
from ckptinspect.formats.savedir import join_label
from ckptinspect.formats.run_config import RUN_CONFIG, args_from_run_config, load_run_config
from ckptinspect.formats.topology import topology_from
from ckptinspect.model import Checkpoint, Format, Stack
from ckptinspect.pickling.builders import TensorRef
from ckptinspect.pickling.plain import to_plain
from ckptinspect.io.local import note_unread, open_regular
from ckptinspect.pickling.torch_archive import read_torch_file

TRAIN_STATE = "train_state.pt"
LATEST_TRAIN_STATE = "latest_train_state.pt"
NEMO_WEIGHTS = "weights"
NEMO_CONTEXT = "context"
UNFINISHED = "-unfinished"
FSDP_PREFIXES = ("model.module.", "optimizer.state.module.", "optimizer.param_to_group_meta.")
TITAN_PREFIXES = ("train_state.", "lr_scheduler.", "dataloader.")
_HF_TOKENIZERS = frozenset({"HuggingFaceTokenizer", "MultimodalTokenizer"})


@dataclass(frozen=True, slots=True)
class OuterLayout:
    """A stack's dir around a payload: which stack, where the payload is, the evidence."""

    stack: Stack
    payload: Path
    evidence: tuple[str, ...]


def unfinished_marker(ckpt: Path) -> Path:
    """NeMo's `format_checkpoint_unfinished_marker_path`: `<ckpt>` minus `.ckpt` / `-EMA`, plus `-unfinished`."""
    name = ckpt.name.removesuffix(".ckpt").removesuffix("-EMA")
    return ckpt.with_name(name + UNFINISHED)


def is_nemo2_dir(path: Path) -> bool:
    try:
        return (path / NEMO_WEIGHTS).is_dir() and ((path / NEMO_CONTEXT).is_dir() or unfinished_marker(path).exists()
                                                    or (path / NEMO_WEIGHTS / "metadata.json").exists()
                                                    or (path / NEMO_WEIGHTS / ".metadata").exists())
    except OSError as e:  # a dir it may not enter: not known to be one (CK209 from the note)
        note_unread(path, e, "enter")
        return False


def is_bridge_dir(path: Path) -> bool:
    return ((path / RUN_CONFIG).exists() or (path / TRAIN_STATE).exists()
            or (path.parent / LATEST_TRAIN_STATE).exists())


def outer_layout(path: Path) -> OuterLayout | None:
    """The stack layout of checkpoint dir `path` (NeMo 2, Megatron-Bridge), or None for a bare payload."""
    try:
        if not path.is_dir():
            return None
        if is_nemo2_dir(path):
            ev = ["weights/ (torch_dist payload) + context/: NeMo 2 checkpoint (nemo/lightning/ckpt_utils.py)"]
            if unfinished_marker(path).exists():
                ev.append(f"{unfinished_marker(path).name} marker present (NeMo ModelCheckpoint: save not finished)")
            return OuterLayout(Stack.NEMO2, path / NEMO_WEIGHTS, tuple(ev))
        if is_bridge_dir(path):
            found = [n for n in (RUN_CONFIG, TRAIN_STATE) if (path / n).exists()]
            if (path.parent / LATEST_TRAIN_STATE).exists():
                found.append(f"../{LATEST_TRAIN_STATE}")
            return OuterLayout(Stack.MEGATRON_BRIDGE, path,
                               (f"Megatron-Bridge files: {', '.join(found)} (Megatron-LM writes none of them)",))
    except OSError:
        return None
    return None


def classify_dcp_keys(keys: Sequence[str]) -> tuple[Stack | None, str | None]:
    """torchtitan or Megatron FSDP from the DCP keys, with the reason; (None, None) when neither is evident."""
    fsdp = [k for k in keys if k.startswith(FSDP_PREFIXES)]
    if fsdp:
        return Stack.MEGATRON_FSDP, (f"{len(fsdp)} key(s) with Megatron FSDP prefixes (model.module., "
                                     "optimizer.state.module., optimizer.param_to_group_meta.): fsdp_dtensor")
    titan = [k for k in keys if k.startswith(TITAN_PREFIXES)]
    if titan and not any(k.startswith("model.") for k in keys):
        return Stack.TORCHTITAN, (f"torchtitan CheckpointManager keys: model keys at top level (no 'model.' "
                                  f"prefix) plus {', '.join(sorted({k.split('.', 1)[0] for k in titan}))}.*")
    return None, None


def enrich(ckpt: Checkpoint, path: Path, label: str, layout: OuterLayout | None, *, payload_complete: bool) -> Checkpoint:
    """Add the stack (evidence, facts, completeness findings) to a checkpoint read from its payload.
    `payload_complete`: the payload's markers say its save finished (sniff state complete)."""
    if layout is None:
        if ckpt.format in (Format.TORCH_DCP, Format.FSDP_DTENSOR):
            stack, why = classify_dcp_keys([t.key for t in ckpt.tensors] + [o.key for o in ckpt.objects])
            if stack is Stack.MEGATRON_FSDP and why is not None:
                return _with(fsdp_enrich(ckpt, path, label), stack, (why,), ())
            if stack is Stack.TORCHTITAN and why is not None:
                state, found = titan_dataloader(ckpt, path, label)
                return _with(ckpt, stack, (why,), found, dataloader=state)
            if stack is not None and why is not None:
                return _with(ckpt, stack, (why,), ())
        return ckpt
    if layout.payload != path:
        # the payload's files (and its integrity.json) are in a sub-dir: the model says where, so no check or service
        # looks for them in the stack's dir (NeMo 2: `<ckpt>/weights/`)
        ckpt = replace(ckpt, data_dir=join_label(label, layout.payload.relative_to(path).as_posix()))
    if layout.stack is Stack.NEMO2:
        return _nemo2(ckpt, path, label, layout)
    return _bridge(ckpt, path, label, layout, payload_complete)


def _with(ckpt: Checkpoint, stack: Stack, evidence: tuple[str, ...], findings: Sequence[Finding],
          **changes: Any) -> Checkpoint:
    extra = dict(ckpt.extra)
    extra["stack"] = stack.value
    extra["evidence"] = list(evidence) + list(extra.get("evidence", []))
    return replace(ckpt, findings=tuple(findings) + ckpt.findings, extra=extra, **changes)


def _nemo2(ckpt: Checkpoint, path: Path, label: str, layout: OuterLayout) -> Checkpoint:
    findings: list[Finding] = []
    marker = unfinished_marker(path)
    if marker.exists():
        findings.append(Finding("CK507", f"{marker.name} exists: NeMo 2 was still saving (or deleting) this "
                                "checkpoint; NeMo removes it at the next start and never resumes from it",
                                marker.name, label))
    if not (path / NEMO_CONTEXT / "io.json").exists() and not marker.exists():
        findings.append(Finding("CK121", "NeMo 2 checkpoint without context/io.json: the model and trainer "
                                "config cannot be restored (nemo.lightning.io.load_context)", "context/io.json", label))
    changes: dict[str, Any] = {"path": label}
    model_yaml = path / NEMO_CONTEXT / "model.yaml"
    if ckpt.args is None and model_yaml.is_file():
        try:
            cfg = load_run_config(model_yaml, "CK121")
        except ReadError as e:
            findings.append(Finding("CK121", str(e), "context/model.yaml", label))
        else:
            # context/model.yaml is the model config (TransformerConfig names = Megatron arg names)
            args = args_from_run_config({"model": cfg})
            # the payload's on-disk witnesses (plans, rng grid) still count: they give the world size, hence DP
            topology, _ = topology_from(args, None, ckpt.layout)
            changes.update(args=args, topology=topology)
    out = _with(ckpt, Stack.NEMO2, layout.evidence, findings, **changes)
    if "args" in changes:
        out = replace(out, extra={**out.extra, "args_source": "context/model.yaml"})
    return out


def _bridge(ckpt: Checkpoint, path: Path, label: str, layout: OuterLayout, payload_complete: bool) -> Checkpoint:
    findings: list[Finding] = []
    extra_changes: dict[str, Any] = {}
    complete_payload = ckpt.format is Format.TORCH_DIST and payload_complete
    has_ts = (path / TRAIN_STATE).exists()
    has_rc = (path / RUN_CONFIG).exists()
    if complete_payload and not has_ts:
        findings.append(Finding("CK508", "Megatron-Bridge save stopped after the payload (metadata.json written) "
                                f"but before {TRAIN_STATE}: the tracker was not updated for it", TRAIN_STATE, label))
    elif has_ts and not has_rc:
        findings.append(Finding("CK509", f"Megatron-Bridge save stopped after {TRAIN_STATE} but before {RUN_CONFIG} "
                                "(written after the tracker): Bridge's load needs it for TP/PP and finds no args "
                                "in the common state", RUN_CONFIG, label))
    if has_ts:
        findings.extend(_check_train_state(path / TRAIN_STATE, label))
    args = ckpt.args
    config: dict[str, Any] | None = None
    if has_rc:
        try:
            config = load_run_config(path / RUN_CONFIG)
        except ReadError as e:
            findings.append(Finding(e.code, str(e), RUN_CONFIG, label))
    if config is not None:
        if args is None:
            args = args_from_run_config(config)
            # run_config.yaml's model and parallelism, with the payload's on-disk witnesses (plans, rng grid) for
            # what it does not say: the world size, hence DP
            topology, layout_w = topology_from(args, None, ckpt.layout)
            topology = replace(topology, sources={**ckpt.topology.sources,
                                                  **{k: RUN_CONFIG if v == "args" else v
                                                     for k, v in topology.sources.items()}})
            extra_changes.update(args=args, topology=topology)
        tok = config.get("tokenizer")
        save_tok = (config.get("checkpoint") or {}).get("save_tokenizer_assets") if isinstance(
            config.get("checkpoint"), dict) else None
        if (save_tok and isinstance(tok, dict) and _tokenizer_has_files(tok) and not (path / "tokenizer").is_dir()):
            findings.append(Finding("CK510", "run_config.yaml asks for tokenizer assets (save_tokenizer_assets) "
                                    "but tokenizer/ is missing: the save stopped after run_config.yaml",
                                    "tokenizer", label))
    # the Energon sidecars against the DP just derived (run_config.yaml's, when the common state has no args)
    state, found = bridge_dataloader(replace(ckpt, **extra_changes), path, label, config)
    findings.extend(found)
    out = _with(ckpt, Stack.MEGATRON_BRIDGE, layout.evidence, findings, dataloader=state, **extra_changes)
    extra = dict(out.extra)
    if config is not None:
        extra["args_source"] = RUN_CONFIG if ckpt.args is None else "common state"
        extra["run_config_targets"] = sorted({str(v.get("_target_")) for v in config.values()
                                              if isinstance(v, dict) and "_target_" in v})
    return replace(out, extra=extra)


def train_state_step(path: Path) -> int | None:
    """`step` of a Bridge `train_state.pt` / `latest_train_state.pt` (a 0-d int tensor), read from the archive bytes
    without torch; None when the file is absent, hostile, or not that shape."""
    try:
        archive = read_torch_file(path)
    except (ReadError, OSError):
        return None
    obj = archive.obj
    if archive.report.dangerous or not isinstance(obj, dict):
        return None
    ref = obj.get("step")
    size = {"int32": 4, "int64": 8}.get(getattr(ref, "dtype", ""), 0)
    if not isinstance(ref, TensorRef) or ref.shape != () or not size or ref.storage_key is None:
        return None
    rec = archive.records.get(f"data/{ref.storage_key}")
    if rec is None or rec.compressed or rec.data_offset < 0 or rec.size < (ref.storage_offset + 1) * size:
        return None
    try:
        with open_regular(path) as f:
            f.seek(rec.data_offset + ref.storage_offset * size)
            raw = f.read(size)
    except OSError:
        return None
    return int.from_bytes(raw, "little", signed=True) if len(raw) == size else None


def _tokenizer_has_files(tok: dict[str, Any]) -> bool:
    """Bridge `save_tokenizer_assets` writes files for HF tokenizers and file-based ones (vocab/merges/model)."""
    if tok.get("tokenizer_type") in _HF_TOKENIZERS:
        return True
    return any(isinstance(tok.get(k), str) and tok.get(k) for k in ("vocab_file", "merge_file", "tokenizer_model"))


def _check_train_state(path: Path, label: str) -> list[Finding]:
    try:
        archive = read_torch_file(path)
    except ReadError as e:
        return [Finding(e.code, f"{TRAIN_STATE}: {e}", TRAIN_STATE, label)]
    except OSError as e:
        return [Finding("CK206", f"{TRAIN_STATE}: unreadable ({e.strerror or e})", TRAIN_STATE, label)]
    out = pickle_findings(archive.report, TRAIN_STATE, label)
    if archive.report.dangerous:
        return out
    try:
        plain = to_plain(archive.obj)
    except ReadError as e:
        return out + [Finding(e.code, f"{TRAIN_STATE}: {e}", TRAIN_STATE, label)]
    if not isinstance(plain, dict) or "step" not in plain:
        out.append(Finding("CK122", f"{TRAIN_STATE} is not Bridge's TrainState dict (no 'step')", TRAIN_STATE, label))
    return out
