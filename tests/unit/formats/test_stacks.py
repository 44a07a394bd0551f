"""The training stacks (`formats/stacks.py`, `formats/run_config.py`, `formats/nvrx_local.py`) on the real samples.

sample_ckpts/{bridge,nemo2,nvrx_local,torchtitan} (see sample_ckpts/README.md) are copied before any change.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckptinspect.commands.diff.diff import diff_checkpoints
from ckptinspect.commands.scan.scan import scan_path
from ckptinspect.errors import ReadError
from ckptinspect.formats import read_checkpoint
from ckptinspect.formats.run_config import args_from_run_config, load_run_config
from ckptinspect.formats.sniff import sniff
from ckptinspect.formats.stacks import classify_dcp_keys
from ckptinspect.model import Format, Stack
from conftest import SAMPLES

NEMO_CKPT = "nemo2/checkpoints/default--reduced_train_loss=0.00-epoch=0-consumed_samples=4.0-step=1"


@pytest.mark.parametrize(("sub", "stack", "fmt"), [
    ("bridge", Stack.MEGATRON_BRIDGE, Format.TORCH_DIST),
    ("bridge/iter_0000002", Stack.MEGATRON_BRIDGE, Format.TORCH_DIST),
    ("nemo2/checkpoints", Stack.NEMO2, Format.TORCH_DIST),
    (NEMO_CKPT, Stack.NEMO2, Format.TORCH_DIST),
    ("nvrx_local", Stack.NVRX_LOCAL, Format.NVRX_LOCAL),
    ("nvrx_local/1/iter_0000002_1_local.pt", Stack.NVRX_LOCAL, Format.NVRX_LOCAL),
    ("torchtitan", Stack.TORCHTITAN, Format.TORCH_DCP),
    ("torchtitan/step-1", Stack.TORCHTITAN, Format.TORCH_DCP),
    ("megatron_fsdp", Stack.MEGATRON_FSDP, Format.FSDP_DTENSOR),
    ("megatron_fsdp/iter_0000001", Stack.MEGATRON_FSDP, Format.FSDP_DTENSOR),
])
def test_sniff_names_the_stack_with_evidence(sub: str, stack: Stack, fmt: Format) -> None:
    r = sniff(SAMPLES / sub)
    assert (r.stack, r.format, r.state) == (stack, fmt, "complete")
    assert r.to_dict()["stack"] == stack.value
    assert r.evidence


def test_unknown_dir_is_still_unrecognized(tmp_path: Path) -> None:
    (tmp_path / "weights").mkdir()  # a weights/ dir alone is no NeMo 2 checkpoint
    r = sniff(tmp_path)
    assert r.format is None and r.stack is None and r.state == "CK100" and r.evidence


def test_torchtitan_and_megatron_fsdp_are_told_apart_by_keys() -> None:
    titan = ["tok_embeddings.weight", "layers.0.attention.wo.weight", "optimizer.state.layers.0.wo.weight.exp_avg",
             "lr_scheduler.0.last_epoch", "train_state.step"]
    fsdp = ["model.module.decoder.layers.0.mlp.linear_fc1.weight_w", "optimizer.state.module.module.module.x",
            "optimizer.param_to_group_meta.module.x", "rng_state"]
    assert classify_dcp_keys(titan)[0] is Stack.TORCHTITAN
    assert classify_dcp_keys(fsdp)[0] is Stack.MEGATRON_FSDP
    # the repo's own torchtitan-style DCP sample nests its model under "model.": no claim either way
    assert classify_dcp_keys(["model.layers.0.wqkv.weight", "train_state.step"]) == (None, None)


def test_bridge_args_and_topology_come_from_run_config() -> None:
    c = read_checkpoint(SAMPLES / "bridge" / "iter_0000002", "b")
    assert c.extra["args_source"] == "run_config.yaml" and c.extra["stack"] == "megatron-bridge"
    assert c.args is not None and c.args["num_layers"] == 2 and c.args["hidden_size"] == 16
    assert c.args["activation_func"] == "<torch.nn.functional.gelu>"  # a _target_ node stays a string
    assert (c.topology.tp, c.topology.pp, c.topology.world_size) == (1, 1, 2)
    assert not [f for f in c.findings if f.code in ("CK508", "CK509", "CK510", "CK120", "CK122")]


def test_bridge_config_diff_is_classified_like_args(tmp_path: Path) -> None:
    a = tmp_path / "a"
    b = tmp_path / "b"
    shutil.copytree(SAMPLES / "bridge" / "iter_0000002", a)
    shutil.copytree(SAMPLES / "bridge" / "iter_0000002", b)
    text = (b / "run_config.yaml").read_text()
    (b / "run_config.yaml").write_text(text.replace("hidden_size: 16", "hidden_size: 32").replace(
        "lr: 0.001", "lr: 0.002"))
    d = diff_checkpoints(read_checkpoint(a, "a"), read_checkpoint(b, "b"))
    by_name = {x.name: x for x in d.args}
    assert by_name["hidden_size"].blocking and (by_name["hidden_size"].a, by_name["hidden_size"].b) == (16, 32)
    assert "lr" in by_name and not by_name["lr"].blocking


def test_run_config_safe_loader_refuses_python_tags_and_alias_bombs(tmp_path: Path) -> None:
    p = tmp_path / "run_config.yaml"
    p.write_text('model: !!python/object/apply:os.system ["echo hi"]\n')
    with pytest.raises(ReadError) as e:
        load_run_config(p)
    assert e.value.code == "CK120"
    bomb = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i, name in enumerate("bcdefgh"):
        prev = "abcdefgh"[i]
        bomb.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 10) + "]")
    p.write_text("\n".join(bomb) + "\n")
    with pytest.raises(ReadError, match="nodes"):
        load_run_config(p)
    p.write_text("- just\n- a list\n")
    with pytest.raises(ReadError, match="not a mapping"):
        load_run_config(p)


def test_args_from_run_config_renames_and_flattens() -> None:
    args = args_from_run_config({"checkpoint": {"fully_parallel_save": True, "_target_": "x"},
                                 "model": {"tensor_model_parallel_size": 2, "vocab_size": 128,
                                           "params_dtype": {"_call_": False, "_target_": "torch.bfloat16"}}})
    assert args == {"ckpt_fully_parallel_save": True, "tensor_model_parallel_size": 2, "vocab_size": 128,
                    "params_dtype": "<torch.bfloat16>", "padded_vocab_size": 128}


def test_nvrx_every_rank_file_is_read_and_scanned() -> None:
    c = read_checkpoint(SAMPLES / "nvrx_local" / "iter_0000002", "n")
    assert c.format is Format.NVRX_LOCAL and c.iteration == 2
    assert sorted(f.name for f in c.files) == ["0/iter_0000002_0_local.pt", "1/iter_0000002_1_local.pt"]
    assert c.args is not None and c.args["data_parallel_size"] == 2 and c.topology.world_size == 2
    assert scan_path(SAMPLES / "nvrx_local").pickles_scanned == 2


def test_stack_audits_leave_torch_unimported() -> None:
    code = ("import sys; from pathlib import Path; from ckptinspect.commands.audit.audit import audit\n"
            f"for p in ('bridge', 'nemo2/checkpoints', 'nvrx_local', 'torchtitan', 'megatron_fsdp'):\n"
            f"    assert audit(Path({str(SAMPLES)!r}) / p).status.value == 'complete', p\n"
            "assert 'torch' not in sys.modules and 'yaml' in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def _nemo_copy(tmp_path: Path) -> Path:
    root = tmp_path / "checkpoints"
    shutil.copytree(SAMPLES / "nemo2" / "checkpoints", root)
    return root


def test_nemo2_pick_prefers_last_copy_and_skips_unfinished(tmp_path: Path) -> None:
    from ckptinspect.commands.audit.audit import audit
    from ckptinspect.formats.savedir import read_save_dir

    root = _nemo_copy(tmp_path)
    step1 = next(root.iterdir())
    shutil.copytree(step1, root / f"{step1.name}-last")  # ModelCheckpoint save_last
    newer = root / step1.name.replace("step=1", "step=3")
    shutil.copytree(step1, newer)
    (root / f"{newer.name}-unfinished").touch()  # killed while saving step 3
    assert read_save_dir(root).resume_pick().name == f"{step1.name}-last"  # type: ignore[union-attr]
    r = audit(root)
    assert r.status.value == "complete"
    assert {f.code for f in r.findings if f.subject == newer.name} >= {"CK506"}


def test_resume_refuses_nvrx_local_with_a_reason() -> None:
    from typer.testing import CliRunner

    from ckptinspect.cli.app import app

    r = CliRunner().invoke(app, ["resume", str(SAMPLES / "nvrx_local"), "--tp", "2", "--pp", "1"])
    assert r.exit_code == 2 and "only with the topology that saved it" in r.output


def test_nvrx_session_dirs_are_found_one_level_down(tmp_path: Path) -> None:
    from ckptinspect.commands.audit.audit import audit

    shutil.copytree(SAMPLES / "nvrx_local", tmp_path / "myjob")  # {root}/{session_id}/{rank}/...
    r = audit(tmp_path)
    assert r.status.value == "complete" and [c.name for c in r.checkpoints] == ["myjob/iter_0000002"]
    assert r.checkpoints[0].checkpoint.format is Format.NVRX_LOCAL


@pytest.mark.parametrize(("sub", "data"), [
    (NEMO_CKPT, f"{NEMO_CKPT}/weights"),  # NeMo 2: the torch_dist payload is <ckpt>/weights/
    ("bridge/iter_0000002", "bridge/iter_0000002"),
    ("torchtitan/step-1", "torchtitan/step-1"),
    ("megatron_fsdp/iter_0000001", "megatron_fsdp/iter_0000001"),
    ("nvrx_local/iter_0000002", "nvrx_local"),  # a virtual iteration: its files are in the root's rank dirs
])
def test_data_dir_is_where_the_files_are(sub: str, data: str) -> None:
    c = read_checkpoint(SAMPLES / sub, str(SAMPLES / sub))
    assert c.data_dir == str(SAMPLES / data)
    assert c.files and all((Path(c.data_dir) / f.name).is_file() for f in c.files)
    stored = {o.storage.file for o in c.objects if o.storage is not None}
    assert all((Path(c.data_dir) / name).is_file() for name in stored)


def test_nemo2_manifest_write_and_verify_use_weights(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ckptinspect.cli.app import app

    ckpt = _nemo_copy(tmp_path) / NEMO_CKPT.split("/", 2)[2]
    run = CliRunner().invoke
    w = run(app, ["manifest", "write", str(ckpt), "-o", "json"])
    assert w.exit_code == 0, w.output
    assert not (ckpt / "integrity.json").exists()  # Megatron writes it next to .metadata: weights/
    listed = json.loads((ckpt / "weights" / "integrity.json").read_text())["files"]
    assert sorted(listed) == sorted(p.name for p in (ckpt / "weights").iterdir() if p.name != "integrity.json")
    for target in (ckpt, ckpt.parent):  # the checkpoint, and the save dir that resolves to it
        v = run(app, ["manifest", "verify", str(target), "-o", "json"])
        doc = json.loads(v.stdout)
        assert v.exit_code == 0 and doc["status"] == "complete" and doc["files_checked"] == len(listed), v.output
        a = run(app, ["audit", str(target), "--hash", "-o", "json"])
        assert a.exit_code == 0 and "CK400" not in a.stdout, a.output
    with open(ckpt / "weights" / "__1_1.distcp", "r+b") as f:
        f.seek(-10, 2)
        f.write(b"\xff" * 4)
    v = run(app, ["manifest", "verify", str(ckpt), "-o", "json"])
    assert v.exit_code == 1 and {f["code"] for f in json.loads(v.stdout)["findings"]} == {"CK401"}


def test_nemo2_diff_values_reads_the_weights() -> None:
    ckpt = SAMPLES / NEMO_CKPT
    r = diff_checkpoints(read_checkpoint(ckpt, str(ckpt)), read_checkpoint(ckpt, str(ckpt)), values=True)
    assert r.values is not None and not r.values.skipped
    assert len(r.values.identical) == len(r.values.compared) == 20
