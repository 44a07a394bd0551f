"""`manifest verify` from object storage: every object is streamed (one GET, its body hashed as it arrives) against a
real S3 API server on 127.0.0.1 (moto, `s3_server.py`) with the real boto3 / multi-storage-client clients.

The verdicts must be the local ones; a failure in the middle of a body (a reset connection, a read timeout) must be
resumed with a ranged GET from the first byte not yet received (nothing received twice, counted as a retry); an
object rewritten between the failure and the resume must not be hashed as a mix of two objects; and what a hashing
thread holds is one piece of the stream, not the object.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptinspect.cli.app import app
from s3_server import FaultProxy, S3Server, proxy, s3_server, upload  # noqa: F401 - the fixtures

MIB = 1 << 20
SIZES = {"__0_0.distcp": 3 * MIB + 17, "__1_0.distcp": 2 * MIB, "__2_0.distcp": 5000, "common.pt": 0}
PREFIX = "stream/ok"


def verify(*args: str, options: tuple[str, ...] = ()) -> tuple[int, dict[str, Any]]:
    r = CliRunner().invoke(app, [*options, "manifest", "verify", *args, "-o", "json"])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    assert "Traceback" not in r.stderr, r.stderr
    return r.exit_code, json.loads(r.stdout)


def results(doc: dict[str, Any]) -> tuple[str, list[tuple[str, str | None]], dict[str, Any]]:
    """Status, (code, subject) of the findings, and each file's (digest, ok)."""
    return (doc["status"], sorted((f["code"], f["subject"]) for f in doc["findings"]),
            {r["name"]: (r["actual"], r["ok"]) for r in doc["files"]})


