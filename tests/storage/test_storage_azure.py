"""`az://` and `abfs://` against a real Azure Blob server on 127.0.0.1 (Azurite, `azurite_server.py`) with the real
adlfs client: a handful of acceptance cases (healthy legacy and DCP checkpoints, a truncated and a deleted torch_dist
data file, a hostile byte item) must give the local verdicts, and `manifest verify` from `az://` (consecutive ranged
reads: adlfs has no streamed read in its sync API) the local results. The connection string reaches adlfs the two
ways a user gives it: ``AZURE_STORAGE_CONNECTION_STRING`` (the fixture) and ``--storage-option connection_string=``.
Also: a blob rewritten after the listing is `ObjectChanged` (reads are If-Match), a rejected key and an unreachable
endpoint exit 2 quickly without printing the key, and ``abfs://container@account...`` names the account.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from azurite_server import (ACCOUNT_KEY, AZURE_ENV_KEYS, AzuriteServer, azurite_server,  # noqa: F401 - the fixture
                             upload_azure)
from ckptinspect.cli.app import app
from conftest import SAMPLES
from corpus import case_named
from s3_server import free_port
from storage_times import mtimes_near_now
from test_storage_acceptance import audit, build_case, verdict

# the same cases as tests/storage/test_storage_gcs.py: torch_dist is in the damaged ones, the flipped byte in `manifest verify`
AZ_CASES = ("ok_legacy_checkpoint", "ok_dcp_checkpoint", "truncated_distcp", "deleted_distcp", "hostile_rng_item")


def _same_verdict(name: str, tmp_path: Path, server: AzuriteServer, scheme: str) -> None:
    case = case_named(name)
    ctx, path = build_case(case, tmp_path)
    local_code, local_doc, _ = audit(str(path), case.flags)
    upload_azure(server, ctx.work, f"acceptance-{scheme}/{name}")
    url = server.url(f"acceptance-{scheme}/{name}/{path.relative_to(ctx.work).as_posix()}", scheme)
    code, doc, stderr = audit(url, case.flags)
    assert code == local_code, f"exit {code} != local {local_code}: {stderr}\n{doc.get('findings')}"
    assert verdict(doc, url) == verdict(local_doc, str(path)), doc["findings"]
    assert doc["storage"]["requests"] > 0 and doc["path"] == url
    assert not ctx.marker.exists(), "a pickle from the checkpoint was executed"


@pytest.mark.parametrize("name", AZ_CASES)
def test_same_verdict_from_az(name: str, tmp_path: Path, azurite_server: AzuriteServer) -> None:  # noqa: F811
    _same_verdict(name, tmp_path, azurite_server, "az")


@pytest.mark.parametrize("name", ["truncated_distcp", "ok_legacy_checkpoint"])
def test_same_verdict_from_abfs(name: str, tmp_path: Path, azurite_server: AzuriteServer) -> None:  # noqa: F811
    """``abfs://container@account.dfs.core.windows.net/key``, the form Azure's own tools print (the account comes
    from the connection string here: Azurite answers only on its own endpoint)."""
    _same_verdict(name, tmp_path, azurite_server, "abfs")


def _verify(target: str, *options: str) -> tuple[int, str, list[tuple[str, str]], list[tuple[str, str, bool]]]:
    r = CliRunner().invoke(app, [*options, "manifest", "verify", target, "-o", "json"])
    assert "Traceback" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    return (r.exit_code, doc["status"], sorted((f["code"], f["subject"]) for f in doc["findings"]),
            [(f["name"], f["actual"], f["ok"]) for f in doc["files"]])


def test_manifest_verify_from_az(tmp_path: Path, azurite_server: AzuriteServer,  # noqa: F811
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    ctx, path = build_case(case_named("manifest_byte_flip"), tmp_path)
    upload_azure(azurite_server, ctx.work, "verify/flip")
    url = azurite_server.url(f"verify/flip/{path.relative_to(ctx.work).as_posix()}")
    local = _verify(str(path))
    assert local[0] == 1 and "CK401" in {c for c, _ in local[2]}, local
    assert _verify(url) == local  # the connection string from AZURE_STORAGE_CONNECTION_STRING
    # ... and given as a storage option instead, as a user without the variable would
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    assert _verify(url, "--storage-option", f"connection_string={azurite_server.connection_string}") == local


def test_wrong_account_key_is_exit_2_without_the_key(azurite_server: AzuriteServer,  # noqa: F811
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection string whose key the server rejects (403 on the listing) exits 2 naming the location, and
    neither the key given nor the key in the environment is printed."""
    wrong = "A" * 86 + "=="
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       azurite_server.connection_string.replace(ACCOUNT_KEY, wrong))
    r = CliRunner().invoke(app, ["audit", azurite_server.url("verify/flip")])
    assert r.exit_code == 2 and "Traceback" not in r.stderr, r.stderr
    assert "az://ckpts/verify/flip" in r.stderr, r.stderr
    assert wrong not in r.output + r.stderr and "AccountKey" not in r.output + r.stderr


