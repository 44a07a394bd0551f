"""Object storage: URLs, the byte budget, manifests, and faults, against a real S3 API server on 127.0.0.1.

The server is moto's standalone server (`s3_server.py`); the clients are the real boto3 (s3://; s3fs where boto3
is missing) / multi-storage-client. Faults come from `FaultProxy`, a loopback HTTP proxy that answers 503 SlowDown, stalls, or lets a test
replace an object between the listing and the read.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptinspect.cli.app import app
from ckptinspect.io.objpath import coalesce
from ckptinspect.io.session import nest, parse_option
from ckptinspect.io.url import Scheme, split_url
from conftest import SAMPLES
from s3_server import FaultProxy, S3Server, proxy, s3_server, upload  # noqa: F401 - the fixtures
from storage_times import mtimes_near_now

TD2 = SAMPLES / "torch_dist" / "iter_0000002"


def cli(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, list(args))
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    assert "Traceback" not in r.stderr, r.stderr
    return r.exit_code, r.stdout, r.stderr


def audit_json(*args: str) -> tuple[int, dict[str, Any]]:
    code, out, err = cli("audit", *args, "-o", "json")
    assert code in (0, 1), err
    return code, json.loads(out)


def codes(doc: dict[str, Any]) -> set[str]:
    return {f["code"] for f in doc["findings"]}


@pytest.fixture(scope="module")
def td2_url(s3_server: S3Server) -> str:  # noqa: F811
    upload(s3_server, TD2, "unit/td2/iter_0000002")
    return s3_server.url("unit/td2/iter_0000002")


# --- URLs and options --------------------------------------------------------------------------------------------


def test_split_url() -> None:
    assert split_url("s3://bucket/a/b/") == (Scheme.S3, "bucket", "a/b")
    assert split_url("msc://profile/x") == (Scheme.MSC, "profile", "x")
    assert split_url("abfs://c@acct.dfs.core.windows.net/p") == (Scheme.ABFS, "c@acct.dfs.core.windows.net", "p")


@pytest.mark.parametrize("url", ["s3://", "s3://b/../x", "s3://b/x?versionId=1"])
def test_malformed_urls_are_usage_errors(url: str) -> None:
    code, _, err = cli("sniff", url)
    assert code == 2 and "Traceback" not in err


def test_missing_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "gcsfs", None)  # as if the [gcs] extra were not installed: import fails
    code, _, err = cli("audit", "gs://bucket/ckpt")
    assert code == 2
    assert "ckptinspect[gcs]" in err and "gcsfs" in err


def test_s3_backend_is_boto3_and_s3fs_where_boto3_is_missing(td2_url: str, s3_server: S3Server,  # noqa: F811
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`[s3]` is boto3 (co-installable with any boto3: s3fs's aiobotocore pins botocore); an environment with s3fs
    and no boto3 keeps working through s3fs, with the same verdict, findings and requests."""
    import sys

    from ckptinspect.io import location
    from ckptinspect.io.boto3_backend import Boto3Backend
    from ckptinspect.io.fsspec_backend import FsspecBackend
    from ckptinspect.io.session import reset

    reset()
    assert isinstance(location(td2_url).store.backend, Boto3Backend)
    code, doc = audit_json(td2_url)
    monkeypatch.setitem(sys.modules, "boto3", None)  # as if boto3 were not installed: import fails
    reset()
    assert isinstance(location(td2_url).store.backend, FsspecBackend)
    code2, doc2 = audit_json(td2_url)
    assert (code2, doc2["status"], doc2["findings"]) == (code, doc["status"], doc["findings"])
    assert doc2["storage"]["requests_by_op"] == doc["storage"]["requests_by_op"]
    monkeypatch.setitem(sys.modules, "s3fs", None)
    code, _, err = cli("audit", td2_url)
    assert code == 2 and "ckptinspect[s3]" in err and "boto3" in err


