"""The public Python API (`import ckptinspect`): names, cheap import, and equality with the CLI.

For every command and sample, `r.to_dict()` must equal the JSON the CLI prints and `r.exit_code(fail_on)` its exit
code; the CLI is built on these functions, and these tests keep it so.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import ckptinspect
from ckptinspect.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_ckpts"

PUBLIC = {
    "__version__", "sniff", "read", "ls", "info", "audit", "diff", "resume", "coverage", "verify_manifest",
    "write_manifest", "merge_manifest_reports", "scan", "estimate", "Status", "Severity", "Finding", "FailOn",
    "GptDescription", "SniffResult", "LsResult", "InfoResult", "AuditResult", "DiffResult", "ResumeResult",
    "CoverageResult", "ManifestResult", "WrittenManifestResult", "ScanResult", "EstimateResult", "CkptInspectError",
    "retain", "RetainResult", "values", "merge_values_reports", "ValuesResult", "watch",
    "UsageError", "BrokenSaveDir", "ReadError", "LimitExceeded", "StorageError", "FailOnLike",
    # the verdict enums and the neutral model `read()` returns
    "SniffState", "Verdict", "Outcome", "Checkpoint", "Tensor", "Chunk", "ChunkTable", "StoredItem", "ObjectItem",
    "FileInfo", "FileRole", "Topology", "Format", "Kind", "Stack", "ShardedBackend",
}


def test_all_is_the_documented_public_api() -> None:
    assert set(ckptinspect.__all__) == PUBLIC
    for name in ckptinspect.__all__:
        assert getattr(ckptinspect, name) is not None


def test_the_model_and_verdicts_are_the_exported_types() -> None:
    """What `read()` / `resume()` / `sniff()` return is typed by names a user can import from the package root."""
    ckpt = ckptinspect.read(SAMPLES / "torch_dist")
    assert isinstance(ckpt, ckptinspect.Checkpoint) and ckpt.format is ckptinspect.Format.TORCH_DIST
    assert ckpt.tensors and all(isinstance(t, ckptinspect.Tensor) for t in ckpt.tensors)
    assert isinstance(ckpt.table, ckptinspect.ChunkTable)
    assert all(isinstance(c, ckptinspect.Chunk) for c in ckpt.tensors[0].chunks)
    r = ckptinspect.resume(SAMPLES / "torch_dist", tp=1, pp=1)
    assert isinstance(r.verdict, ckptinspect.Verdict)
    assert isinstance(ckptinspect.sniff(SAMPLES / "torch_dist").report.state, ckptinspect.SniffState)
    assert ckptinspect.FailOn("warning").severity is ckptinspect.Severity.WARNING
    assert ckptinspect.audit(SAMPLES / "torch_dist").exit_code(ckptinspect.FailOn.NEVER) == 0


def test_release_gate_with_top_level_names_only(tmp_path: Path) -> None:
    """The README's release gate: only `ckptinspect.*` names, on a real save dir and on a truncated copy."""
    import shutil

    r = ckptinspect.audit(SAMPLES / "torch_dist")
    assert r.status is ckptinspect.Status.COMPLETE
    assert r.exit_code() == 0 and r.exit_code(fail_on="never") == 0
    assert r.exit_code(fail_on="warning") == 1  # the save dir has a crashed leftover (CK506, a warning)
    assert all(isinstance(f, ckptinspect.Finding) for f in r.findings)
    assert r.to_dict()["status"] == "complete"

    broken = tmp_path / "run"
    shutil.copytree(SAMPLES / "torch_dist", broken)
    victim = broken / "iter_0000002" / "__0_0.distcp"
    victim.write_bytes(victim.read_bytes()[:100])
    r = ckptinspect.audit(broken)
    assert r.status is ckptinspect.Status.CORRUPT and r.exit_code() == 1
    assert {f.code for f in r.deciding_findings if f.severity is ckptinspect.Severity.ERROR} >= {"CK202"}
    with pytest.raises(ckptinspect.UsageError):
        ckptinspect.audit(tmp_path / "nope")


