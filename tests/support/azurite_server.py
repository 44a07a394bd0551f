"""A real Azure Blob server on the loopback interface for the `az://` / `abfs://` tests: Azurite's blob service
(`azurite-blob`, Microsoft's emulator, a Node.js program from npm), reached by the real adlfs client the way users
reach an emulator: the connection string in ``AZURE_STORAGE_CONNECTION_STRING``, with Azurite's published
development account (``devstoreaccount1``).

Azurite is not a Python package, so the fixture provides it: `tests/support/azurite/package.json` + `package-lock.json` pin
one exact release (3.35.0: the newest that runs on Node 20; 3.36+ want Node ≥21), and the first session that needs
it runs ``npm ci`` into `tests/support/azurite/node_modules/` (gitignored). A stamp holding the lock file's hash marks a
finished install, so later sessions reuse it, and a file lock makes the pytest-xdist workers install once (the
others wait for it). Each worker then starts its own server (in memory, a free port, telemetry off). Node and npm
are test prerequisites: when the install or the start fails, the tests FAIL with npm's / Azurite's own output,
never skip.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from s3_server import free_port, scoped_env, upload_tree

AZ_CONTAINER = "ckpts"
# Azurite's well-known development account: public, documented by Microsoft, accepted only by the emulator.
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
PKG_DIR = Path(__file__).parent / "azurite"
INSTALL_TIMEOUT = 600  # s: a cold npm cache fetches ~370 packages (~190 MB unpacked)
START_TIMEOUT = 60  # s
_STAMP = ".ckptinspect-lock-sha256"
AZURE_ENV_KEYS = ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY",
             "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_ANON", "AZURE_STORAGE_CLIENT_ID",
             "AZURE_STORAGE_CLIENT_SECRET", "AZURE_STORAGE_TENANT_ID")


def connection_string(endpoint: str) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
            f"BlobEndpoint={endpoint}/{ACCOUNT};")


@dataclass(frozen=True)
class AzuriteServer:
    endpoint: str
    container: str
    fs: Any  # adlfs.AzureBlobFileSystem

    @property
    def connection_string(self) -> str:
        return connection_string(self.endpoint)

    def url(self, key: str, scheme: str = "az") -> str:
        """``az://container/key``; for ``abfs`` the ``container@account.dfs.core.windows.net`` form."""
        if scheme.startswith("abfs"):
            return f"{scheme}://{self.container}@{ACCOUNT}.dfs.core.windows.net/{key}"
        return f"{scheme}://{self.container}/{key}"


def _tail(text: str | bytes | None, n: int = 3000) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (text or "")[-n:]


def install_azurite() -> Path:
    """`tests/support/azurite/node_modules` with the pinned Azurite, installed by ``npm ci`` once (under a file lock)."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.fail("the az:// tests need Node.js and npm on PATH (test prerequisites, see README) to install "
                    "Azurite from tests/support/azurite/package-lock.json")
    want = hashlib.sha256((PKG_DIR / "package-lock.json").read_bytes()).hexdigest()
    modules = PKG_DIR / "node_modules"
    stamp = modules / _STAMP
    with open(PKG_DIR / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other xdist workers wait here while the first installs
        if not (stamp.is_file() and stamp.read_text().strip() == want):
            try:
                r = subprocess.run(
                    [npm, "ci", "--prefix", str(PKG_DIR), "--no-audit", "--no-fund", "--ignore-scripts",
                     "--prefer-offline", "--loglevel=error"],
                    capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False)
            except subprocess.TimeoutExpired as e:
                pytest.fail(f"npm ci of Azurite (tests/support/azurite) timed out after {INSTALL_TIMEOUT} s:\n"
                            f"{_tail(e.stderr)}")
            if r.returncode != 0:
                pytest.fail(f"npm ci of Azurite (tests/support/azurite) failed (exit {r.returncode}); the az:// tests need "
                            f"the npm registry or a warm npm cache:\n{_tail(r.stdout)}\n{_tail(r.stderr)}")
            stamp.write_text(want + "\n")
    return modules


def _wait_port(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"azurite-blob exited with {proc.returncode} before listening:\n{_tail(log.read_bytes())}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    proc.kill()
    pytest.fail(f"azurite-blob did not listen on 127.0.0.1:{port} within {START_TIMEOUT} s:\n"
                f"{_tail(log.read_bytes())}")


@pytest.fixture(scope="session")
def azurite_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteServer]:
    modules = install_azurite()
    work = tmp_path_factory.mktemp("azurite")
    port = free_port()
    log = work / "azurite.log"
    # --skipApiVersionCheck: the pinned azure-storage-blob (12.31.1) sends API version 2026-10-06, newer than the
    # 2025-11-05 Azurite 3.35.0 knows; --loose: unsupported headers are ignored rather than refused.
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [shutil.which("node") or "node", str(modules / "azurite" / "dist" / "src" / "blob" / "main.js"),
             "--blobHost", "127.0.0.1", "--blobPort", str(port),
             "--inMemoryPersistence", "--disableTelemetry", "--silent", "--skipApiVersionCheck", "--loose"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=work)  # nothing lands in the repo
    with scoped_env(AZURE_ENV_KEYS):
        for k in AZURE_ENV_KEYS:
            os.environ.pop(k, None)
        try:
            _wait_port(proc, port, log)
            endpoint = f"http://127.0.0.1:{port}"
            os.environ["AZURE_STORAGE_CONNECTION_STRING"] = connection_string(endpoint)
            import fsspec

            fs = fsspec.filesystem("az", skip_instance_cache=True, use_listings_cache=False)
            fs.mkdir(AZ_CONTAINER)
            yield AzuriteServer(endpoint, AZ_CONTAINER, fs)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def upload_azure(server: AzuriteServer, root: Path, prefix: str) -> None:
    """Upload the tree `root` under `prefix/` (symlinks followed, as a copy tool would)."""
    upload_tree(server.fs, server.container, root, prefix)
