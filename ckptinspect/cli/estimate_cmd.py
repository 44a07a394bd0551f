"""`ckptinspect estimate`: what a save will cost before the job runs (`register(app)` adds it to the typer app).

Thin shell over `ckptinspect.api.estimate`: parse options (a description into a `GptDescription`), call it, render
(text / json, and `--svg FILE` for the per-rank write-volume chart). Exit 0; 2 for options that cannot describe a job.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ckptinspect.cli.shell import DebugOpt, Output, OutputOpt, emit_result, guarded, only
from ckptinspect.results import EstimateResult

Int = Optional[int]


class FormatChoice(str, enum.Enum):
    TORCH_DIST = "torch_dist"
    TORCH = "torch"


class OptimizerChoice(str, enum.Enum):
    ADAM = "adam"
    SGD = "sgd"


class ShardingChoice(str, enum.Enum):
    DP_RESHARDABLE = "dp_reshardable"
    FULLY_RESHARDABLE = "fully_reshardable"


def _panel(title: str) -> Callable[..., Any]:
    """`typer.Option` shown under `title` in `--help` (the command has many options)."""

    def option(*decls: str, **kw: Any) -> Any:
        return typer.Option(*decls, rich_help_panel=title, **kw)

    return option


_SRC = _panel("Model source")
_DESC = _panel("Model description (exact form)")
_TOPO = _panel("Target topology")
_SAVE = _panel("Save")
_COST = _panel("Cost assumptions (decimal GB/s)")


def register(app: typer.Typer) -> None:
    """Add the `estimate` command to `app`."""
    app.command("estimate")(estimate)


def estimate(  # noqa: PLR0913 - one option per knob of the arithmetic, as the issue lists them
    params: Annotated[Optional[float], _SRC("--params", help="quick form: parameter count (7.5e9)")] = None,
    from_: Annotated[Optional[Path], _SRC("--from", help="exact form: read the model from a torch_dist "
                                                  "checkpoint (or save dir)")] = None,
    layers: Annotated[Int, _DESC("--layers", help="description: decoder layers")] = None,
    hidden: Annotated[Int, _DESC("--hidden", help="description: hidden size")] = None,
    ffn_hidden: Annotated[Int, _DESC("--ffn-hidden", help="description: MLP size (default 4 x hidden)")] = None,
    heads: Annotated[Int, _DESC("--heads", help="description: attention heads")] = None,
    kv_heads: Annotated[Int, _DESC("--kv-heads", help="description: query groups (GQA)")] = None,
    kv_channels: Annotated[Int, _DESC("--kv-channels", help="description: head dim")] = None,
    vocab: Annotated[Int, _DESC("--vocab", help="description: vocabulary (padded like Megatron)")] = None,
    vocab_divisible_by: Annotated[int, _DESC("--make-vocab-size-divisible-by")] = 128,
    experts: Annotated[int, _DESC("--experts", help="description: MoE experts (0 = dense)")] = 0,
    moe_ffn_hidden: Annotated[Int, _DESC("--moe-ffn-hidden", help="description: expert MLP size")] = None,
    moe_layer_freq: Annotated[int, _DESC("--moe-layer-freq", help="every n-th layer is MoE")] = 1,
    swiglu: Annotated[bool, _DESC("--swiglu/--no-swiglu", help="description: gated linear unit")] = False,
    tied: Annotated[bool, _DESC("--tied-embeddings/--untied-embeddings")] = False,
    rmsnorm: Annotated[bool, _DESC("--rmsnorm/--layernorm", help="description: norm type")] = False,
    bias: Annotated[bool, _DESC("--bias/--no-bias", help="description: --add-bias-linear")] = True,
    max_position: Annotated[int, _DESC("--learned-positions", help="description: learned position "
                                              "table size (0 = RoPE)")] = 0,
    dtype: Annotated[str, _SRC("--dtype", help="dtype of the saved weights")] = "bfloat16",
    tp: Annotated[Int, _TOPO("--tp")] = None,
    pp: Annotated[Int, _TOPO("--pp")] = None,
    dp: Annotated[Int, _TOPO("--dp")] = None,
    ep: Annotated[Int, _TOPO("--ep")] = None,
    etp: Annotated[Int, _TOPO("--etp", help="expert tensor parallel (default TP)")] = None,
    cp: Annotated[Int, _TOPO("--cp")] = None,
    vpp: Annotated[Int, _TOPO("--vpp", help="virtual pipeline chunks per stage")] = None,
    gpus_per_node: Annotated[int, _TOPO("--gpus-per-node")] = 8,
    fmt: Annotated[FormatChoice, _SAVE("--format", help="torch_dist | torch (legacy)")] =
    FormatChoice.TORCH_DIST,
    fully_parallel: Annotated[Optional[bool], _SAVE("--fully-parallel/--no-fully-parallel")] = None,
    async_save: Annotated[bool, _SAVE("--async/--sync")] = False,
    distopt: Annotated[Optional[bool], _SAVE("--distributed-optimizer/--no-distributed-optimizer")] = None,
    optimizer: Annotated[Optional[OptimizerChoice], _SAVE("--optimizer", help="adam | sgd")] = None,
    optim_sharding: Annotated[Optional[ShardingChoice], _SAVE("--optim-sharding")] = None,
    files_per_rank: Annotated[Int, _SAVE("--files-per-rank", help=".distcp files per rank")] = None,
    write_bw: Annotated[float, _COST("--write-bw", help="GB/s of one writer stream")] = 2.0,
    aggregate_bw: Annotated[float, _COST("--aggregate-bw", help="GB/s of the file system")] = 100.0,
    d2h_bw: Annotated[float, _COST("--d2h-bw", help="GB/s device to host")] = 25.0,
    svg: Annotated[Optional[Path], typer.Option("--svg", help="write the per-rank write-volume chart")] = None,
    output: OutputOpt = Output.TEXT,
    debug: DebugOpt = False,
) -> None:
    """What a save will cost before the job runs: size, bytes per rank, files, stall, async host memory.

    Bytes are decimal (1 GB = 10^9 B); bandwidths are decimal GB/s.
    """

    def body() -> int:
        from ckptinspect.api import estimate as do_estimate
        from ckptinspect.commands.estimate.describe import GptDescription
        from ckptinspect.errors import UsageError

        only(output, EstimateResult.OUTPUTS)
        description = None
        if any(v is not None for v in (layers, hidden, heads, vocab)):
            if layers is None or hidden is None or heads is None or vocab is None:
                raise UsageError("a model description needs at least --layers --hidden --heads --vocab")
            description = GptDescription(
                layers=layers, hidden=hidden, heads=heads, vocab=vocab, ffn_hidden=ffn_hidden, kv_heads=kv_heads,
                kv_channels=kv_channels, make_vocab_size_divisible_by=vocab_divisible_by, swiglu=swiglu,
                tied_embeddings=tied, layernorm=not rmsnorm, bias=bias, learned_positions=max_position,
                experts=experts, moe_ffn_hidden=moe_ffn_hidden, moe_layer_freq=moe_layer_freq)
        r = do_estimate(
            params=params, description=description, checkpoint=from_, dtype=dtype, tp=tp, pp=pp, dp=dp, ep=ep,
            etp=etp, cp=cp, vpp=vpp, gpus_per_node=gpus_per_node, format=fmt.value, fully_parallel=fully_parallel,
            async_save=async_save, distributed_optimizer=distopt, optimizer=optimizer.value if optimizer else None,
            optim_sharding=optim_sharding.value if optim_sharding else None, files_per_rank=files_per_rank,
            write_bw=write_bw, aggregate_bw=aggregate_bw, d2h_bw=d2h_bw)
        if svg is not None:
            from ckptinspect.render.estimate_svg import estimate_svg

            svg.write_text(estimate_svg(r.estimate), encoding="utf-8")
        emit_result(r, output)
        return r.exit_code()

    guarded(debug, body)
