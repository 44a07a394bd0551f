"""Acceptance cases: `audit --values` (CK901-CK911) and `audit --all --values` (CK524) on real megatron-core 0.16.1
saves whose faults were put into the model / optimizer before the save (tests/data/values_ckpts, its README says
where each fault is), and on copies of the DCP sample with one damage to its metadata (edited with torch's own DCP
classes) or its data.

Part of the corpus gathered in `tests/support/corpus.py`."""

from __future__ import annotations

from pathlib import Path

from corpus_kit import DCP, Case, Ctx, S, copy_source, edit_metadata

VALUE_CODES = S({f"CK9{n:02d}" for n in range(1, 20)})
WO_SQ = "optimizer.state.layers.0.wo.weight.exp_avg_sq"


def sample(name: str) -> tuple[str, ...]:
    return (f"values_{name}",)


def save_dir(name: str):  # type: ignore[no-untyped-def]
    return lambda ctx: copy_source(ctx, f"values_{name}")


def _dcp(ctx: Ctx) -> Path:
    return copy_source(ctx, "dcp") / "step-10"


def truncated_item(ctx: Ctx) -> Path:
    """A data file cut to a third: the chunks past the cut cannot be read (their values not scanned)."""
    ckpt = _dcp(ctx)
    f = ckpt / "__1_0.distcp"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])
    return ckpt


def missing_moment(ctx: Ctx) -> Path:
    """One parameter's exp_avg_sq not in the checkpoint (a writer that dropped a piece of optimizer state)."""
    ckpt = _dcp(ctx)
    with edit_metadata(ckpt) as md:
        del md.state_dict_metadata[WO_SQ]
        for k in [k for k in md.storage_data if k.fqn == WO_SQ]:
            del md.storage_data[k]
    return ckpt



def complex_tensor(ctx: Ctx) -> Path:
    """A real `dcp.save` holding a complex64 tensor beside a float one: its values are not decoded."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    out = ctx.work / "complex"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore")
        dcp.save({"model.freqs": torch.polar(torch.ones(8, 4), torch.randn(8, 4)), "model.w": torch.randn(4, 4)},
                 storage_writer=dcp.FileSystemWriter(str(out)), no_dist=True)
    return out


V = ("--values",)
VALUES_CASES: tuple[Case, ...] = (
    Case("values_weight_faults", save_dir("weights"), "corrupt", S({"CK901", "CK902", "CK903", "CK905"}), flags=V,
         sources=sample("weights")),
    Case("values_weight_faults_metadata_level", save_dir("weights"), "complete", absent=VALUE_CODES,
         sources=sample("weights")),
    Case("values_moment_faults", save_dir("moments"), "corrupt", S({"CK904", "CK906"}), flags=V,
         sources=sample("moments")),
    Case("values_bf16_desync", save_dir("desync"), "corrupt", S({"CK911"}), flags=V, sources=sample("desync")),
    Case("values_healthy", save_dir("healthy_tp2"), "complete", absent=VALUE_CODES, flags=V,
         sources=sample("healthy_tp2")),
    Case("values_stale_save", save_dir("stale_lr0"), "complete", S({"CK524"}), absent=VALUE_CODES,
         flags=("--all", "--values"), sources=sample("stale_lr0")),
    Case("values_truncated_data_file", truncated_item, "corrupt", S({"CK908", "CK202"}), flags=V, sources=DCP),
    Case("values_missing_second_moment", missing_moment, "corrupt", S({"CK910"}), flags=V, sources=DCP),
    Case("values_complex_dtype", complex_tensor, "complete", S({"CK909"}), flags=V),
)