@pytest.fixture(scope="module")
def ckpt(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """A dir of objects of a few MiB (several pieces each) and an empty one, its manifest written locally."""
    from ckptinspect.commands.manifest.manifest import write_manifest

    d = tmp_path_factory.mktemp("stream") / "ckpt"
    d.mkdir()
    rng = random.Random(14)
    for name, size in SIZES.items():
        (d / name).write_bytes(rng.randbytes(size))
    write_manifest(d)
    upload(s3_server, d, PREFIX)
    return d


@pytest.mark.parametrize("scheme", ["s3", "msc"])
def test_streamed_verify_gives_the_local_verdict(ckpt: Path, s3_server: S3Server, scheme: str) -> None:  # noqa: F811
    local_code, local = verify(str(ckpt))
    code, doc = verify(s3_server.url(PREFIX, scheme))
    assert local_code == code == 0 and results(doc) == results(local)
    st = doc["storage"]
    manifest = (ckpt / "integrity.json").stat().st_size
    assert st["bytes_transferred"] == sum(SIZES.values()) + manifest and st["retries"] == 0, st
    if scheme == "s3":  # one GET per object, the manifest's, and the listings of the dir and of its parent
        assert st["requests_by_op"] == {"get": len(SIZES) + 1, "list": 2}, st


@pytest.mark.parametrize("scheme", ["s3", "msc"])
def test_a_mismatching_object_is_found(ckpt: Path, s3_server: S3Server, tmp_path: Path,  # noqa: F811
                                       scheme: str) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    for p in ckpt.iterdir():
        data = bytearray(p.read_bytes())
        if p.name == "__0_0.distcp":
            data[2 * MIB + 5] ^= 0x01  # in the third piece of the stream
        (bad / p.name).write_bytes(bytes(data))
    upload(s3_server, bad, f"stream/bad_{scheme}")
    local_code, local = verify(str(bad))
    code, doc = verify(s3_server.url(f"stream/bad_{scheme}", scheme))
    assert local_code == code == 1
    assert results(doc) == results(local)
    assert [(f["code"], f["subject"]) for f in doc["findings"]] == [("CK401", "__0_0.distcp")]


def _gets(proxy: FaultProxy, name: str) -> list[str | None]:
    return [rng for path, rng in proxy.gets if path.split("?")[0].endswith(f"/{name}")]


def test_a_body_cut_mid_stream_is_resumed_from_the_first_missing_byte(ckpt: Path, s3_server: S3Server,  # noqa: F811
                                                                     proxy: FaultProxy) -> None:
    proxy.cut("/__0_0.distcp", 1, after=MIB + MIB // 2)
    code, doc = verify(s3_server.url(PREFIX))
    assert proxy.injected == 1
    assert code == 0 and results(doc) == results(verify(str(ckpt))[1])
    st = doc["storage"]
    assert st["retries"] == 1 and st["failed_requests"] == 0, st
    # the first GET asked for the whole object, the retry for the rest only, from where the cut left it
    first, resumed = _gets(proxy, "__0_0.distcp")
    assert first is None and resumed is not None and resumed.startswith("bytes=")
    start = int(resumed[len("bytes="):].rstrip("-"))
    assert 0 < start <= MIB + MIB // 2
    # nothing was received twice: every byte of every object once, and the manifest
    assert st["bytes_transferred"] == sum(SIZES.values()) + (ckpt / "integrity.json").stat().st_size, st


def test_a_stalled_body_times_out_and_is_resumed(ckpt: Path, s3_server: S3Server,  # noqa: F811
                                                 proxy: FaultProxy) -> None:
    proxy.stall_body("/__1_0.distcp", 1, after=MIB // 2, seconds=3.0)
    code, doc = verify(s3_server.url(PREFIX), options=("--storage-option", "config_kwargs.read_timeout=1"))
    assert proxy.injected == 1
    assert code == 0 and doc["status"] == "complete", doc["findings"]
    # >= 1: under load another request can also exceed the 1 s timeout (and is retried too)
    assert doc["storage"]["retries"] >= 1
    first, *resumed = _gets(proxy, "__1_0.distcp")
    assert first is None and resumed and all(r is not None and r.startswith("bytes=") for r in resumed)


def test_a_503_on_the_get_is_retried(ckpt: Path, s3_server: S3Server, proxy: FaultProxy) -> None:  # noqa: F811
    proxy.fail("/__2_0.distcp", 2)
    code, doc = verify(s3_server.url(PREFIX))
    assert proxy.injected == 2 and code == 0 and doc["storage"]["retries"] == 2


def test_a_body_that_keeps_failing_is_ck402_not_a_hang(ckpt: Path, s3_server: S3Server, proxy: FaultProxy,  # noqa: F811
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTINSPECT_STORAGE_ATTEMPTS", "3")
    proxy.cut("/__0_0.distcp", 100, after=1000)
    code, doc = verify(s3_server.url(PREFIX))
    assert proxy.injected == 3
    assert code == 1 and [(f["code"], f["subject"]) for f in doc["findings"]] == [("CK402", "__0_0.distcp")]
    assert "RetriesExhausted" in doc["findings"][0]["details"]["reason"]
    assert doc["storage"]["failed_requests"] == 1 and doc["storage"]["retries"] == 2
    ok = {r["name"]: r["ok"] for r in doc["files"]}
    assert ok == {n: n != "__0_0.distcp" for n in SIZES}


def test_an_object_rewritten_before_the_resume_is_not_hashed_as_a_mix(ckpt: Path, s3_server: S3Server,  # noqa: F811
                                                                      proxy: FaultProxy, tmp_path: Path) -> None:
    """The resume is conditional on the listed ETag: the rewritten object answers 412, reported as unreadable
    (changed), never a digest of the old object's head and the new one's tail."""
    upload(s3_server, ckpt, "stream/rewritten")
    key = "stream/rewritten/__0_0.distcp"
    new = bytes(reversed((ckpt / "__0_0.distcp").read_bytes()))
    proxy.cut("/rewritten/__0_0.distcp", 1, after=MIB,
              then=lambda: s3_server.client.put_object(Bucket=s3_server.bucket, Key=key, Body=new))
    code, doc = verify(s3_server.url("stream/rewritten"))
    assert code == 1 and [(f["code"], f["subject"]) for f in doc["findings"]] == [("CK402", "__0_0.distcp")]
    assert "ObjectChanged" in doc["findings"][0]["details"]["reason"]


_MEMORY = textwrap.dedent("""
    import hashlib, json, sys, tracemalloc
    from ckptinspect.io import location
    path = location(sys.argv[1])
    info = path.object_info()
    tracemalloc.start()
    h = hashlib.sha256()
    pieces = 0
    for piece in path.store.stream(path.key, info, 1 << 20):
        h.update(piece)
        pieces += 1
    print(json.dumps({"digest": h.hexdigest(), "peak": tracemalloc.get_traced_memory()[1], "pieces": pieces}))
""")


def test_memory_is_the_piece_size_not_the_object_size(s3_server: S3Server) -> None:  # noqa: F811
    """A fresh process (the server's own memory is not the client's) streams a 48 MiB object: the peak of what
    Python allocated while streaming is a few pieces of 1 MiB, not the object."""
    blob = random.Random(7).randbytes(48 * MIB)
    s3_server.client.put_object(Bucket=s3_server.bucket, Key="stream/big/blob", Body=blob)
    r = subprocess.run([sys.executable, "-c", _MEMORY, s3_server.url("stream/big/blob")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    import hashlib

    assert got["digest"] == hashlib.sha256(blob).hexdigest()
    assert got["pieces"] >= 48  # many pieces of at most 1 MiB each ...
    assert got["peak"] < 8 * MIB, got  # ... and a few of them held at a time, whatever the object's size