def test_s3_storage_options_keep_s3fs_names(td2_url: str, s3_server: S3Server,  # noqa: F811
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """`--storage-option` takes s3fs's names on the boto3 backend too; an unknown one is exit 2, not a traceback."""
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    code, out, _ = cli("--storage-option", f"client_kwargs.endpoint_url={s3_server.endpoint}", "audit", td2_url,
                       "-o", "json")
    doc = json.loads(out)
    assert code in (0, 1) and doc["storage"]["requests"] > 0 and doc["path"] == td2_url
    code2, out2, _ = cli("--storage-option", f"endpoint_url={s3_server.endpoint}", "--storage-option", "key=testing",
                         "--storage-option", "config_kwargs.read_timeout=5", "audit", td2_url, "-o", "json")
    assert (code2, json.loads(out2)["findings"]) == (code, doc["findings"])
    code, _, err = cli("--storage-option", "no_such_option=1", "audit", td2_url)
    assert code == 2 and "no_such_option" in err


def test_api_takes_storage_options_explicitly(td2_url: str, s3_server: S3Server,  # noqa: F811
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Every API function takes the storage options itself (`storage_options=`), as `--storage-option` gives them to
    the CLI: the same verdict as the CLI's, with no process-wide setup by the caller."""
    import ckptinspect
    from ckptinspect.io.session import reset

    monkeypatch.delenv("AWS_ENDPOINT_URL")
    opts = {"client_kwargs": {"endpoint_url": s3_server.endpoint}}
    code, out, _ = cli("--storage-option", f"client_kwargs.endpoint_url={s3_server.endpoint}", "audit", td2_url,
                       "-o", "json")
    reset()  # what a fresh interpreter has: no options anywhere
    r = ckptinspect.audit(td2_url, storage_options=opts)
    assert (r.exit_code(), r.to_dict()["findings"]) == (code, json.loads(out)["findings"])
    assert r.to_dict()["storage"]["requests"] > 0
    for call in (lambda o: ckptinspect.sniff(td2_url, storage_options=o),
                 lambda o: ckptinspect.info(td2_url, storage_options=o),
                 lambda o: ckptinspect.scan(td2_url, storage_options=o),
                 lambda o: ckptinspect.coverage(td2_url, storage_options=o),
                 lambda o: ckptinspect.resume(td2_url, tp=1, pp=1, storage_options=o),
                 lambda o: ckptinspect.diff(td2_url, td2_url, storage_options=o)):
        call(opts)  # reaches the server
        with pytest.raises(ckptinspect.UsageError):
            call({"client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}})  # nothing listens there: exit 2's error


def test_storage_option_parsing() -> None:
    pairs = [parse_option(o) for o in ("anon=true", "config_kwargs.read_timeout=5", "client_kwargs.region_name=x")]
    assert nest(pairs) == {"anon": True, "config_kwargs": {"read_timeout": 5}, "client_kwargs": {"region_name": "x"}}
    with pytest.raises(ValueError):
        parse_option("novalue")


def test_coalesce_merges_close_ranges_only() -> None:
    assert coalesce([(100, 200), (0, 50), (210, 300)], 1000) == [(0, 300)]
    assert coalesce([(0, 10), (1 << 20, (1 << 20) + 10)], 1 << 21) == [(0, 10), (1 << 20, (1 << 20) + 10)]
    assert coalesce([(990, 2000)], 1000) == [(990, 1000)]


def test_file_url_is_a_local_path() -> None:
    code, out, _ = cli("sniff", f"file://{TD2.resolve()}", "-o", "json")
    assert code == 0 and json.loads(out)["format"] == "torch_dist"
    assert "storage" not in json.loads(out)


def test_missing_prefix_and_bucket_are_usage_errors(s3_server: S3Server) -> None:  # noqa: F811
    assert cli("audit", s3_server.url("no/such/prefix"))[0] == 2
    assert cli("audit", "s3://no-such-bucket-here/x")[0] == 2


def test_unreachable_endpoint_is_exit_2_not_a_hang(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from s3_server import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("CKPTINSPECT_STORAGE_ATTEMPTS", "2")
    code, _, err = cli("audit", s3_server.url("unit/td2/iter_0000002"))
    assert code == 2 and "cannot list or reach" in err
    assert "testing" not in err  # the secret key never appears


AZ_SECRET = "c2VjcmV0LWFjY291bnQta2V5"  # base64, as an account key is; nothing listens at 127.0.0.1:1


@pytest.mark.parametrize("conn", [
    f"DefaultEndpointsProtocol=http;AccountName=a;AccountKey={AZ_SECRET};BlobEndpoint=http://127.0.0.1:1/a;",
    f"AccountKey={AZ_SECRET}",  # missing details: adlfs cannot build a client
    f"BlobEndpoint=http://127.0.0.1:1/a;SharedAccessSignature=sv=2020-01-01&sig={AZ_SECRET}",
])
@pytest.mark.parametrize("how", ["env", "option"])
def test_azure_connection_string_secrets_are_not_printed(conn: str, how: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An az:// location that cannot be configured or reached exits 2 without printing the connection string's
    key or SAS signature, whether it came from ``AZURE_STORAGE_CONNECTION_STRING`` or ``--storage-option``."""
    monkeypatch.setenv("CKPTINSPECT_STORAGE_ATTEMPTS", "1")
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    args = ["audit", "az://c/run42"]
    if how == "env":
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", conn)
    else:
        args = ["--storage-option", f"connection_string={conn}", *args]
    code, out, err = cli(*args)
    assert code == 2 and "az://c" in err, err
    assert AZ_SECRET not in out + err


# --- the byte budget ---------------------------------------------------------------------------------------------


def test_metadata_level_commands_read_only_metadata(td2_url: str) -> None:
    """audit / info / coverage / resume transfer the metadata objects, plus (audit's safety scan) the byte items
    (rng state, ...) inside the data files, never the tensor data beyond them. The sample's data files are a few
    tens of KB, so the scan's coalescing reads each file that holds byte items in one GET: the bound is those
    files, and one request each."""
    from ckptinspect.formats import read_checkpoint

    meta_names = (".metadata", "metadata.json", "common.pt")
    meta = sum((TD2 / n).stat().st_size for n in meta_names)
    ckpt = read_checkpoint(TD2, str(TD2))
    with_items = {o.storage.file for o in ckpt.objects if o.storage is not None and o.key != "common_state/shard_0_1"}
    scanned = sum((TD2 / f).stat().st_size for f in with_items)
    data = sum(p.stat().st_size for p in TD2.glob("*.distcp"))
    assert scanned < data  # some data files hold tensors only: they must not be read at all
    code, doc = audit_json(td2_url)
    assert code == 0 and doc["status"] == "complete"
    st = doc["storage"]
    assert meta < st["bytes_transferred"] <= meta + scanned, st
    # 2 listings: the checkpoint's prefix, and its parent's (where a reader looks for `latest_train_state.pt`)
    assert st["requests"] == 2 + len(meta_names) + len(with_items) and st["retries"] == 0, st
    assert st["requests_by_op"] == {"list": 2, "get": len(meta_names) + len(with_items)}, st
    for cmd in (["info", td2_url], ["coverage", td2_url], ["resume", td2_url, "--tp", "2", "--pp", "2"]):
        code, out, err = cli(*cmd, "-o", "json")
        assert code in (0, 1), err
        got = json.loads(out)["storage"]
        assert got["bytes_transferred"] == meta and got["requests"] <= 2 + len(meta_names), (cmd, got)


def test_every_listing_page_is_one_counted_request(td2_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """S3 is listed page by page: `requests` counts HTTP requests, not listing calls (2 entries a page here)."""
    import ckptinspect.io.boto3_backend as bb

    code, doc = audit_json(td2_url)
    monkeypatch.setattr(bb, "LIST_PAGE_KEYS", 2)
    code2, doc2 = audit_json(td2_url)
    entries = len(list(TD2.iterdir())) + 1  # the checkpoint prefix, and its parent (one sub-prefix)
    assert (code2, codes(doc2)) == (code, codes(doc))
    lists, lists2 = doc["storage"]["requests_by_op"]["list"], doc2["storage"]["requests_by_op"]["list"]
    assert lists == 2 and lists2 >= entries // 2, (lists, lists2)
    assert doc2["storage"]["requests"] - doc["storage"]["requests"] == lists2 - lists


def test_deep_reads_stay_within_the_items(td2_url: str) -> None:
    """--deep reads every stored item (the storage check per item, the safety scan coalesced per file): at most
    twice the data, never a data file read past what `.metadata` places in it."""
    code, doc = audit_json(td2_url, "--deep")
    assert code == 0 and "CK205" not in codes(doc)
    data = sum(p.stat().st_size for p in TD2.glob("*.distcp"))
    meta = sum((TD2 / n).stat().st_size for n in (".metadata", "metadata.json", "common.pt"))
    assert doc["storage"]["bytes_transferred"] <= 2 * data + meta


# --- manifests ---------------------------------------------------------------------------------------------------


def test_manifest_write_to_url_then_verify(s3_server: S3Server, tmp_path: Path) -> None:  # noqa: F811
    ck = tmp_path / "ck"
    shutil.copytree(TD2, ck)
    upload(s3_server, ck, "manifest/ok")
    url = s3_server.url("manifest/ok")
    assert cli("manifest", "write", url)[0] == 2  # never writes into a bucket unless --out says so
    code, _, err = cli("manifest", "write", url, "--out", f"{url}/integrity.json")
    assert code == 0, err
    local = tmp_path / "local.json"
    assert cli("manifest", "write", str(ck), "--out", str(local))[0] == 0
    body = s3_server.client.get_object(Bucket=s3_server.bucket, Key="manifest/ok/integrity.json")["Body"].read()
    assert body == local.read_bytes()  # byte-identical to the local (= Megatron's) manifest
    code, out, _ = cli("manifest", "verify", url, "-o", "json")
    doc = json.loads(out)
    assert code == 0 and doc["storage"]["bytes_transferred"] >= sum(p.stat().st_size for p in ck.iterdir())
    code, out, _ = cli("manifest", "verify", url, "--shard", "1/3", "-o", "json")
    assert code == 0
    # one flipped byte in the bucket: CK401
    name = sorted(p.name for p in ck.glob("*.distcp"))[0]
    blob = bytearray((ck / name).read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    s3_server.client.put_object(Bucket=s3_server.bucket, Key=f"manifest/ok/{name}", Body=bytes(blob))
    code, doc = audit_json(url, "--hash")  # audit hashes the listed files only when asked
    assert code == 1 and "CK401" in codes(doc)


# --- faults ------------------------------------------------------------------------------------------------------


def test_throttling_is_retried_and_reported(td2_url: str, proxy: FaultProxy) -> None:
    proxy.fail("/.metadata", 2)
    proxy.fail("list-type=2", 1)
    code, doc = audit_json(td2_url)
    assert proxy.injected == 3
    assert code == 0 and doc["status"] == "complete"
    assert doc["storage"]["retries"] == 3 and doc["storage"]["failed_requests"] == 0
    assert "CK225" in codes(doc)


def test_persistent_5xx_is_a_finding_not_a_hang(td2_url: str, proxy: FaultProxy,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTINSPECT_STORAGE_ATTEMPTS", "3")
    proxy.fail("/common.pt", 100)
    code, doc = audit_json(td2_url)
    assert code == 1 and {"CK224", "CK206"} <= codes(doc)
    assert doc["storage"]["failed_requests"] == 1


def test_timeouts_are_retried(td2_url: str, proxy: FaultProxy) -> None:
    proxy.stall("/metadata.json", 1, 3.0)
    code, out, err = cli("--storage-option", "config_kwargs.read_timeout=1", "audit", td2_url, "-o", "json")
    doc = json.loads(out)
    assert code == 0, err
    assert doc["storage"]["retries"] >= 1 and "CK225" in codes(doc)


def test_object_replaced_mid_audit_is_a_finding(s3_server: S3Server, proxy: FaultProxy,  # noqa: F811
                                                tmp_path: Path) -> None:
    upload(s3_server, TD2, "replaced/iter_0000002")
    url = s3_server.url("replaced/iter_0000002")
    key = "replaced/iter_0000002/common.pt"
    proxy.before("/common.pt", lambda: s3_server.client.put_object(
        Bucket=s3_server.bucket, Key=key, Body=(TD2 / "common.pt").read_bytes() + b"\0"))
    code, doc = audit_json(url)
    assert code == 1 and "CK220" in codes(doc)
    f = next(f for f in doc["findings"] if f["code"] == "CK220")
    assert f["subject"] == "common.pt" and f["details"]["url"].endswith(key)


def test_faults_in_the_parallel_byte_item_reads_are_retried_and_reported(s3_server: S3Server,  # noqa: F811
                                                                          proxy: FaultProxy) -> None:
    """The safety scan's GETs run in worker threads ahead of the scan: a 503 there is retried and counted, and a
    data file rewritten between the listing and its GET is CK220 on that file, as for a sequential read."""
    from ckptinspect.formats import read_checkpoint

    upload(s3_server, TD2, "replaced_item/iter_0000002")
    ckpt = read_checkpoint(TD2, str(TD2))
    victim = sorted({o.storage.file for o in ckpt.objects if o.storage is not None})[0]
    key = f"replaced_item/iter_0000002/{victim}"
    proxy.fail(".distcp", 2)
    proxy.before(f"/{victim}", lambda: s3_server.client.put_object(
        Bucket=s3_server.bucket, Key=key, Body=(TD2 / victim).read_bytes()[::-1]))
    code, doc = audit_json(s3_server.url("replaced_item/iter_0000002"))
    assert code == 1 and {"CK220", "CK225"} <= codes(doc), doc["findings"]
    assert any(f["code"] == "CK220" and f["subject"] == victim for f in doc["findings"])
    assert doc["storage"]["retries"] == 2


def test_a_parent_that_may_not_be_listed_falls_back_to_asking_the_keys(s3_server: S3Server,  # noqa: F811
                                                                        proxy: FaultProxy) -> None:
    """A policy may allow listing the checkpoint's prefix but not its parent's: the sibling questions are then
    asked one key at a time (HEAD), and the audit is the same, not a usage error."""
    upload(s3_server, TD2, "denyparent/iter_0000002")
    proxy.deny("prefix=denyparent%2F&", 100)
    code, doc = audit_json(s3_server.url("denyparent/iter_0000002"))
    assert proxy.injected >= 1
    assert code == 0 and doc["status"] == "complete", doc["findings"]
    assert doc["storage"]["requests_by_op"].get("head", 0) >= 1


def test_diff_and_ls_read_urls(s3_server: S3Server, td2_url: str) -> None:  # noqa: F811
    code, out, err = cli("diff", td2_url, str(TD2), "-o", "json")
    assert code == 0, err
    upload(s3_server, SAMPLES / "torch_dist", "unit/save")
    code, out, err = cli("ls", s3_server.url("unit/save"), "-o", "json")
    local = json.loads(cli("ls", str(SAMPLES / "torch_dist"), "-o", "json")[1])
    doc = json.loads(out)
    assert code in (0, 1) and [i["status"] for i in doc["iterations"]] == [i["status"] for i in local["iterations"]]


@pytest.mark.parametrize("name", ["ok_torch_dist_save_dir", "hostile_rng_item"])
def test_scan_of_a_url_gives_the_local_verdict(name: str, s3_server: S3Server, tmp_path: Path) -> None:  # noqa: F811
    """`scan` walks a bucket prefix as it walks a dir: same status, findings and pickles (subjects relative)."""
    from corpus import Ctx, case_named

    case = case_named(name)
    ctx = Ctx(tmp_path / "case", tmp_path / "PWNED")
    ctx.work.mkdir()
    path = case.build(ctx)
    upload(s3_server, ctx.work, f"scan/{name}")
    url = s3_server.url(f"scan/{name}/{path.relative_to(ctx.work).as_posix()}")
    docs = []
    for target in (str(path), url):
        code, out, err = cli("scan", target, "-o", "json")
        doc = json.loads(out)
        docs.append((code, doc["status"], doc["pickles_scanned"], sorted((f["code"], f["subject"])
                                                                         for f in doc["findings"])))
    assert docs[0] == docs[1] and docs[0][1] == case.status, docs
    assert docs[0][2] > 0 and not ctx.marker.exists()


def test_a_second_pass_over_a_large_object_costs_no_second_transfer(s3_server: S3Server) -> None:  # noqa: F811
    """The pickle walk reads a large `.metadata`, then the unpickler reads it again: the reader keeps the blocks,
    so the object is transferred once, in a few growing blocks."""
    from ckptinspect.io import location
    from ckptinspect.io.session import reset

    blob = os.urandom(20 << 20)
    s3_server.client.put_object(Bucket=s3_server.bucket, Key="big/.metadata", Body=blob)
    session = reset()
    with location(s3_server.url("big/.metadata")).open_reader() as f:
        assert f.read() == blob
        f.seek(0)
        assert f.read(1000) == blob[:1000] and f.read() == blob[1000:]
    snap = session.stats.snapshot()
    assert snap.bytes == len(blob) and dict(snap.by_op)["get"] <= 4, snap
    session = reset()  # a reader that reads all of it (`.metadata`) asks for the largest blocks at once
    with location(s3_server.url("big/.metadata")).open_reader(whole=True) as f:
        assert f.read(1 << 20) == blob[:1 << 20] and f.read() == blob[1 << 20:]
    assert dict(session.stats.snapshot().by_op)["get"] == 1


def test_listings_carry_modification_times_with_every_s3_client(td2_url: str, s3_server: S3Server,  # noqa: F811
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from ckptinspect.io.session import reset

    for scheme in ("s3", "msc"):
        reset()
        mtimes_near_now(s3_server.url("unit/td2/iter_0000002", scheme))
    monkeypatch.setitem(sys.modules, "boto3", None)  # s3fs
    reset()
    mtimes_near_now(td2_url)
    reset()


@pytest.mark.parametrize("value, want", [
    ("2026-12-02T08:00:00Z", 1796198400.0), ("2026-12-02T08:00:00.000+00:00", 1796198400.0),
    (1796198400, 1796198400.0), ("yesterday", None), (None, None), (True, None), (object(), None)])
def test_listing_times_are_read_without_error(value: object, want: float | None) -> None:
    from ckptinspect.io.backend import posix_time

    assert posix_time(value) == want