def test_import_is_cheap_and_torch_free() -> None:
    code = ("import sys, ckptinspect; heavy = [m for m in ('torch', 'numpy', 'pandas', 'rich', 'typer', "
            "'ckptinspect.commands', 'ckptinspect.formats') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def _cli(*args: str) -> tuple[int, dict[str, Any]]:
    r = CliRunner().invoke(app, [*args, "-o", "json"])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r.exit_code, json.loads(r.stdout)


def _same(result: Any, cli_args: tuple[str, ...], fail_ons: tuple[str, ...] = ("error",)) -> None:
    for fail_on in fail_ons:
        extra = ("--fail-on", fail_on) if len(fail_ons) > 1 else ()
        rc, doc = _cli(*cli_args, *extra)
        assert result.to_dict() == doc
        assert result.exit_code(fail_on) == rc, (cli_args, fail_on)


FAIL_ONS = ("error", "warning", "never")
CASES: list[tuple[str, Callable[[Path], Any], Callable[[Path], tuple[str, ...]], tuple[str, ...]]] = [
    ("sniff", lambda p: ckptinspect.sniff(p), lambda p: ("sniff", str(p)), ("error",)),
    ("ls", lambda p: ckptinspect.ls(p), lambda p: ("ls", str(p)), FAIL_ONS),
    ("info", lambda p: ckptinspect.info(p), lambda p: ("info", str(p)), FAIL_ONS),
    ("audit", lambda p: ckptinspect.audit(p), lambda p: ("audit", str(p)), FAIL_ONS),
    ("audit-all", lambda p: ckptinspect.audit(p, all_iterations=True, ignore=("CK4",)),
     lambda p: ("audit", str(p), "--all", "--ignore", "CK4"), FAIL_ONS),
    ("scan", lambda p: ckptinspect.scan(p), lambda p: ("scan", str(p)), FAIL_ONS),
    ("coverage", lambda p: ckptinspect.coverage(p), lambda p: ("coverage", str(p)), FAIL_ONS),
    ("verify", lambda p: ckptinspect.verify_manifest(p), lambda p: ("manifest", "verify", str(p)), FAIL_ONS),
    ("resume", lambda p: ckptinspect.resume(p, tp=1, pp=1), lambda p: ("resume", str(p), "--tp", "1", "--pp", "1"),
     ("error",)),
    ("diff", lambda p: ckptinspect.diff(SAMPLES / "torch_dist" / "iter_0000001", p),
     lambda p: ("diff", str(SAMPLES / "torch_dist" / "iter_0000001"), str(p)), ("error",)),
    ("retain", lambda p: ckptinspect.retain(p, keep_last=1, keep=(1, 9)),
     lambda p: ("retain", str(p), "--keep-last", "1", "--keep", "1", "--keep", "9"), FAIL_ONS),
    ("values", lambda p: ckptinspect.values(p), lambda p: ("values", str(p), "--progress", "none"), FAIL_ONS),
    ("audit-values", lambda p: ckptinspect.audit(p, values=True),
     lambda p: ("audit", str(p), "--values", "--progress", "none"), FAIL_ONS),
]
PATHS = ["torch_dist", "torch_dist/iter_0000001", "torch_dist_fully", "dcp", "legacy"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name,api,cli,fail_ons", CASES, ids=[c[0] for c in CASES])
def test_api_equals_cli(name: str, api: Callable[[Path], Any], cli: Callable[[Path], tuple[str, ...]],
                        fail_ons: tuple[str, ...], path: str) -> None:
    p = SAMPLES / path
    try:
        result = api(p)
    except ckptinspect.UsageError:  # e.g. `resume` of a DCP checkpoint: the CLI's exit 2
        r = CliRunner().invoke(app, [*cli(p), "-o", "json"])
        assert r.exit_code == 2, r.output
        return
    _same(result, cli(p), fail_ons)


def test_write_manifest_and_verify_with_select(tmp_path: Path) -> None:
    import shutil

    ckpt = tmp_path / "c"
    shutil.copytree(SAMPLES / "torch_dist" / "iter_0000001", ckpt)
    w = ckptinspect.write_manifest(ckpt, tmp_path / "m.json")
    rc, doc = _cli("manifest", "write", str(ckpt), "--out", str(tmp_path / "m2.json"))
    assert rc == w.exit_code() == 0
    assert {k: v for k, v in w.to_dict().items() if k != "manifest"} == {k: v for k, v in doc.items() if k != "manifest"}
    (ckpt / "__0_0.distcp").write_bytes(b"tampered")
    r = ckptinspect.verify_manifest(ckpt, tmp_path / "m.json")
    assert r.status is ckptinspect.Status.CORRUPT and r.exit_code() == 1
    _same(r, ("manifest", "verify", str(ckpt), "--manifest", str(tmp_path / "m.json")), FAIL_ONS)
    quiet = ckptinspect.verify_manifest(ckpt, tmp_path / "m.json", ignore=("CK401", "CK402"))
    assert quiet.status is ckptinspect.Status.COMPLETE and quiet.exit_code() == 0
    _same(quiet, ("manifest", "verify", str(ckpt), "--manifest", str(tmp_path / "m.json"), "--ignore", "CK401",
                  "--ignore", "CK402"))
    only = ckptinspect.verify_manifest(ckpt, tmp_path / "m.json", select=("CK401",))
    assert {f.code for f in only.findings} == {"CK401"}


SAMPLE_DIRS = sorted(p.name for p in SAMPLES.iterdir() if p.is_dir())


@pytest.mark.parametrize("sample", SAMPLE_DIRS)
def test_ls_info_estimate_equal_cli_on_every_sample(sample: str) -> None:
    """`ls`, `info` and `estimate --from` on every bundled sample: the API's document and exit code are the CLI's."""
    p = SAMPLES / sample
    ls = ckptinspect.ls(p)
    assert isinstance(ls, ckptinspect.LsResult) and ls.iterations
    _same(ls, ("ls", str(p)), ("error", "warning"))
    info = ckptinspect.info(p)
    assert isinstance(info, ckptinspect.InfoResult) and info.findings == info.checkpoint.findings
    _same(info, ("info", str(p)), ("error", "warning"))
    try:
        est = ckptinspect.estimate(checkpoint=p, dp=4)
    except ckptinspect.UsageError:  # not a torch_dist checkpoint: the CLI's exit 2
        assert CliRunner().invoke(app, ["estimate", "--from", str(p), "--dp", "4"]).exit_code == 2
        return
    assert est.findings == () and est.exit_code() == 0
    _same(est, ("estimate", "--from", str(p), "--dp", "4"))


def test_estimate_quick_and_described_forms_equal_cli() -> None:
    quick = ckptinspect.estimate(params=7.5e9, tp=2, pp=2, dp=64, format="torch_dist", fully_parallel=True)
    _same(quick, ("estimate", "--params", "7.5e9", "--tp", "2", "--pp", "2", "--dp", "64", "--format", "torch_dist",
                  "--fully-parallel"))
    assert quick.estimate.params == 7_500_000_000
    d = ckptinspect.GptDescription(layers=4, hidden=64, heads=4, vocab=1000, swiglu=True, experts=4)
    described = ckptinspect.estimate(description=d, tp=2, ep=2, dp=2, format="torch", optimizer="sgd")
    _same(described, ("estimate", "--layers", "4", "--hidden", "64", "--heads", "4", "--vocab", "1000", "--swiglu",
                      "--experts", "4", "--tp", "2", "--ep", "2", "--dp", "2", "--format", "torch", "--optimizer",
                      "sgd"))
    for bad in ({"params": 1e9, "format": "hdf5"}, {"params": 1e9, "write_bw": 0.0}, {},
                {"params": 1e9, "optim_sharding": "zero3"}):
        with pytest.raises(ckptinspect.UsageError):
            ckptinspect.estimate(**bad)  # type: ignore[arg-type]


def test_watch_yields_the_events_the_cli_prints(tmp_path: Path) -> None:
    """`ckptinspect.watch` is what `ckptinspect watch -o jsonl` prints: the same events, the same keys (the CLI adds
    the envelope and `path`), and `UsageError` at the call for a PATH that is one checkpoint."""
    import json
    import shutil

    save = tmp_path / "run"
    shutil.copytree(SAMPLES / "torch_dist", save)
    events = [e.to_dict() for e in ckptinspect.watch(save, max_polls=1, interval=0)]
    r = CliRunner().invoke(app, ["watch", str(save), "--once", "-o", "jsonl"])
    assert r.exit_code == 0, r.output
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    drop = {"time"}
    assert [{k: v for k, v in e.items() if k not in drop} for e in events] == [
        {k: v for k, v in d.items() if k in events[0] and k not in drop} for d in lines]
    with pytest.raises(ckptinspect.UsageError):
        ckptinspect.watch(save / "iter_0000001", max_polls=1)
