"""A real S3 API server on the loopback interface for the storage tests, and a fault-injecting proxy in front of it.

`s3_server` (session fixture) starts moto's standalone server (`ThreadedMotoServer`, port 0 = a free port on
127.0.0.1), points the real clients at it the way users do (``AWS_ENDPOINT_URL`` and the AWS key variables for
s3fs / boto3; an ``MSC_CONFIG`` file with an ``s3`` profile for multi-storage-client) and creates one bucket.
`upload` copies a local tree under a prefix. `FaultProxy` forwards HTTP to the server and, on demand, answers
503 (SlowDown) or stalls for the next N requests whose path matches, or cuts / stalls a response in the middle of
its body, so retries, timeouts and resumed streams are exercised against real clients, not mocks.
"""

from __future__ import annotations

import http.client
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

BUCKET = "ckpts"
PROFILE = "ckpts"
_ENV_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "MSC_CONFIG",
             "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_PROFILE", "AWS_SESSION_TOKEN")


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    bucket: str
    client: Any  # boto3 S3 client

    def url(self, key: str, scheme: str = "s3") -> str:
        return f"{scheme}://{self.bucket if scheme == 's3' else PROFILE}/{key}"


def msc_config(endpoint: str) -> str:
    return (f"profiles:\n  {PROFILE}:\n    storage_provider:\n      type: s3\n      options:\n"
            f"        base_path: {BUCKET}\n        endpoint_url: {endpoint}\n        region_name: us-east-1\n"
            f"    credentials_provider:\n      type: S3Credentials\n      options:\n"
            f"        access_key: testing\n        secret_key: testing\n")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    cfg = tmp_path_factory.mktemp("msc") / "msc_config.yaml"
    cfg.write_text(msc_config(endpoint))
    with scoped_env(_ENV_KEYS):
        for k in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
            os.environ.pop(k, None)
        os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_ENDPOINT_URL=endpoint,
                          AWS_DEFAULT_REGION="us-east-1", MSC_CONFIG=str(cfg))
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        try:
            yield S3Server(endpoint, BUCKET, client)
        finally:
            server.stop()


