"""Object storage: what `audit` transfers from a real S3 API server, vs the metadata objects and vs the peers;
`manifest verify` time from the server vs a serial single-stream verifier.

A moto server (in this process, on 127.0.0.1) holds the checkpoint; every request of every client goes through a
counting HTTP proxy, so bytes and requests are measured the same way for ckptinspect and for the peers:

* ckptinspect `audit s3://...` (a fresh subprocess, metadata level) — and its verdict must equal the local audit's;
* torch's `FsspecReader(url).read_metadata()` (s3fs) — `.metadata` only, no verdict;
* Megatron-Core's MSC path: `msc.torch.MultiStorageFileSystemReader(url).read_metadata()` (what
  `dist_checkpointing` uses for `msc://`), plus `metadata.json` and `common.pt` read with MSC (what Megatron reads
  before the tensors) — the inputs of a verdict, not one.

The data objects: moto keeps objects in memory and hashes every byte, so a checkpoint of TBs of (sparse) tensor
data cannot be uploaded. Each `.distcp` is uploaded as its first bytes up to the end of its last byte item (the
generator writes byte items first), and its listed size is set to the real file's size inside moto. A metadata-level
audit reads nothing past the byte items: the verdict comparison with the local audit proves it.

The audit is judged under both accountings of "the metadata objects" (printed): (a) `.metadata` + `metadata.json` +
`common.pt` only; (b) those plus every data file that holds byte items, counted as its byte items' bytes (the
sharded non-tensor state DCP unpickles on load, which the pickle-safety scan reads).

`manifest verify` (`--verify-mb`): a second moto server in its own process holds `--files` random objects and their
manifest; ckptinspect and a serial single-stream boto3 verifier (one GET per object, like Megatron's verifier over
a bucket) run alternately `--repeat` times, each in a fresh process, timed with and without the process start,
with the CPU time of their work; `--link-mibps N` repeats the comparison with every connection capped at N MiB/s
(`_shaper.py`, its own process: a model of object storage's per-connection throughput).

    python tools/make_synthetic_ckpt.py /tmp/ck200k --chunks 200000
    python benchmarks/bench_object_storage.py /tmp/ck200k [--verify-mb 512] [--files 8] [--repeat 3]
        [--link-mibps 64] [--verify-only | --verify-mb 0]

Targets: audit bytes ≤ 1.05 × the metadata objects' bytes, requests ≤ 10 + their number; verify faster than serial.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from s3_server import FaultProxy, msc_config  # noqa: E402

BUCKET = "bench"
META = (".metadata", "metadata.json", "common.pt")


class Counter:
    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy

    def __enter__(self) -> Counter:
        self.r0, self.b0 = self.proxy.requests, self.proxy.bytes_out
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.t0
        self.requests = self.proxy.requests - self.r0
        self.bytes = self.proxy.bytes_out - self.b0


def byte_items(ckpt: Path) -> dict[str, tuple[int, int]]:
    """data file -> (end of its last byte item, bytes of its byte items): what the safety scan must read."""
    from ckptinspect.formats import read_checkpoint

    c = read_checkpoint(ckpt, str(ckpt))
    out: dict[str, tuple[int, int]] = {}
    for o in c.objects:
        if o.storage is not None and o.key != "common_state/shard_0_1":
            end, n = out.get(o.storage.file, (0, 0))
            out[o.storage.file] = (max(end, o.storage.end), n + o.storage.length)
    return out


def upload_checkpoint(client: object, ckpt: Path, prefix: str) -> None:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    head = {name: end for name, (end, _) in byte_items(ckpt).items()}
    bucket = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].buckets[BUCKET]
    for p in sorted(ckpt.iterdir()):
        key = f"{prefix}/{p.name}"
        if p.name.endswith(".distcp"):
            with open(p, "rb") as f:
                client.put_object(Bucket=BUCKET, Key=key, Body=f.read(head.get(p.name, 0)))  # type: ignore[attr-defined]
            bucket.keys[key].contentsize = p.stat().st_size  # the listing shows the real size
        else:
            client.upload_file(str(p), BUCKET, key)  # type: ignore[attr-defined]


def verdict(doc: dict) -> tuple[str, list[str]]:
    return doc["status"], sorted({f["code"] for f in doc["findings"]})


def bench_audit(ckpt: Path, proxy: FaultProxy, client: object, peers_only: bool = False) -> None:
    prefix = "ckpt/" + ckpt.name
    t = time.perf_counter()
    if peers_only:  # the peers read the metadata objects only
        for n in META:
            client.upload_file(str(ckpt / n), BUCKET, f"{prefix}/{n}")  # type: ignore[attr-defined]
    else:
        upload_checkpoint(client, ckpt, prefix)
    print(f"uploaded in {time.perf_counter() - t:.1f} s")
    meta = {n: (ckpt / n).stat().st_size for n in META if (ckpt / n).exists()}
    meta_bytes = sum(meta.values())
    nfiles = len(list(ckpt.iterdir()))
    print(f"checkpoint: {nfiles} objects; metadata objects {meta} = {meta_bytes} bytes")
    env = dict(os.environ)
    if peers_only:
        _peers(prefix, proxy)
        return
    local = subprocess.run([sys.executable, "-m", "ckptinspect", "audit", str(ckpt), "-o", "json"], env=env,
                           capture_output=True, text=True)
    proxy.log = []
    with Counter(proxy) as c:
        r = subprocess.run([sys.executable, "-m", "ckptinspect", "audit", f"s3://{BUCKET}/{prefix}", "-o", "json"],
                           env=env, capture_output=True, text=True)
    doc, ldoc = json.loads(r.stdout), json.loads(local.stdout)
    same = verdict(doc) == verdict(ldoc) and r.returncode == local.returncode
    print(f"ckptinspect audit s3://: {c.requests} requests, {c.bytes} bytes, {c.seconds:.1f} s; "
          f"verdict {verdict(doc)} {'==' if same else '!='} local {verdict(ldoc)}")
    print(f"  its own count: {doc['storage']}")
    items = byte_items(ckpt)
    breakdown(proxy.log, meta_bytes, items)
    accountings(c.requests, c.bytes, doc["storage"], meta, items)
    proxy.log = None
    _peers(prefix, proxy)


def breakdown(log: list[tuple[str, str, int]], meta_bytes: int, items: dict[str, tuple[int, int]]) -> None:
    """Where the requests and bytes went: listing pages, metadata objects, byte items of data files, other."""
    kinds: dict[str, list[int]] = {}
    for method, path, n in log:
        name = path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        kind = ("list" if "list-type" in path or "delimiter" in path else
                "metadata objects" if name in META else
                "byte items (data files)" if name.endswith(".distcp") else f"other {method}")
        kinds.setdefault(kind, [0, 0])
        kinds[kind][0] += 1
        kinds[kind][1] += n
    for kind, (k, n) in sorted(kinds.items()):
        print(f"  {kind:24s} {k:6d} requests {n:12d} bytes")
    per_file: dict[str, int] = {}
    for method, path, _ in log:
        name = path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        if method == "GET" and name.endswith(".distcp"):
            per_file[name] = per_file.get(name, 0) + 1
    again = {n: k for n, k in per_file.items() if k > 1}
    print(f"  data files read: {len(per_file)}, of them with more than one GET: {len(again)} "
          f"{sorted(again.items())[:5]}; data files with byte items not read: {len(set(items) - set(per_file))}")
    scanned = sum(n for _, n in items.values())
    print(f"  the safety scan must read {scanned} bytes of byte items in {len(items)} data files "
          f"(one GET per file at least: S3 has no multi-object or multi-range GET)")
    print(f"  floor with the scan: {len(items)} + overhead requests, "
          f"{(meta_bytes + scanned) / meta_bytes:.3f}x the metadata bytes (+ listing XML)")
    over = sum(k for kind, (k, _) in kinds.items() if not kind.startswith("byte items"))
    over_b = sum(n for kind, (_, n) in kinds.items() if not kind.startswith("byte items"))
    print(f"  overhead (everything but the byte items): {over} requests (target 10 + {len(META)}), "
          f"{over_b / meta_bytes:.3f}x the metadata bytes (target 1.05)")


def _verdict_line(what: str, got: float, target: float, unit: str) -> str:
    fmt = (lambda v: f"{v:,.3f}{unit}") if unit else (lambda v: f"{int(v):,}")
    if got <= target:
        return f"{what} {fmt(got)} <= {fmt(target)}: MET ({fmt(target - got)} to spare)"
    return f"{what} {fmt(got)} > {fmt(target)}: MISSED by {fmt(got - target)}"


def accountings(requests: int, nbytes: int, own: dict, meta: dict[str, int], items: dict[str, tuple[int, int]]
                ) -> None:
    """The issue's targets (bytes <= 1.05x the metadata objects' bytes, requests <= 10 + their number) under the two
    ways of counting what the metadata objects are; `nbytes` / `requests` are the proxy's counts (every response
    body, listing XML included), `own` is the audit's own `storage` count (object bytes only)."""
    meta_bytes = sum(meta.values())
    item_bytes = sum(n for _, n in items.values())
    own_b = int(own["bytes_transferred"])
    print("  accounting (a): metadata objects = .metadata + metadata.json + common.pt "
          f"({len(meta)} objects, {meta_bytes:,} bytes)")
    print("    " + _verdict_line("bytes", nbytes / meta_bytes, 1.05, "x") +
          f" (own count {own_b / meta_bytes:.3f}x)")
    print("    " + _verdict_line("requests", requests, 10 + len(meta), ""))
    n_b = len(meta) + len(items)
    lvl = meta_bytes + item_bytes
    print(f"  accounting (b): metadata-level objects = those {len(meta)} + the {len(items)} data files holding byte "
          f"items (the sharded non-tensor state DCP torch.loads on load: rng, rerun state, TE extra state, "
          f"optimizer state), each counted as its byte items' bytes ({n_b} objects, {meta_bytes:,} + "
          f"{item_bytes:,} = {lvl:,} bytes)")
    print("    " + _verdict_line("bytes", nbytes / lvl, 1.05, "x") + f" (own count {own_b / lvl:.3f}x)")
    print("    " + _verdict_line("requests", requests, 10 + n_b, ""))