def test_unreachable_endpoint_fails_fast_with_counted_retries(azurite_server: AzuriteServer,  # noqa: F811
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing listens at the endpoint: exit 2 after ckptinspect's own attempts, in about a second. The Azure SDK's
    own retries (3, after 15, 18 and 24 s) are turned off, as the other clients' are: with them this took minutes."""
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_server.connection_string.replace(
        azurite_server.endpoint, f"http://127.0.0.1:{free_port()}"))
    monkeypatch.setenv("CKPTINSPECT_STORAGE_ATTEMPTS", "2")
    t0 = time.monotonic()
    r = CliRunner().invoke(app, ["audit", azurite_server.url("verify/flip")])
    took = time.monotonic() - t0
    assert r.exit_code == 2 and "cannot list or reach" in r.stderr and "after 2 attempts" in r.stderr, r.stderr
    assert took < 15, f"{took:.1f} s: the Azure SDK retried on its own"
    assert ACCOUNT_KEY not in r.output + r.stderr


def test_abfs_url_names_the_account(monkeypatch: pytest.MonkeyPatch) -> None:
    """``abfs://container@acct.dfs.core.windows.net`` names the account: the client is built for it without
    ``AZURE_STORAGE_ACCOUNT_NAME`` (as fsspec.open() does), and the container alone is the path root. A
    ``--storage-option account_name=`` still wins."""
    from ckptinspect.io.fsspec_backend import FsspecBackend
    from ckptinspect.io.url import Scheme

    for k in AZURE_ENV_KEYS:
        monkeypatch.delenv(k, raising=False)
    b = FsspecBackend(Scheme.ABFSS, "c@acct.dfs.core.windows.net", {"account_key": ACCOUNT_KEY})
    assert (b.root, b.fs.account_name, b.fs.account_url) == ("c", "acct", "https://acct.blob.core.windows.net")
    b = FsspecBackend(Scheme.ABFS, "c@acct.dfs.core.windows.net", {"account_name": "other", "account_key": "a2V5"})
    assert (b.root, b.fs.account_name) == ("c", "other")


@pytest.mark.parametrize("scheme", ["az", "abfs"])
def test_blob_rewritten_after_the_listing_is_object_changed(scheme: str,
                                                            azurite_server: AzuriteServer) -> None:  # noqa: F811
    """Azure reads are conditional on the listed ETag, as S3's are: a blob rewritten with the same size between the
    listing and the read is `ObjectChanged` (CK220), never the new blob's bytes read as if they were the old."""
    from ckptinspect.io.backend import ObjectChanged
    from ckptinspect.io.session import reset
    from ckptinspect.io.url import location

    key = f"changed-{scheme}/blob.bin"
    azurite_server.fs.pipe_file(f"{azurite_server.container}/{key}", b"a" * 4096)
    reset()
    path = location(azurite_server.url(key, scheme))
    assert path.open_reader(keep=False).read(16) == b"a" * 16  # listed (ETag kept) and read while unchanged
    azurite_server.fs.pipe_file(f"{azurite_server.container}/{key}", b"b" * 4096)
    with pytest.raises(ObjectChanged):
        path.open_reader(window=(1024, 16), keep=False).read(16)


def test_azure_listings_carry_modification_times(azurite_server: AzuriteServer) -> None:  # noqa: F811
    upload_azure(azurite_server, SAMPLES / "torch_dist" / "iter_0000002", "times/td2")
    mtimes_near_now(azurite_server.url("times/td2", "az"))
