#!/usr/bin/env python
"""Write tests/data/hf_exports/: a tiny Hugging Face Llama and its Megatron import by Megatron-LM's converter.

    python tools/make_hf_export_samples.py --megatron-lm DIR      # from the repo root

Samples (each written by a real producer, nothing by hand):
  * ``llama_gqa_hf/`` -- ``transformers`` (5.x) ``LlamaForCausalLM`` with a tiny random config
    (hidden 64, 2 layers, 4 heads, 2 KV heads = GQA, SwiGLU intermediate 128, vocab 100, untied
    embeddings, fp32), ``save_pretrained(safe_serialization=True)`` -> ``model.safetensors`` +
    ``config.json``; a tiny WordLevel tokenizer (``tokenizers``) saved next to it because the
    converter reads the vocabulary size from it.
  * ``llama_gqa_mcore/`` -- Megatron-LM ``tools/checkpoint/convert.py --model-type GPT --loader
    llama_mistral --saver core --checkpoint-type hf --model-size llama3`` at tag ``core_v0.16.1``
    (HF -> Megatron import), with ``--make-vocab-size-divisible-by 128`` so the saver pads the
    vocabulary to 128 rows (28 padding rows in ``embedding.word_embeddings.weight`` and
    ``output_layer.weight``) and ``--saver-transformer-impl local``. The saver writes
    ``--ckpt-format torch`` (legacy ``iter_0000001/mp_rank_00/model_optim_rng.pt`` with mcore
    parameter names). The weights of the legacy ``local`` implementation have no TE fused
    layernorm: the norms are ``input_layernorm.weight`` / ``pre_mlp_layernorm.weight``.
  * ``llama_gqa_tied_hf/`` + ``llama_gqa_tied_mcore/`` -- the same with ``tie_word_embeddings`` (no
    ``lm_head.weight`` in the HF files, no ``output_layer.weight`` in Megatron's), the HF side saved as a
    sharded set (``max_shard_size="100KB"``: ``model-0000i-of-0000N.safetensors`` + the index), and imported
    with the loader's ``--bf16``: transformers loads the fp32 export as bf16 and the saver writes bf16, so the
    Megatron side is the nearest-even rounding of the HF side (a narrowing import).

  * ``llama_gqa_dist/torch_dist/`` -- ``llama_gqa_mcore`` converted to torch_dist by Megatron-LM's own
    ``pretrain_gpt.py --load ... --ckpt-format torch --ckpt-convert-format torch_dist`` (one gloo rank, CPU;
    ``tools/make_mlm_args_sample.py``'s redirections): layers stacked along a leading axis.

No Megatron-LM source is copied into this repo. ``--megatron-lm DIR`` is an export of the tag, e.g.
``git --git-dir=MIRROR archive core_v0.16.1 | tar x -C DIR``. Megatron's CUDA calls are redirected to
the CPU with ``tools/_mcore_cpu.py``'s shims exactly as ``tools/make_mlm_args_sample.py`` does;
convert.py's loader and saver processes are forked after the shims are installed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

_TOOLS_DIR = os.path.dirname(os.path.abspath(__file__))
_OUT = os.path.join(os.path.dirname(_TOOLS_DIR), "tests", "data", "hf_exports")
VOCAB = 100


def write_hf(out: str, *, tied: bool, seed: int) -> None:
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        rms_norm_eps=1e-5, tie_word_embeddings=tied, torch_dtype="float32")
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():  # norms start at 1.0: make them random so a swap is visible
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.1)
    shutil.rmtree(out, ignore_errors=True)
    # the tied one is written as a sharded set (model-0000i-of-0000N.safetensors + the index)
    model.save_pretrained(out, safe_serialization=True, max_shard_size="100KB" if tied else "5GB")
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(out, extra)):
            os.remove(os.path.join(out, extra))
    vocab = {f"t{i}": i for i in range(VOCAB - 1)}
    vocab["<unk>"] = VOCAB - 1
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    fast.save_pretrained(out)


def run_converter(mlm: str, hf_dir: str, out: str, bf16: bool = False) -> None:
    sys.path.insert(0, _TOOLS_DIR)
    import _mcore_cpu

    _mcore_cpu._quiet()
    import torch
    import torch.multiprocessing as mp

    torch.set_num_threads(1)
    _mcore_cpu.install_cuda_shims()
    import megatron.core  # noqa: F401  (the wheel; megatron.training/legacy come from DIR)

    mlm = os.path.abspath(mlm)
    sys.path.insert(0, mlm)
    sys.path.insert(0, os.path.join(mlm, "tools", "checkpoint"))

    from make_mlm_args_sample import _stub_triton_import

    _stub_triton_import()
    _mcore_cpu._patch_megatron_rng()
    import megatron.core.datasets.utils as dataset_utils
    import megatron.legacy.fused_kernels as fused_kernels

    dataset_utils.compile_helpers = lambda: None
    fused_kernels.load = lambda args: None
    import megatron.training.arguments as arguments
    import saver_base

    # The loader and the saver build their own argv; neither turns RoPE fusion off, and without
    # Transformer Engine TransformerConfig raises "apply_rope_fusion is not available": add
    # Megatron's own --no-rope-fusion and --no-gradient-accumulation-fusion flags (the latter
    # needs apex's CUDA extension) to their argv.
    real_parse = arguments.parse_args

    def parse_args(*a, **k):  # type: ignore[no-untyped-def]
        if "--no-rope-fusion" not in sys.argv:
            sys.argv.append("--no-rope-fusion")
        if "--no-gradient-accumulation-fusion" not in sys.argv:
            sys.argv.append("--no-gradient-accumulation-fusion")
        margs = real_parse(*a, **k)
        # megatron/legacy/model/utils.py get_norm still reads args.apply_layernorm_1p, which
        # 0.16.1's parser no longer defines (the legacy model path of loader_llama_mistral).
        margs.apply_layernorm_1p = getattr(margs, "apply_layernorm_1p", False)
        return margs

    arguments.parse_args = parse_args

    # saver_base.insert_megatron_path_and_check_te asserts transformer-engine >= 0.12 is installed
    # even with --saver-transformer-impl local (it is never imported on that path): answer that
    # one metadata lookup, nothing else.
    real_version = saver_base.version
    saver_base.version = lambda dist: "0.12.0" if dist == "transformer-engine" else real_version(dist)
    import loader_llama_mistral

    # verify_transformers_version asserts ``major >= 4 and minor >= 31``, which rejects 5.x (minor
    # 24 < 31): the intended check is ``(major, minor) >= (4, 31)``.
    import transformers

    assert tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (4, 31)
    loader_llama_mistral.verify_transformers_version = lambda: None
    import saver_core

    # saver_core builds an mcore GPTModel, whose LanguageModule asks parallel_state for every
    # process group (use_mpu_process_groups); the saver only fakes TP and EP, so at 0.16.1 it
    # stops with "Intra partial data parallel group is not initialized". Give the saver process
    # a real one-rank gloo world and Megatron's own initialize_model_parallel(1, 1) first.
    real_save = saver_core.save_checkpoint

    def save_checkpoint(queue, args):  # type: ignore[no-untyped-def]
        import torch.distributed as dist
        from megatron.core import parallel_state

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
        parallel_state.initialize_model_parallel(1, 1)
        return real_save(queue, args)

    saver_core.save_checkpoint = save_checkpoint
    mp.set_start_method("fork", force=True)  # the children inherit the shims
    shutil.rmtree(out, ignore_errors=True)
    sys.argv = ["convert.py", "--model-type", "GPT", "--loader", "llama_mistral", "--saver", "core",
                "--checkpoint-type", "hf", "--model-size", "llama3", "--load-dir", hf_dir,
                "--save-dir", out, "--tokenizer-model", hf_dir,
                "--make-vocab-size-divisible-by", "128", "--saver-transformer-impl", "local",
                "--loader-transformer-impl", "local", "--target-tensor-parallel-size", "1",
                "--target-pipeline-parallel-size", "1", "--megatron-path", mlm, *(["--bf16"] if bf16 else [])]
    import convert

    convert.main()


def dist_argv(load: str, out: str) -> list[str]:
    """pretrain_gpt.py's argv for Megatron-LM's own format conversion (``--ckpt-convert-format torch_dist``): load
    the converter's legacy save, write it again as torch_dist, exit (megatron/training/training.py setup_model_and_
    optimizer). The model args are the ones the converter's saver recorded (args in model_optim_rng.pt)."""
    return [
        "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--group-query-attention",
        "--num-query-groups", "2", "--ffn-hidden-size", "128", "--swiglu", "--normalization", "RMSNorm",
        "--position-embedding-type", "rope", "--no-rope-fusion", "--disable-bias-linear",
        "--untie-embeddings-and-output-weights", "--seq-length", "32", "--max-position-embeddings", "4096",
        "--transformer-impl", "local", "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
        "--no-bias-gelu-fusion", "--no-bias-dropout-fusion", "--no-persist-layer-norm",
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB),
        "--make-vocab-size-divisible-by", "128", "--micro-batch-size", "1", "--global-batch-size", "1",
        "--lr", "1e-4", "--train-iters", "1", "--eval-iters", "0",
        "--load", load, "--ckpt-format", "torch", "--no-load-optim", "--no-load-rng",
        "--ckpt-convert-format", "torch_dist", "--ckpt-convert-save", out, "--save", out, "--save-interval", "1",
        "--distributed-backend", "gloo", "--seed", "1",
    ]


