"""Reader for Megatron-Core `torch_dist` checkpoints (an `iter_*` dir with `metadata.json`).

Generations (reference §0, §3, §4):
- ≤0.18 writes `common.pt` (rank 0, `torch.save`) and a 4-key `metadata.json`.
- ≥0.19 writes no `common.pt`: the common state is the DCP byte item `common_state/shard_0_1`, a `torch.save` of a
  one-element list, and `metadata.json` has 2 keys.
- 0.8–0.15 add `mcore_data` (N-D reformulated DistOpt tensors); 0.15 pickles the root as `MCoreMetadata`.
"""

from __future__ import annotations

import json
from dataclasses import replace
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ckptinspect.errors import UNREAD_CODE, ReadError
from ckptinspect.findings import Finding
from ckptinspect.formats.files import list_files, pickle_findings, read_item_archive
from ckptinspect.io.local import noted, read_small
from ckptinspect.pickling.plain import to_plain
from ckptinspect.pickling.unpickle import PickleReport
from ckptinspect.pickling.torch_archive import read_torch_file
from ckptinspect.formats.args_values import arg_flag, arg_int
from ckptinspect.formats.dcp.reader import read_dcp_dir
from ckptinspect.formats.dcp.stream import SeenMetadata
from ckptinspect.formats.dcp.metadata import DcpMetadata
from ckptinspect.formats.generation import megatron_generation
from ckptinspect.formats.zarr_dir import read_zarr_arrays
from ckptinspect.formats.topology import topology_from
from ckptinspect.model import Checkpoint, Format, ShardedBackend, frozen
from ckptinspect.model.chunk_table import ChunkTable

METADATA_JSON = "metadata.json"
COMMON_PT = "common.pt"
COMMON_STATE_KEY = "common_state/shard_0_1"
KNOWN_BACKENDS = frozenset(b.value for b in ShardedBackend)