def _peers(prefix: str, proxy: FaultProxy) -> None:
    import fsspec  # noqa: F401 - torch's FsspecReader needs it
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    with Counter(proxy) as c:
        FsspecReader(f"s3://{BUCKET}/{prefix}").read_metadata()
    print(f"torch FsspecReader.read_metadata: {c.requests} requests, {c.bytes} bytes, {c.seconds:.1f} s "
          f"(.metadata only, no verdict)")
    import multistorageclient as msc
    from multistorageclient.contrib.torch.filesystem import MultiStorageFileSystemReader

    with Counter(proxy) as c:
        MultiStorageFileSystemReader(f"msc://{BUCKET}/{prefix}", thread_count=2).read_metadata()
        for n in ("metadata.json", "common.pt"):
            with msc.open(f"msc://{BUCKET}/{prefix}/{n}", "rb") as f:
                f.read()
    print(f"Megatron MSC path (MultiStorageFileSystemReader.read_metadata + metadata.json + common.pt): "
          f"{c.requests} requests, {c.bytes} bytes, {c.seconds:.1f} s (inputs of a verdict, not one)")


# The two verifiers, each run as a fresh process. Each prints, to stderr, the wall-clock time (`time.time()`, the
# same clock in every process) at which its imports were done and its work began, and when the work ended: the
# parent knows when it launched the process, so it gets both "with the process start" and "without it".
_OURS = """
import os, sys, time
import s3fs  # what `manifest verify s3://` imports anyway (msc:// imports multistorageclient instead)
from ckptinspect.cli.app import app
t0, c0 = time.time(), sum(os.times()[:2])
try:
    app(sys.argv[1:])
except SystemExit:
    pass
sys.stderr.write(f"\\nTIMES {t0} {time.time()} {sum(os.times()[:2]) - c0}\\n")
"""
_SERIAL = """
import hashlib, json, os, sys, time
import boto3
t0, c0 = time.time(), sum(os.times()[:2])
bucket, prefix = sys.argv[1:3]
s3 = boto3.client("s3")
good = True
listed = json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}/integrity.json")["Body"].read())["files"]
for name, digest in listed.items():  # serial, one stream: Megatron's verifier over the bucket
    body = s3.get_object(Bucket=bucket, Key=f"{prefix}/{name}")["Body"]
    h = hashlib.sha256()
    while chunk := body.read(1 << 20):
        h.update(chunk)
    good &= h.hexdigest() == digest
print(json.dumps({"ok": good}))
sys.stderr.write(f"\\nTIMES {t0} {time.time()} {sum(os.times()[:2]) - c0}\\n")
"""