@pytest.fixture
def proxy(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """A `FaultProxy` in front of the session's server, reached by every client through ``AWS_ENDPOINT_URL``."""
    p = FaultProxy(s3_server.endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", p.endpoint)
    yield p
    p.close()


@contextmanager
def scoped_env(keys: Iterable[str]) -> Iterator[None]:
    """On exit, `keys` of the environment are what they were on entry (set to the same value, or unset), whatever
    the body set or removed: the storage fixtures point the real clients at their server through the environment."""
    saved = {k: os.environ.get(k) for k in keys}
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def upload_tree(fs: Any, base: str, root: Path, prefix: str) -> None:
    """Upload the tree `root` through the fsspec filesystem `fs` under `base/prefix/` (symlinks followed, as a copy
    tool would)."""
    for dirpath, _, names in os.walk(root, followlinks=True):
        for n in names:
            p = Path(dirpath, n)
            if p.is_file():
                fs.pipe_file(f"{base}/{prefix}/{p.relative_to(root).as_posix()}", p.read_bytes())


def upload(server: S3Server, root: Path, prefix: str) -> None:
    """Upload `root` (a dir tree, or one file) under `prefix/` (symlinks followed, as a copy tool would)."""
    if root.is_file():
        server.client.upload_file(str(root), server.bucket, f"{prefix}/{root.name}")
        return
    for dirpath, _, names in os.walk(root, followlinks=True):
        for n in names:
            p = Path(dirpath, n)
            if p.is_file():
                rel = p.relative_to(root).as_posix()
                server.client.upload_file(str(p), server.bucket, f"{prefix}/{rel}")


class FaultProxy:
    """HTTP reverse proxy on 127.0.0.1 in front of `upstream`: `fail(pattern, n)` makes the next `n` requests whose
    path contains `pattern` answer 503 SlowDown; `stall(pattern, n, seconds)` makes them hang before answering."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.split("://", 1)[1]
        self._lock = threading.Lock()
        self._rules: list[list[Any]] = []  # [pattern, remaining, action, seconds, body bytes sent first, then]
        self.injected = 0
        self.requests = 0  # forwarded requests and the response bytes sent back (benchmarks count with these)
        self.bytes_out = 0
        self._pattern_hook: Any = None
        self.log: list[tuple[str, str, int]] | None = None  # (method, path, response bytes) when a list is set
        self.gets: list[tuple[str, str | None]] = []  # (path, Range header) of every GET forwarded
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                action = proxy._take(self.path)
                if action is not None and action[0] == "before":
                    proxy._pattern_hook()
                    action = None
                mid_body = action if action is not None and action[0] in ("cut", "stall_body") else None
                if mid_body is not None:
                    action = None
                if action is not None and action[0] == "stall":
                    time.sleep(action[1])
                    self.close_connection = True
                    return
                if action is not None:
                    status = 403 if action[0] == "403" else 503
                    msg = (b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
                           if status == 403 else
                           b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>")
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                conn = http.client.HTTPConnection(proxy.upstream, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = proxy.upstream
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                # HEAD: no body, but the object's length is the answer
                self.send_header("Content-Length", resp.getheader("Content-Length", "0")
                                 if self.command == "HEAD" else str(len(data)))
                self.end_headers()
                with proxy._lock:
                    if self.command == "GET":
                        proxy.gets.append((self.path, self.headers.get("Range")))
                if mid_body is not None:  # the promised length, then part of it, then silence or a closed socket
                    _, seconds, sent, then = mid_body
                    self.wfile.write(data[:sent])
                    self.wfile.flush()
                    if seconds:
                        time.sleep(seconds)
                    if then is not None:
                        then()
                    self.close_connection = True
                    conn.close()
                    return
                if self.command != "HEAD":
                    self.wfile.write(data)
                with proxy._lock:
                    proxy.requests += 1
                    proxy.bytes_out += len(data)
                    if proxy.log is not None:
                        proxy.log.append((self.command, self.path, len(data)))
                conn.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that gave up on a stalled request (a timeout test) is expected

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        host, port = self._httpd.server_address[:2]
        self.endpoint = f"http://{host}:{port}"

    def _take(self, path: str) -> tuple[Any, ...] | None:
        with self._lock:
            for rule in self._rules:
                if rule[0] in path and rule[1] > 0:
                    rule[1] -= 1
                    self.injected += 1
                    return rule[2], rule[3], rule[4], rule[5]
        return None

    def fail(self, pattern: str, n: int) -> None:
        with self._lock:
            self._rules.append([pattern, n, "503", 0.0, 0, None])

    def deny(self, pattern: str, n: int) -> None:
        """The next `n` matching requests answer 403 AccessDenied (a policy that does not allow them)."""
        with self._lock:
            self._rules.append([pattern, n, "403", 0.0, 0, None])

    def stall(self, pattern: str, n: int, seconds: float) -> None:
        with self._lock:
            self._rules.append([pattern, n, "stall", seconds, 0, None])

    def cut(self, pattern: str, n: int, after: int, then: Any = None) -> None:
        """The next `n` matching responses announce their full length, send `after` bytes of the body and close
        the connection (a reset mid-download); `then()` runs after the cut (e.g. rewrite the object)."""
        with self._lock:
            self._rules.append([pattern, n, "cut", 0.0, after, then])

    def stall_body(self, pattern: str, n: int, after: int, seconds: float) -> None:
        """The next `n` matching responses send `after` bytes of the body, then nothing for `seconds`, then close."""
        with self._lock:
            self._rules.append([pattern, n, "stall_body", seconds, after, None])

    def before(self, pattern: str, hook: Any) -> None:
        """Run `hook` (e.g. replace the object) just before the first request matching `pattern` is forwarded."""
        with self._lock:
            self._rules.append([pattern, 1, "before", 0.0, 0, None])
            self._pattern_hook = hook

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