def read_metadata_json(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """Parse `metadata.json`: (config, None) or (None, why it is unreadable)."""
    try:
        text = read_small(path / METADATA_JSON, 1 << 20).decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        return None, f"unreadable: {getattr(e, 'strerror', None) or e}"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"not JSON ({e.msg} at line {e.lineno})"
    except RecursionError:
        return None, "not JSON (nesting too deep)"
    if not isinstance(data, dict):
        return None, f"not a JSON object ({type(data).__name__})"
    backend = data.get("sharded_backend")
    if backend not in KNOWN_BACKENDS:
        return None, f"unknown sharded_backend {backend!r}"
    return data, None


def read_torch_dist(path: Path, label: str, seen: SeenMetadata | None = None) -> Checkpoint:
    """Read a Megatron-Core torch_dist checkpoint dir. Never raises for a broken checkpoint. `seen`: what the sniff
    of this read parsed already (`dcp.stream.SeenMetadata`)."""
    d = read_dcp_dir(path, label, seen)
    findings = list(d.findings)
    md = d.metadata
    config, why = read_metadata_json(path)
    if why is not None and (path / METADATA_JSON).exists() and noted(path / METADATA_JSON) is None:
        # (a metadata.json this user may not read is CK209 from `io.local`'s note, not a broken one)
        findings.append(Finding("CK104", f"metadata.json {why}", METADATA_JSON, label))

    zarr = config is not None and config.get("sharded_backend") == "zarr"
    table, objects = (md.table, md.objects) if md else (ChunkTable.empty(), ())
    if zarr:  # ≤0.15 zarr backend: no .metadata, one zarr array dir per tensor key
        table, objects, zarr_findings = read_zarr_arrays(path, label)
        d = replace(d, files=list_files(path, recursive=True))  # the chunk files are the payload
        findings.extend(zarr_findings)
    common, common_source, common_findings = _read_common(path, label, md)
    findings.extend(common_findings)
    if common is None and (md is not None or zarr) and not any(
            f.code in ("CK601", "CK604", "CK206", "CK105", "CK208", "CK603", "CK605", "CK606", UNREAD_CODE)
            for f in common_findings):
        findings.append(
            Finding(
                "CK105",
                "common state missing: no common.pt and no common_state/shard_0_1 item",
                COMMON_PT, label,
            )
        )
    args = common.get("args") if isinstance(common, dict) else None
    args = args if isinstance(args, dict) else None
    iteration = common.get("iteration") if isinstance(common, dict) else None
    if not isinstance(iteration, int):
        iteration = arg_int(args, "iteration")
    topology, layout = topology_from(args, md)
    generation = megatron_generation(config, common_source, md, common)
    extra: dict[str, Any] = {"metadata_json": config, "common_source": common_source,
                             "generation_evidence": list(generation.evidence)}
    if md is not None:
        extra["metadata_root"] = md.root_class
        extra["planner_keys"] = md.planner_keys
        if md.unknown_attrs:
            extra["unknown_metadata_attrs"] = list(md.unknown_attrs)
    return Checkpoint(
        path=label,
        format=Format.TORCH_DIST,
        generation=generation.label,
        iteration=iteration,
        objects=objects,
        files=d.files,
        args=args,
        common={k: v for k, v in common.items() if k != "args"} if isinstance(common, dict) else None,
        topology=topology,
        optimizer_sharding=optimizer_sharding(common, md),
        rank_items=md.rank_items if md else (),
        findings=tuple(findings),
        extra=extra,
        layout=frozen(layout),
        reformulated=tuple(md.mcore_data) if md is not None else (),
        table=table,
        sharded_backend=ShardedBackend(config["sharded_backend"]) if config is not None else None,
    )


def _read_common(
    path: Path, label: str, md: DcpMetadata | None
) -> tuple[dict[str, Any] | None, str | None, list[Finding]]:
    """The common state dict, where it came from (`common.pt` / the byte item), and reading findings."""
    findings: list[Finding] = []
    if (path / COMMON_PT).exists():
        try:
            archive = read_torch_file(path / COMMON_PT)
        except ReadError as e:
            findings.append(Finding(e.code, f"common.pt: {e}", COMMON_PT, label))
            if isinstance(e.report, PickleReport):  # what it referenced / called before failing still counts
                findings.extend(pickle_findings(e.report, COMMON_PT, label))
            return None, COMMON_PT, findings
        findings.extend(pickle_findings(archive.report, COMMON_PT, label))
        if archive.report.unsafe:
            return None, COMMON_PT, findings
        return _as_dict(archive.obj, findings, COMMON_PT, label), COMMON_PT, findings
    if md is None:
        return None, None, findings
    item = next((o for o in md.objects if o.key == COMMON_STATE_KEY), None)
    if item is None:
        return None, None, findings
    if item.storage is None:
        findings.append(Finding("CK304", f"{COMMON_STATE_KEY} has no storage entry", COMMON_STATE_KEY, label))
        return None, COMMON_STATE_KEY, findings
    try:
        archive = read_item_archive(path, item.storage)
    except ReadError as e:
        # The storage checks report missing / truncated files; this says what it costs. An item that cannot be
        # decoded here (CK208: no zstd extra, unknown transform) is not known to be broken: it was not read.
        # One this user may not read (CK209) is not known to be broken either.
        code, what = (e.code, "not read or scanned") if e.code in ("CK208", UNREAD_CODE) else ("CK105", "unreadable")
        findings.append(
            Finding(code, f"common state item {what}: {e}", COMMON_STATE_KEY, label, {"cause": e.code})
        )
        if e.code == "CK606":  # a TorchScript archive: DCP's torch.load would run it (the safety check skips this item)
            findings.append(Finding(e.code, f"{COMMON_STATE_KEY}: {e}", COMMON_STATE_KEY, label))
        if isinstance(e.report, PickleReport):
            findings.extend(pickle_findings(e.report, COMMON_STATE_KEY, label))
        return None, COMMON_STATE_KEY, findings
    findings.extend(pickle_findings(archive.report, COMMON_STATE_KEY, label))
    if archive.report.unsafe:
        return None, COMMON_STATE_KEY, findings  # CK601 says it all; the stand-ins are no state dict
    obj = archive.obj
    # Megatron-Core ≥0.19 saves `torch.save([common_state_dict])` (strategies/torch.py:317-322).
    if isinstance(obj, list) and len(obj) == 1:
        obj = obj[0]
    return _as_dict(obj, findings, COMMON_STATE_KEY, label), COMMON_STATE_KEY, findings


def _as_dict(obj: Any, findings: list[Finding], subject: str, label: str) -> dict[str, Any] | None:
    try:
        plain = to_plain(obj)
    except ReadError as e:
        findings.append(Finding(e.code, f"{subject}: {e}", subject, label))
        return None
    if not isinstance(plain, dict):
        findings.append(
            Finding("CK105", f"{subject} holds a {type(plain).__name__}, not a state dict", subject, label)
        )
        return None
    return plain


def optimizer_sharding(common: Mapping[str, Any] | None, md: DcpMetadata | None) -> str | None:
    """The DistributedOptimizer sharding type (reference §4.3).

    `content_metadata.distrib_optim_sharding_type` (≥0.13) → `optimizer.param_state_sharding_type` in the common
    state → inferred from the keys: ``optimizer.distributed.*`` tensors with no content metadata (<0.13) are
    `fully_sharded_model_space` if `ckpt_fully_parallel_save` else `dp_zero_gather_scatter` (checkpointing.py
    :2620-2631); ``optimizer.state.*`` keys only = a regular or fully reshardable optimizer.
    """
    if isinstance(common, dict):
        cm = common.get("content_metadata")
        if isinstance(cm, dict) and isinstance(cm.get("distrib_optim_sharding_type"), str):
            return str(cm["distrib_optim_sharding_type"])
        opt = common.get("optimizer")
        if isinstance(opt, dict) and isinstance(opt.get("param_state_sharding_type"), str):
            return str(opt["param_state_sharding_type"])
    if md is None:
        return None
    keys = [t.key for t in md.tensors]
    if any(k.startswith("optimizer.distributed.") or ".optimizer.distributed." in k for k in keys):
        args = common.get("args") if isinstance(common, dict) else None
        fps = arg_flag(args if isinstance(args, dict) else None, "ckpt_fully_parallel_save")
        return "fully_sharded_model_space" if fps else "dp_zero_gather_scatter"
    if any(k.startswith("optimizer.state.") for k in keys):
        return "model_space"
    return None
