"""The acceptance corpus from object storage: every case of `tests/support/corpus.py`, built locally, uploaded to a real S3
API server (moto on 127.0.0.1), audited from ``s3://`` (boto3) and ``msc://`` (multi-storage-client, s3 profile),
must give the same status, the same finding codes and the same exit code as the local audit of the same tree.

Two cases cannot exist in object storage and are left out, by name: `empty_dir` and `inflight_empty_iteration_dir`
(a prefix without objects is not there at all; `test_storage.py` checks that such a URL is a usage error). `manifest_stale` compares file mtimes,
which an upload does not keep (the objects' times are upload times), so from a bucket it is checked without CK405.

Every case runs from s3:// (the `--deep` ones only with ``CKPTINSPECT_STORAGE_FULL=1``). msc:// runs the `MSC_CASES` subset (healthy checkpoints of every format, hostile
pickles, storage damage), every case with ``CKPTINSPECT_STORAGE_FULL=1``: the MSC client is the slower one to set
up, and CI time is bounded.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptinspect.cli.app import app
from corpus import CASES, Case, Ctx, missing_source
from s3_server import S3Server, s3_server, upload  # noqa: F401 - the fixture

NOT_IN_OBJECT_STORAGE = {"empty_dir": "a prefix with no objects does not exist in object storage",
                         "inflight_empty_iteration_dir": "a prefix with no objects does not exist in object storage",
                         # the age rule reads the objects' last-modified times, which an upload sets to now (a case
                         # aged by backdating local times is fresh in a bucket), and an object appears whole, never
                         # mid-write: what a bucket says is asserted by test_inflight_age_rule_from_a_bucket below
                         "inflight_legacy_next_save": "an object is never half-uploaded",
                         "inflight_tracker_empty": "an object is never half-uploaded",
                         "legacy_next_save_crash_leftover": "an upload cannot backdate modification times"}


def _in_ci_run(case: Case) -> bool:
    """`--deep` cases read every item over HTTP (minutes on a loaded 2-core runner): with FULL only; the deep
    path from a bucket is also covered by `test_storage.py::test_deep_reads_stay_within_the_items`."""
    return bool(os.environ.get("CKPTINSPECT_STORAGE_FULL")) or "--deep" not in case.flags


STORAGE_CASES = [c for c in CASES if c.name not in NOT_IN_OBJECT_STORAGE and _in_ci_run(c)]


def audit(target: str, flags: tuple[str, ...]) -> tuple[int, dict[str, Any], str]:
    r = CliRunner().invoke(app, ["audit", target, "-o", "json", *flags])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    assert "Traceback" not in r.stderr, r.stderr
    return r.exit_code, json.loads(r.stdout), r.stderr


def build_case(case: Case, tmp_path: Path) -> tuple[Ctx, Path]:
    """Build `case` in `tmp_path/case` (its marker file beside it): the context and the path to audit."""
    for source in case.sources:
        if (reason := missing_source(source)) is not None:
            pytest.skip(reason)
    ctx = Ctx(tmp_path / "case", tmp_path / "PWNED")
    ctx.work.mkdir()
    return ctx, case.build(ctx)


def verdict(doc: dict[str, Any], root: str) -> tuple[str, list[tuple[str, str | None]]]:
    """Status and (code, subject) pairs, with the audited root replaced so local and remote paths compare."""
    def rel(subject: str | None) -> str | None:
        # a subject that is a path under the audited root (an integrity manifest, say) names the same object
        return "<root>" + subject[len(root):] if subject is not None and subject.startswith(root) else subject

    return doc["status"], sorted({(f["code"], rel(f["subject"])) for f in doc["findings"]},
                                 key=lambda cs: (cs[0], str(cs[1])))


MSC_CASES = re.compile(r"^(ok_|hostile_(metadata|common_pt|rng_item)$|truncated_distcp$|deleted_distcp$|"
                       r"garbage_item_deep|manifest_byte_flip|legacy_truncated_pt|no_metadata_json|zarr_broken_zarray$|"
                       r"storage_item_outside_dir$)")


def _msc_too(case: Case) -> bool:
    return bool(os.environ.get("CKPTINSPECT_STORAGE_FULL")) or bool(MSC_CASES.match(case.name))


@pytest.mark.parametrize("case", STORAGE_CASES, ids=[c.name for c in STORAGE_CASES])
def test_same_verdict_from_object_storage(case: Case, tmp_path: Path, s3_server: S3Server) -> None:  # noqa: F811
    ctx, path = build_case(case, tmp_path)
    local_code, local_doc, _ = audit(str(path), case.flags)
    prefix = f"acceptance/{case.name}"
    upload(s3_server, ctx.work, prefix)
    rel = path.relative_to(ctx.work).as_posix()
    schemes = ("s3", "msc") if _msc_too(case) else ("s3",)
    for scheme in schemes:
        url = s3_server.url(f"{prefix}/{rel}", scheme)
        code, doc, stderr = audit(url, case.flags)
        assert code == local_code, f"{scheme}: exit {code} != local {local_code}: {stderr}\n{doc.get('findings')}"
        want = verdict(local_doc, str(path))
        if case.name == "manifest_stale":
            want = (want[0], [cs for cs in want[1] if cs[0] != "CK405"])
        assert verdict(doc, url) == want, f"{scheme}: {doc['findings']}"
        assert doc["storage"]["requests"] > 0 and doc["storage"]["retries"] == 0
        assert doc["path"] == url
    assert not ctx.marker.exists(), "a pickle from the checkpoint was executed"


@pytest.mark.parametrize("name, codes, never, status", [
    ("inflight_legacy_next_save", {"CK132", "CK206"}, {"CK110"}, "complete"),  # untracked: the tracked one decides
    ("inflight_tracker_empty", {"CK502"}, {"CK133"}, "corrupt")])  # locally incomplete (being written)
def test_inflight_age_rule_from_a_bucket(name: str, codes: set[str], never: set[str], status: str, tmp_path: Path,
                                         s3_server: S3Server) -> None:  # noqa: F811
    """Locally these saves are fresh, so in progress (CK132 / CK133). From a bucket the age rule reads the objects'
    last-modified times from the listing (just uploaded: within the grace), so the legacy save still being
    uploaded has its missing shard dir as CK132, not damage (CK110); but an object is never half-uploaded, so the
    shard file cut short is damage (CK206) and the empty tracker is an empty tracker (CK502), not one being
    written (CK133): never `complete` while a verdict-deciding file is broken."""
    case = next(c for c in CASES if c.name == name)
    ctx, path = build_case(case, tmp_path)
    upload(s3_server, ctx.work, f"acceptance-age/{name}")
    url = s3_server.url(f"acceptance-age/{name}/{path.relative_to(ctx.work).as_posix()}")
    code, doc, _ = audit(url, case.flags)
    found = {f["code"] for f in doc["findings"]}
    assert codes <= found and not found & never, doc["findings"]
    assert doc["status"] == status and code == (0 if status == "complete" else 1), (doc["status"], code)


@pytest.mark.parametrize("sample", ["torch_dist", "legacy", "dcp_zstd"])
def test_values_from_a_bucket_equal_the_local_scan(sample: str, s3_server: S3Server) -> None:  # noqa: F811
    """`values` over s3:// reads each chunk's byte range with ranged GETs: the same tensors, statistics,
    fingerprints and findings as on disk (legacy: the raw storage records of `.pt` files; DCP: items' archives)."""
    root = Path(__file__).resolve().parents[2] / "sample_ckpts" / sample
    local = CliRunner().invoke(app, ["values", str(root), "-o", "json", "--progress", "none"])
    assert local.exit_code == 0, local.output
    prefix = f"values/{sample}"
    upload(s3_server, root, prefix)
    remote = CliRunner().invoke(app, ["values", s3_server.url(prefix, "s3"), "-o", "json", "--progress", "none"])
    assert remote.exit_code == 0, remote.output
    a, b = json.loads(local.stdout), json.loads(remote.stdout)
    assert b["tensors"] == a["tensors"] and b["status"] == a["status"] == "complete"
    assert all(t["fingerprint"] for t in b["tensors"])
    assert b["bytes_read"] == a["bytes_read"] > 0