def _dist_worker(mlm: str, load: str, out: str) -> None:
    import functools

    sys.path.insert(0, _TOOLS_DIR)
    import _mcore_cpu

    _mcore_cpu._quiet()
    import torch

    torch.set_num_threads(1)
    _mcore_cpu.install_cuda_shims()
    _mcore_cpu._seed_dcp_uuids(1, 0)
    import megatron.core  # noqa: F401

    sys.path.insert(0, os.path.abspath(mlm))
    from make_mlm_args_sample import _stub_triton_import

    _stub_triton_import()
    _mcore_cpu._patch_megatron_rng()
    import megatron.core.datasets.utils as dataset_utils
    import megatron.legacy.fused_kernels as fused_kernels
    import megatron.training.training as training

    dataset_utils.compile_helpers = lambda: None
    fused_kernels.load = lambda args: None
    training.initialize_megatron = functools.partial(training.initialize_megatron, allow_no_cuda=True)
    script = os.path.join(os.path.abspath(mlm), "pretrain_gpt.py")
    sys.argv = [script, *dist_argv(load, out)]
    with open(script, encoding="utf-8") as f:
        code = compile(f.read(), script, "exec")
    exec(code, {"__name__": "__main__", "__file__": script, "__builtins__": __builtins__})


def to_torch_dist(mlm: str, load: str, out: str) -> None:
    """Run `_dist_worker` as one torchrun-like rank."""
    import subprocess

    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
               PYTHONWARNINGS="ignore", CUDA_DEVICE_MAX_CONNECTIONS="1")
    subprocess.run([sys.executable, os.path.abspath(__file__), "--megatron-lm", mlm, "--dist-worker", load, out],
                   env=env, check=True, timeout=600)


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megatron-lm", required=True)
    ap.add_argument("--out", default=_OUT)
    ap.add_argument("--dist-worker", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--only-torch-dist", action="store_true", help="only redo llama_gqa_dist from llama_gqa_mcore")
    ns = ap.parse_args()
    if ns.dist_worker:
        _dist_worker(ns.megatron_lm, *ns.dist_worker)
        return
    if ns.only_torch_dist:
        to_torch_dist(ns.megatron_lm, os.path.join(ns.out, "llama_gqa_mcore"), os.path.join(ns.out, "llama_gqa_dist"))
        return
    os.makedirs(ns.out, exist_ok=True)
    for name, tied, seed in (("llama_gqa", False, 1), ("llama_gqa_tied", True, 2)):
        hf = os.path.join(ns.out, f"{name}_hf")
        write_hf(hf, tied=tied, seed=seed)
        pid = os.fork()
        if pid == 0:  # one converter run per process: Megatron's globals are set once
            code = 1
            try:
                run_converter(ns.megatron_lm, hf, os.path.join(ns.out, f"{name}_mcore"), bf16=tied)
                code = 0
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if status:
            raise SystemExit(f"converter failed for {name}: {status}")
        print(json.dumps({"wrote": [hf, os.path.join(ns.out, f"{name}_mcore")]}))
    to_torch_dist(ns.megatron_lm, os.path.join(ns.out, "llama_gqa_mcore"), os.path.join(ns.out, "llama_gqa_dist"))


if __name__ == "__main__":
    main()
