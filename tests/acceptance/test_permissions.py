"""Nothing unread is ever `complete` (issue 25 §2): the CLI run as a process file modes bind (`_unprivileged.py`).

The rule (docs/contract.md "Unreadable files"): a PATH the user named that cannot be read at all (a dir it may not
list or enter, a file it may not open) is exit 2 naming it and saying "permission denied", like a PATH that does not
exist; anything inside it that a command's verdict needs and that cannot be read is CK209 (error, `incomplete`),
never `complete`, never a broken-file code (CK104 / CK106 / CK205 / CK206 / CK402 / CK404 / CK502), never a
"does not exist", never exit 3. Checkpoints are the real samples (megatron-core 0.19.2 and 0.16.1, legacy, torch
DCP), copied and then chmod'ed.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from _unprivileged import Unprivileged, restore_modes, unprivileged  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

SAMPLES = Path(__file__).resolve().parents[2] / "sample_ckpts"
M19 = SAMPLES / "mcore_0_19_2"  # tracker 400, iter_0000400: common_state item in __0_0, byte items in __4_0
ITER = "iter_0000400"
BROKEN_FILE_CODES = {"CK104", "CK106", "CK201", "CK205", "CK206", "CK402", "CK404", "CK502", "CK503"}


@dataclass
class Out:
    code: int
    doc: dict[str, Any] | None
    err: str
    proc: subprocess.CompletedProcess[str]

    @property
    def codes(self) -> set[str]:
        """Every finding code of the document (a save dir's, its checkpoints', an ls row's)."""
        if self.doc is None:
            return set()
        found = {f["code"] for f in self.doc.get("findings", [])}
        for c in self.doc.get("checkpoints", []):
            found |= {f["code"] for f in c["findings"]}
        for row in self.doc.get("iterations", []):
            found |= set(row["codes"])
        return found

    def unread(self) -> list[dict[str, Any]]:
        return [f for f in (self.doc or {}).get("findings", []) if f["code"] == "CK209"]


def run(u: Unprivileged, *args: str) -> Out:
    p = u.cli(*args, "-o", "json")
    try:
        doc = json.loads(p.stdout) if p.stdout.strip() else None
    except ValueError:
        doc = None
    assert "internal error" not in p.stderr and p.returncode != 3, p.stderr[-2000:]
    return Out(p.returncode, doc, p.stderr, p)


# every command, with the arguments a save dir (or checkpoint) `x` takes; `diff` compares with the pristine sample
COMMANDS: dict[str, tuple[str, ...]] = {
    "sniff": ("sniff",), "ls": ("ls",), "info": ("info",), "audit": ("audit",), "audit --all": ("audit", "--all"),
    "audit --deep": ("audit", "--deep"), "coverage": ("coverage",), "scan": ("scan",),
    "manifest verify": ("manifest", "verify"), "manifest write": ("manifest", "write"), "diff": ("diff",),
    "resume": ("resume", "--tp", "2", "--pp", "2"),
}


def argv(cmd: str, target: Path) -> list[str]:
    head = COMMANDS[cmd]
    if cmd.startswith("resume"):
        return [head[0], str(target), *head[1:]]
    if cmd == "diff":
        return ["diff", str(target), str(M19)]
    return [*head, str(target)]


# --- the PATH the user named ---------------------------------------------------------------------------------------


NAMED = [(cmd, 0o000) for cmd in COMMANDS] + [(cmd, mode) for mode in (0o111, 0o444)
                                             for cmd in ("ls", "audit", "scan", "manifest verify", "manifest write")]


@pytest.mark.parametrize("cmd,mode", NAMED, ids=[f"{c}-{m:03o}" for c, m in NAMED])
def test_a_named_path_that_cannot_be_read_is_a_clean_usage_error(unprivileged: Unprivileged, cmd: str,
                                                                 mode: int) -> None:
    """Before: `PermissionError` from `Path.exists` while sniffing, exit 3 (mode 000); CK503 "names iter_0000400,
    which does not exist" (mode --x)."""
    save = unprivileged.copy(M19)
    save.chmod(mode)
    out = run(unprivileged, *argv(cmd, save))
    assert out.code == 2, (out.code, out.err)
    assert str(save) in out.err and "permission denied" in out.err, out.err


def test_a_named_checkpoint_file_that_cannot_be_opened_is_a_clean_usage_error(unprivileged: Unprivileged) -> None:
    """A legacy `.pt` given as PATH: exit 2 naming it, not CK206 "unreadable (truncated / not a torch archive)"."""
    legacy = unprivileged.copy(SAMPLES / "legacy")
    pt = legacy / "iter_0000001" / "mp_rank_00_000" / "model_optim_rng.pt"
    pt.chmod(0)
    for cmd in ("info", "audit", "scan"):
        out = run(unprivileged, cmd, str(pt))
        assert out.code == 2 and str(pt) in out.err and "permission denied" in out.err, (cmd, out.err)


# --- the tracked iteration dir -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o000, 0o111], ids=["mode-000", "mode-x-only"])
@pytest.mark.parametrize("cmd", [c for c in COMMANDS if c not in ("manifest write", "diff", "resume", "sniff")])
def test_an_unreadable_tracked_iteration_is_ck209_incomplete(unprivileged: Unprivileged, cmd: str, mode: int) -> None:
    """Before: exit 3 (mode 000; `scan` said complete, 0 pickles; `manifest verify` CK400 "no manifest"), CK201
    "does not exist" / `ls` corrupt / `info` exit 0 (mode --x)."""
    save = unprivileged.copy(M19)
    (save / ITER).chmod(mode)
    out = run(unprivileged, *argv(cmd, save))
    assert out.code == 1, (out.code, out.err, out.doc)
    assert "CK209" in out.codes and not (out.codes & BROKEN_FILE_CODES), out.codes
    doc = out.doc or {}
    if "status" in doc:
        assert doc["status"] == "incomplete"
    if cmd == "ls":  # `ls` lists each iteration's codes; its findings are the save dir's own
        assert [(r["status"], r["codes"]) for r in doc["iterations"]] == [("incomplete", ["CK209"])]
        return
    unread = [f for f in _all_findings(doc) if f["code"] == "CK209"]
    assert unread and all("permission denied" in f["message"] and "does not exist" not in f["message"]
                          for f in unread), unread
    assert any(ITER in (f["path"] or "") + f["message"] for f in unread), unread


def _all_findings(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = list(doc.get("findings", []))
    for c in doc.get("checkpoints", []):
        out += [f for f in c["findings"] if f not in out]
    return out


@pytest.mark.parametrize("mode", [0o000, 0o111], ids=["mode-000", "mode-x-only"])
def test_sniff_diff_resume_and_write_on_an_unreadable_tracked_iteration(unprivileged: Unprivileged,
                                                                        mode: int) -> None:
    save = unprivileged.copy(M19)
    unprivileged.own(save)
    (save / ITER).chmod(mode)
    sniffed = run(unprivileged, "sniff", str(save))
    assert sniffed.code == 0 and sniffed.doc is not None and sniffed.doc["state"] == "CK209"
    assert any("permission denied" in e for e in sniffed.doc["evidence"])
    diffed = run(unprivileged, "diff", str(save), str(M19))
    assert diffed.code == 1 and diffed.doc is not None and diffed.doc["blocking"] and not diffed.doc["identical"]
    assert any("CK209" in n for n in diffed.doc["notes"]), diffed.doc["notes"]
    resumed = run(unprivileged, "resume", str(save), "--tp", "2", "--pp", "2")
    assert resumed.code == 1 and resumed.doc is not None and resumed.doc["verdict"] != "ok"
    written = run(unprivileged, "manifest", "write", str(save))
    assert written.code == 2 and "manifest not written" in written.err and "permission denied" in written.err


def test_an_unreadable_untracked_iteration_is_its_own_ck209(unprivileged: Unprivileged) -> None:
    """torch_dist sample: tracker 2; iter_0000001 unreadable is an incomplete leftover, the tracked one complete."""
    save = unprivileged.copy(SAMPLES / "torch_dist")
    (save / "iter_0000001").chmod(0)
    for flags in ((), ("--all",)):
        out = run(unprivileged, "audit", *flags, str(save))
        assert out.doc is not None
        entry = next(c for c in out.doc["checkpoints"] if c["name"] == "iter_0000001")
        assert entry["status"] == "incomplete" and [f["code"] for f in entry["findings"]] == ["CK209"]
        picked = next(c for c in out.doc["checkpoints"] if c["name"] == "iter_0000002")
        assert picked["status"] == "complete"
    listed = run(unprivileged, "ls", str(save))
    rows = {r["name"]: r for r in (listed.doc or {})["iterations"]}
    assert rows["iter_0000001"]["status"] == "incomplete" and rows["iter_0000001"]["codes"] == ["CK209"]
    assert [f["code"] for f in listed.unread()] == []  # reported once: on its row, not again on the save dir


# --- files inside a readable checkpoint ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["__4_0.distcp", "__0_0.distcp", "__3_0.distcp"],
                         ids=["byte-items", "common-state", "tensors-only"])
def test_an_unreadable_data_file_is_never_complete(unprivileged: Unprivileged, name: str) -> None:
    """Before: `audit` complete (its byte items never scanned, or no byte items), `audit --deep` CK205 "not a valid
    archive", `manifest verify` CK402 (corrupt), `scan` CK201 "missing or not a regular file"."""
    save = unprivileged.copy(M19)
    (save / ITER / name).chmod(0)
    for args in (("audit",), ("audit", "--deep"), ("scan",), ("manifest", "verify")):
        out = run(unprivileged, *args, str(save))
        assert out.code == 1 and (out.doc or {})["status"] == "incomplete", (args, out.doc)
        assert not (out.codes & BROKEN_FILE_CODES), (args, out.codes)
        unread = [f for f in _all_findings(out.doc or {}) if f["code"] == "CK209"]
        assert unread and all(name in f["message"] and "ermission denied" in f["message"] for f in unread), unread
        assert all("not a valid archive" not in f["message"] for f in _all_findings(out.doc or {}))
    if name == "__0_0.distcp":  # the common state (args, iteration) lives there: `info` needs it too
        info = run(unprivileged, "info", str(save))
        assert info.code == 1 and "CK209" in info.codes and not (info.codes & BROKEN_FILE_CODES)


@pytest.mark.parametrize("name,broken", [(".metadata", "CK106"), ("metadata.json", "CK104"),
                                         ("integrity.json", "CK404")])
def test_an_unreadable_metadata_file_is_ck209_not_its_broken_code(unprivileged: Unprivileged, name: str,
                                                                  broken: str) -> None:
    """Before: the file's own "broken" code (corrupt) with "unreadable: Permission denied" in its message."""
    save = unprivileged.copy(M19)
    (save / ITER / name).chmod(0)
    commands = [("audit",), ("manifest", "verify")] + ([] if name == "integrity.json" else [("info",), ("coverage",)])
    for args in commands:
        out = run(unprivileged, *args, str(save))
        assert out.code == 1, (args, out.doc)
        assert "CK209" in out.codes and broken not in out.codes, (args, out.codes)
        if "status" in (out.doc or {}):
            assert (out.doc or {})["status"] == "incomplete"
    if name == ".metadata":
        scanned = run(unprivileged, "scan", str(save))
        assert scanned.code == 1 and scanned.codes == {"CK209"} and (scanned.doc or {})["status"] == "incomplete"


def test_an_unreadable_tracker_is_ck209_not_unparseable(unprivileged: Unprivileged) -> None:
    """Before: CK502 "unparseable (unreadable: Permission denied)", corrupt."""
    save = unprivileged.copy(M19)
    (save / "latest_checkpointed_iteration.txt").chmod(0)
    for args in (("audit",), ("ls",), ("info",)):
        out = run(unprivileged, *args, str(save))
        assert out.code == 1 and "CK209" in out.codes and "CK502" not in out.codes, (args, out.codes)
    audit = run(unprivileged, "audit", str(save))
    assert (audit.doc or {})["status"] == "incomplete"


def test_an_unreadable_common_pt_is_ck209(unprivileged: Unprivileged) -> None:
    """megatron-core 0.16.1 `common.pt` (torch_dist sample, tracked iter_0000002). Before: CK206, corrupt."""
    save = unprivileged.copy(SAMPLES / "torch_dist")
    (save / "iter_0000002" / "common.pt").chmod(0)
    for args in (("audit",), ("info",), ("scan",)):
        out = run(unprivileged, *args, str(save))
        assert out.code == 1 and "CK209" in out.codes and "CK206" not in out.codes, (args, out.codes)


def test_an_unreadable_legacy_rank_dir(unprivileged: Unprivileged) -> None:
    """A legacy `mp_rank_*` dir at mode 000: the readers stat files inside it (`Path.exists` raises)."""
    save = unprivileged.copy(SAMPLES / "legacy")
    (save / "iter_0000001" / "mp_rank_01_000").chmod(0)
    for args in (("audit",), ("info",), ("scan",), ("ls",)):
        out = run(unprivileged, *args, str(save))
        assert out.code == 1 and "CK209" in out.codes, (args, out.code, out.codes, out.err)
        if "status" in (out.doc or {}):
            assert (out.doc or {})["status"] == "incomplete"


def test_an_unreadable_dcp_step_dir_of_a_torchtitan_run(unprivileged: Unprivileged) -> None:
    """torch DCP save dir (`step-10/`, no tracker): the resume pick looks for `.metadata` inside each step dir."""
    run_dir = unprivileged.copy(SAMPLES / "dcp")
    (run_dir / "step-10").chmod(0)
    out = run(unprivileged, "audit", str(run_dir))
    assert out.code == 1 and "CK209" in out.codes and (out.doc or {})["status"] in ("incomplete",), out.doc
    (run_dir / "step-10").chmod(0o755)
    (run_dir / "step-10" / "__2_0.distcp").chmod(0)
    out = run(unprivileged, "scan", str(run_dir))
    assert out.code == 1 and out.codes == {"CK209"} and (out.doc or {})["pickles_scanned"] > 0


# --- manifest write: clean errors, nothing half-written ------------------------------------------------------------


def _entries(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def test_manifest_write_into_a_read_only_dir_is_a_clean_error(unprivileged: Unprivileged) -> None:
    """Before: exit 3 (`PermissionError` creating the temp file)."""
    ckpt = unprivileged.copy(M19 / ITER)
    unprivileged.own(ckpt)
    before = (ckpt / "integrity.json").read_bytes()
    ckpt.chmod(0o555)
    out = run(unprivileged, "manifest", "write", str(ckpt))
    assert out.code == 2 and "manifest not written" in out.err and "ermission denied" in out.err, out.err
    assert str(ckpt / "integrity.json") in out.err
    restore_modes(ckpt)
    assert (ckpt / "integrity.json").read_bytes() == before and not [n for n in _entries(ckpt) if n.endswith(".tmp")]


def test_manifest_write_out_into_a_read_only_dir_or_onto_a_dir(unprivileged: Unprivileged) -> None:
    ckpt = unprivileged.copy(M19 / ITER)
    ro = unprivileged.place("read-only")
    ro.chmod(0o555)
    out = run(unprivileged, "manifest", "write", str(ckpt), "--out", str(ro / "m.json"))
    assert out.code == 2 and "manifest not written" in out.err and str(ro) in out.err, out.err
    rw = unprivileged.place("writable")
    unprivileged.own(rw)
    (rw / "m.json").mkdir()
    out = run(unprivileged, "manifest", "write", str(ckpt), "--out", str(rw / "m.json"))
    assert out.code == 2 and "manifest not written" in out.err, out.err
    assert _entries(rw) == ["m.json"] and (rw / "m.json").is_dir()  # no temp file left beside it


def test_manifest_write_with_an_unreadable_listed_file_is_a_clean_error(unprivileged: Unprivileged) -> None:
    """Before: exit 3 (`ReadError: cannot hash __3_0.distcp: PermissionError`)."""
    ckpt = unprivileged.copy(M19 / ITER)
    unprivileged.own(ckpt)
    before = (ckpt / "integrity.json").read_bytes()
    (ckpt / "__3_0.distcp").chmod(0)
    out = run(unprivileged, "manifest", "write", str(ckpt))
    assert out.code == 2 and "__3_0.distcp" in out.err and "ermission denied" in out.err, out.err
    assert (ckpt / "integrity.json").read_bytes() == before
    assert not [n for n in _entries(ckpt) if n.endswith(".tmp")]


def test_manifest_write_recursive_with_an_unreadable_sub_dir_is_a_clean_error(unprivileged: Unprivileged) -> None:
    """`os.walk` skips a dir it cannot list: the manifest would silently miss its files."""
    ckpt = unprivileged.copy(M19 / ITER)
    unprivileged.own(ckpt)
    (ckpt / "tokenizer").mkdir()
    (ckpt / "tokenizer" / "vocab.json").write_text("{}")
    unprivileged.own(ckpt)
    (ckpt / "tokenizer").chmod(0)
    before = (ckpt / "integrity.json").read_bytes()
    out = run(unprivileged, "manifest", "write", "--recursive", str(ckpt))
    assert out.code == 2 and "tokenizer" in out.err and "ermission denied" in out.err, out.err
    assert (ckpt / "integrity.json").read_bytes() == before
