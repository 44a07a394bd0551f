"""Args values are checked at one boundary (`ckptinspect/formats/args_values.py`): a value of the wrong type or out
of range is CK703 naming the arg, is read as absent by every reader (the on-disk layout or Megatron's default is
used, and `topology_sources` says which), and no command exits 3 on it.

The checkpoints are real samples whose args were changed the way a hand edit or a damaged args would: `torch.load`
of the sample's own `common.pt` / `model_optim_rng.pt`, `setattr` on the `argparse.Namespace`, `torch.save` back
(`corpus_kit.edit_torch_file`); Megatron-Bridge's `run_config.yaml` edited as text.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptinspect.cli.app import app
from ckptinspect.formats.args_values import ARG_SPECS, MAX_PARALLEL, arg_flag, arg_int, arg_text, args_findings
from conftest import SAMPLES
from corpus_kit import edit_torch_file

BAD_SIZES: tuple[Any, ...] = ("x", math.inf, -math.inf, math.nan, 2.0, -1, 0, True, 10**30, [2], None)


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args))
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.stdout


def _copy(name: str, tmp: Path) -> Path:
    dst = tmp / name
    shutil.copytree(SAMPLES / name, dst)
    return dst


def _set_args(path: Path, **values: Any) -> None:
    def change(state: dict[str, Any]) -> None:
        for k, v in values.items():
            setattr(state["args"], k, v)

    edit_torch_file(path, change)


def _legacy_with(tmp: Path, **values: Any) -> Path:
    save = _copy("legacy", tmp)
    for f in sorted(save.glob("iter_0000001/mp_rank_*/model_optim_rng.pt")):
        _set_args(f, **values)
    return save


def _codes(doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for f in doc["findings"]:
        out.setdefault(f["code"], []).append(f)
    return out


# --- the validator --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", BAD_SIZES[:-1], ids=repr)
def test_a_size_of_the_wrong_type_or_range_reads_as_absent_and_is_named(value: Any) -> None:
    args = {"pipeline_model_parallel_size": value, "tensor_model_parallel_size": 2}
    assert arg_int(args, "pipeline_model_parallel_size") is None
    assert arg_int(args, "tensor_model_parallel_size") == 2
    (f,) = args_findings(args, "ckpt")
    assert f.code == "CK703" and f.subject == "args.pipeline_model_parallel_size"
    assert f.details["arg"] == "pipeline_model_parallel_size" and f.details["type"] == type(value).__name__


def test_valid_values_and_none_pass_without_a_finding() -> None:
    args = {"pipeline_model_parallel_size": MAX_PARALLEL, "virtual_pipeline_model_parallel_size": None,
            "iteration": 0, "use_distributed_optimizer": False, "optimizer": "adam", "unlisted": "anything"}
    assert args_findings(args, "ckpt") == ()
    assert arg_int(args, "pipeline_model_parallel_size") == MAX_PARALLEL
    assert arg_int({"pipeline_model_parallel_size": MAX_PARALLEL + 1}, "pipeline_model_parallel_size") is None
    assert arg_int(args, "iteration") == 0  # a count may be 0, a size may not
    assert arg_flag({"no_save_optim": "False"}, "no_save_optim") is False  # a string is not read as true
    assert arg_flag({"ckpt_fully_parallel_save": 1}, "ckpt_fully_parallel_save", True) is True  # default kept
    assert arg_text({"tokenizer_type": ["GPT2BPETokenizer"]}, "tokenizer_type") is None  # unhashable: not a str


@pytest.mark.slow
def test_every_sample_checkpoint_has_valid_args() -> None:
    """The table judges what real Megatron-LM / Bridge / NeMo args hold as valid (no CK703 on any sample)."""
    for sample in sorted(p for p in SAMPLES.iterdir() if p.is_dir()):
        code, out = _cli("info", str(sample), "-o", "json")
        assert code in (0, 1), sample
        assert "CK703" not in _codes(json.loads(out)), sample.name


def test_the_table_names_only_args_megatron_writes() -> None:
    """Every listed name is a real Megatron-LM arg (the 0.16.1 sample's args hold them all but the MoE ones)."""
    code, out = _cli("info", str(SAMPLES / "mlm_args"), "-o", "json")
    names = set(json.loads(out)["args"])
    moe_or_optional = {"num_experts", "num_moe_experts", "moe_ffn_hidden_size", "model_parallel_size",
                       "consumed_valid_samples", "ckpt_format", "async_save", "no_save_rng", "no_save_optim",
                       "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                       "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                       "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"}
    assert set(ARG_SPECS) - names <= moe_or_optional


# --- every command on real checkpoints with bad args ----------------------------------------------------------------


COMMANDS: tuple[tuple[str, ...], ...] = (
    ("audit",), ("audit", "--all"), ("info",), ("ls",), ("scan",), ("coverage",), ("resume", "--tp", "1", "--pp", "1"),
    ("resume", "--tp", "2", "--pp", "2"),
)


@pytest.mark.parametrize("value", ["x", math.inf, 10**30, -2], ids=repr)
def test_legacy_pipeline_size_not_an_int_is_a_finding_in_every_command(tmp_path: Path, value: Any) -> None:
    """Issue 25 §5: `pipeline_model_parallel_size = "x"` / `inf` in a legacy checkpoint made every command exit 3
    (`int()` / OverflowError in the shard-dir reader)."""
    save = _legacy_with(tmp_path, pipeline_model_parallel_size=value)
    for cmd in COMMANDS:
        code, out = _cli(cmd[0], str(save), *cmd[1:], "-o", "json")
        assert code in (0, 1), (cmd, out[-500:])
    code, out = _cli("diff", str(save), str(SAMPLES / "legacy"), "-o", "json")
    assert code in (0, 1)
    code, out = _cli("info", str(save), "-o", "json")
    doc = json.loads(out)
    (f,) = _codes(doc)["CK703"]
    assert f["subject"] == "args.pipeline_model_parallel_size" and f["severity"] == "warning"
    # the shard dirs mp_rank_TT_PPP say PP = 2, and the topology says where it came from
    assert doc["topology"]["pp"] == 2 and doc["topology_sources"]["pp"] == "mp_rank_* dirs"
    code, out = _cli("audit", str(save), "-o", "json")
    audit = json.loads(out)
    assert code == 0 and audit["status"] == "complete", audit["findings"]
    assert "CK703" in _codes(audit) and "CK110" not in _codes(audit)


@pytest.mark.parametrize("name,value", [
    ("context_parallel_size", "x"), ("virtual_pipeline_model_parallel_size", math.inf),
    ("tensor_model_parallel_size", -3), ("num_layers", "2"), ("world_size", 10**30),
    ("expert_tensor_parallel_size", math.nan), ("use_distributed_optimizer", "False"), ("optimizer", 7),
    ("make_vocab_size_divisible_by", 0.5), ("padded_vocab_size", "128"),
], ids=lambda v: repr(v) if not isinstance(v, str) else v)
def test_torch_dist_bad_arg_is_named_and_no_command_crashes(tmp_path: Path, name: str, value: Any) -> None:
    save = _copy("torch_dist_fully", tmp_path)
    _set_args(save / "iter_0000001" / "common.pt", **{name: value})
    for cmd in COMMANDS + (("estimate", "--from"),):
        args = [cmd[0], *cmd[1:2], str(save), *cmd[2:]] if cmd[0] == "estimate" else [cmd[0], str(save), *cmd[1:]]
        code, out = _cli(*args, "-o", "json")
        assert code in (0, 1), (cmd, out[-500:])
    code, out = _cli("info", str(save), "-o", "json")
    doc = json.loads(out)
    assert [f["subject"] for f in _codes(doc)["CK703"]] == [f"args.{name}"]
    assert doc["topology"]["tp"] == 2 and doc["topology"]["pp"] == 1  # args or the rng grid: never the bad value


def test_torch_dist_bad_tp_falls_back_to_the_rng_grid(tmp_path: Path) -> None:
    save = _copy("torch_dist", tmp_path)
    _set_args(save / "iter_0000002" / "common.pt", tensor_model_parallel_size="2", pipeline_model_parallel_size=True)
    code, out = _cli("info", str(save), "-o", "json")
    doc = json.loads(out)
    assert (doc["topology"]["tp"], doc["topology"]["pp"]) == (2, 2)
    assert doc["topology_sources"]["tp"] == doc["topology_sources"]["pp"] == "rng_state grid"
    assert {f["subject"] for f in _codes(doc)["CK703"]} == {"args.tensor_model_parallel_size",
                                                           "args.pipeline_model_parallel_size"}
    code, out = _cli("audit", str(save), "-o", "json")
    assert "CK702" not in _codes(json.loads(out))  # an unreadable value is not a disagreement with the disk


def test_bridge_run_config_value_is_checked_too(tmp_path: Path) -> None:
    """Megatron-Bridge: the args come from `run_config.yaml`; the same boundary judges them."""
    save = _copy("bridge", tmp_path)
    cfg = save / "iter_0000002" / "run_config.yaml"
    text = cfg.read_text()
    assert "  tensor_model_parallel_size: 1\n" in text
    cfg.write_text(text.replace("  tensor_model_parallel_size: 1\n", "  tensor_model_parallel_size: .inf\n"))
    for cmd in COMMANDS:
        code, out = _cli(cmd[0], str(save), *cmd[1:], "-o", "json")
        assert code in (0, 1), (cmd, out[-500:])
    code, out = _cli("info", str(save), "-o", "json")
    doc = json.loads(out)
    (f,) = _codes(doc)["CK703"]
    assert f["subject"] == "args.tensor_model_parallel_size" and f["details"]["value"] == "inf"


def test_huge_valid_sizes_keep_the_grid_checks_bounded(tmp_path: Path) -> None:
    """TP = PP = 2**20 is inside the spec: the legacy shard-dir check and the Megatron FSDP rng grid must not
    enumerate 2**40 names (they list the first missing ones and count the rest)."""
    save = _legacy_with(tmp_path, tensor_model_parallel_size=MAX_PARALLEL, pipeline_model_parallel_size=MAX_PARALLEL)
    start = time.monotonic()
    code, out = _cli("audit", str(save), "-o", "json")
    assert time.monotonic() - start < 30
    (f,) = _codes(json.loads(out))["CK110"]
    assert f["details"]["expected"] == MAX_PARALLEL**2 and len(f["details"]["missing"]) == 1024
    assert f["message"].startswith(f"{MAX_PARALLEL**2 - 4} of {MAX_PARALLEL**2} shard dir(s) missing")

    from ckptinspect.formats.megatron_fsdp import rng_findings

    keys = ["rng_state.(0, 0).0.random_rng_state"]  # the key shape of the megatron_fsdp sample
    start = time.monotonic()
    out_f = rng_findings(keys, {"pipeline_model_parallel_size": MAX_PARALLEL,
                                "tensor_model_parallel_size": MAX_PARALLEL}, "ckpt")
    assert time.monotonic() - start < 5
    grid = [f for f in out_f if "missing" in f.details]
    assert grid and grid[0].details["missing_count"] == MAX_PARALLEL**2 - 1
