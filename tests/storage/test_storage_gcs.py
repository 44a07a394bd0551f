"""`gs://` against a real GCS JSON API server on 127.0.0.1 (`gcp-storage-emulator`, `gcs_server.py`) with the real
gcsfs client: a handful of acceptance cases (healthy legacy and DCP checkpoints, a truncated and a deleted torch_dist
data file, a hostile byte item) must give the local verdicts, and `manifest verify` from `gs://`
(consecutive ranged reads: gcsfs has no streamed read) the local results.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckptinspect.cli.app import app
from conftest import SAMPLES
from corpus import case_named
from gcs_server import GcsServer, gcs_server, upload_gcs  # noqa: F401 - the fixture
from storage_times import mtimes_near_now
from test_storage_acceptance import audit, build_case, verdict

# torch_dist is in the damaged cases; the flipped byte is in the `manifest verify` test
GCS_CASES = ("ok_legacy_checkpoint", "ok_dcp_checkpoint", "truncated_distcp", "deleted_distcp", "hostile_rng_item")


@pytest.mark.parametrize("name", GCS_CASES)
def test_same_verdict_from_gcs(name: str, tmp_path: Path, gcs_server: GcsServer) -> None:  # noqa: F811
    case = case_named(name)
    ctx, path = build_case(case, tmp_path)
    local_code, local_doc, _ = audit(str(path), case.flags)
    upload_gcs(gcs_server, ctx.work, f"acceptance/{name}")
    url = gcs_server.url(f"acceptance/{name}/{path.relative_to(ctx.work).as_posix()}")
    code, doc, stderr = audit(url, case.flags)
    assert code == local_code, f"exit {code} != local {local_code}: {stderr}\n{doc.get('findings')}"
    assert verdict(doc, url) == verdict(local_doc, str(path)), doc["findings"]
    assert doc["storage"]["requests"] > 0 and doc["path"] == url
    assert not ctx.marker.exists(), "a pickle from the checkpoint was executed"


def test_manifest_verify_from_gcs(tmp_path: Path, gcs_server: GcsServer) -> None:  # noqa: F811
    ctx, path = build_case(case_named("manifest_byte_flip"), tmp_path)
    upload_gcs(gcs_server, ctx.work, "verify/flip")
    url = gcs_server.url(f"verify/flip/{path.relative_to(ctx.work).as_posix()}")
    docs = []
    for target in (str(path), url):
        r = CliRunner().invoke(app, ["manifest", "verify", target, "-o", "json"])
        assert "Traceback" not in r.stderr, r.stderr
        doc = json.loads(r.stdout)
        docs.append((r.exit_code, doc["status"], sorted((f["code"], f["subject"]) for f in doc["findings"]),
                     [(f["name"], f["actual"], f["ok"]) for f in doc["files"]]))
    assert docs[0] == docs[1] and docs[0][0] == 1 and "CK401" in {c for c, _ in docs[0][2]}, docs


def test_gcs_listings_carry_modification_times(gcs_server: GcsServer) -> None:  # noqa: F811
    upload_gcs(gcs_server, SAMPLES / "torch_dist" / "iter_0000002", "times/td2")
    mtimes_near_now(gcs_server.url("times/td2"))