def _timed(args: list[str], env: dict[str, str]) -> tuple[float, float, float, str]:
    """(wall seconds with the process start, seconds of work without it, CPU seconds of the work (all threads of
    the process, user + system), stdout) of a fresh process."""
    launched = time.time()
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env)
    ended = time.time()
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("TIMES ")]
    if not line:
        raise RuntimeError(f"{args[:3]}: no timing line; stderr: {r.stderr[-2000:]}")
    t0, t1, cpu = (float(x) for x in line[-1].split()[1:])
    return ended - launched, t1 - t0, cpu, r.stdout


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bench_verify(mb: int, files: int, tmp: Path, repeat: int = 3, msc: bool = True,
                 link_mibps: float | None = None) -> None:
    """Both verifiers against a moto server of their own, in its own process (the audit's server shares this
    process's GIL with the counting proxy; hashing throughput would measure that, not the verifiers). The two run
    alternately, `repeat` times each, each in a fresh process; the medians are compared both with the process
    start (interpreter + imports) and without it. `link_mibps`: both read through `_shaper.py` (its own process),
    which caps every connection's download rate, as object storage does per connection."""
    import boto3

    from ckptinspect.commands.manifest.manifest import write_manifest

    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    shaper = None
    read_endpoint = endpoint
    if link_mibps:
        sport = _free_port()
        shaper = subprocess.Popen([sys.executable, str(Path(__file__).with_name("_shaper.py")), str(sport),
                                   str(port), str(link_mibps)])
        read_endpoint = f"http://127.0.0.1:{sport}"
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint)
        for _ in range(100):
            try:
                s3.create_bucket(Bucket=BUCKET)
                break
            except Exception:  # noqa: BLE001 - not listening yet
                time.sleep(0.2)
        d = tmp / "verify"
        d.mkdir(parents=True)
        per = mb * 1024 * 1024 // files
        for i in range(files):
            (d / f"__{i}_0.distcp").write_bytes(os.urandom(per))
        write_manifest(d)
        for p in d.iterdir():
            s3.upload_file(str(p), BUCKET, f"verify/{p.name}")
        cfg = tmp / "msc_verify.yaml"
        cfg.write_text(msc_config(read_endpoint).replace("ckpts", BUCKET))
        env = dict(os.environ, AWS_ENDPOINT_URL=read_endpoint, MSC_CONFIG=str(cfg))
        runs: dict[str, list[tuple[float, float, float]]] = {"ours": [], "serial": [], "msc": []}
        doc: dict = {}
        good = ""
        for _ in range(repeat):
            wall, work, cpu, out = _timed(["-c", _OURS, "manifest", "verify", f"s3://{BUCKET}/verify", "-o", "json"],
                                          env)
            runs["ours"].append((wall, work, cpu))
            doc = json.loads(out)
            wall, work, cpu, out = _timed(["-c", _SERIAL, BUCKET, "verify"], env)
            runs["serial"].append((wall, work, cpu))
            good = out.strip()
        if msc:
            wall, work, cpu, out = _timed(["-c", _OURS.replace("import s3fs", "import multistorageclient"),
                                           "manifest", "verify", f"msc://{BUCKET}/verify", "-o", "json"], env)
            runs["msc"].append((wall, work, cpu))
            mdoc = json.loads(out)
    finally:
        for proc in (shaper, server):
            if proc is not None:
                proc.terminate()
                proc.wait()
    ours_w, ours_t, ours_c = (_median([r[k] for r in runs["ours"]]) for k in range(3))
    ser_w, ser_t, ser_c = (_median([r[k] for r in runs["serial"]]) for k in range(3))
    st = doc["storage"]
    link = (f", every connection capped at {link_mibps:g} MiB/s by a shaping proxy in its own process"
            if link_mibps else ", loopback, no cap")
    print(f"manifest verify s3:// ({mb} MiB in {files} objects, moto in its own process{link}; medians of "
          f"{repeat} alternating fresh-process runs; load {os.getloadavg()[0]:.1f}):")
    print(f"  ckptinspect: {ours_w:.2f} s with the process start, {ours_t:.2f} s without it "
          f"({mb / ours_t:.0f} MiB/s), {ours_c:.2f} s CPU in it; status {doc['status']}, {st['requests']} requests "
          f"{st['requests_by_op']}, {st['bytes_transferred']} bytes, {st['retries']} retries")
    print(f"  serial single-stream verifier (boto3, one GET per object, 1 MiB reads): {ser_w:.2f} s with the "
          f"process start, {ser_t:.2f} s without it ({mb / ser_t:.0f} MiB/s), {ser_c:.2f} s CPU in it; {good}")
    print(f"  ratio (serial / ckptinspect, > 1 = faster): {ser_w / ours_w:.2f}x with the process start, "
          f"{ser_t / ours_t:.2f}x without it")
    print(f"  process start alone: ckptinspect {ours_w - ours_t:.2f} s (interpreter, ckptinspect, s3fs), "
          f"serial {ser_w - ser_t:.2f} s (interpreter, boto3)")
    print(f"  all runs (wall, work, work CPU): ours {[tuple(round(x, 2) for x in r) for r in runs['ours']]}, "
          f"serial {[tuple(round(x, 2) for x in r) for r in runs['serial']]}")
    if runs["msc"]:
        (mw, mt, _), = runs["msc"]
        ms = mdoc["storage"]
        print(f"  manifest verify msc:// (one run, ranged blocks of 32 MiB: MSC has no streamed read): {mw:.2f} s "
              f"with the process start, {mt:.2f} s without it; status {mdoc['status']}, {ms['requests']} requests")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt", type=Path, help="a torch_dist checkpoint dir (tools/make_synthetic_ckpt.py)")
    ap.add_argument("--verify-mb", type=int, default=512)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--peers-only", action="store_true", help="skip ckptinspect's audit (the slow part under load)")
    ap.add_argument("--verify-only", action="store_true", help="only the manifest verify comparison")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each verifier (medians are compared)")
    ap.add_argument("--no-msc", action="store_true", help="skip the msc:// verify run")
    ap.add_argument("--link-mibps", type=float, default=None,
                    help="also compare the verifiers with every connection capped at this rate (a model of object "
                         "storage's per-connection throughput; `_shaper.py`)")
    args = ap.parse_args()
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    print(f"load average {os.getloadavg()}")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    proxy = FaultProxy(endpoint)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "msc.yaml"
        cfg.write_text(msc_config(proxy.endpoint).replace("ckpts", BUCKET))
        os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                          AWS_ENDPOINT_URL=proxy.endpoint, MSC_CONFIG=str(cfg))
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket=BUCKET)
        if not args.verify_only:
            bench_audit(args.ckpt, proxy, client, args.peers_only)
        if args.verify_mb:
            bench_verify(args.verify_mb, args.files, Path(tmp), args.repeat, not args.no_msc)
            if args.link_mibps:
                bench_verify(args.verify_mb, args.files, Path(tmp) / "shaped", args.repeat, False, args.link_mibps)
    proxy.close()
    server.stop()
    _ = threading.active_count()


if __name__ == "__main__":
    main()
