"""Running the CLI as a process that file modes bind, for the permission tests (root ignores modes).

`Unprivileged` runs `python -m ckptinspect ...` (or any Python code) in a subprocess that the kernel's permission
checks apply to:

- the test already runs as a non-root user: directly, as that user;
- root, and the `nobody` user (uid/gid 65534) can import ckptinspect and its dependencies from this interpreter:
  as `nobody`, through `setpriv --reuid=65534 --regid=65534 --clear-groups`;
- root, and it cannot (the interpreter lives under a dir only root may enter, e.g. a pyenv under a 0700 `/root`):
  as uid 0 with every capability dropped (`setpriv --bounding-set=-all --inh-caps=-all --no-new-privs`). Without
  CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH the kernel checks the mode bits for it like for any user: as the owner of
  the files the test created, so `chmod 000` denies it, `chmod 0o111` lets it enter a dir it cannot list, `0o555`
  forbids creating files.

Whichever way, construction checks that a mode-000 file really is unreadable for the child, so no test can pass
because the modes were not enforced; where no way exists (root without `setpriv`), `unprivileged()` skips with the
reason.

Test files must sit where the child can reach them: `place()` gives a fresh dir under a world-traversable base
(pytest's `tmp_path` under `/tmp/pytest-of-root` is 0700), and `own()` hands a tree to the child's user (needed for
`nobody`, a no-op otherwise) so it can write into it.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534


class Unprivileged:
    """How to run a child process that file modes bind (see the module docstring)."""

    def __init__(self, prefix: list[str], uid: int, gid: int, how: str, base: Path) -> None:
        self.prefix = prefix
        self.uid = uid
        self.gid = gid
        self.how = how  # one line: which of the three ways, for test output
        self.base = base
        self._n = 0

    # --- running --------------------------------------------------------------------------------------------------

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "COV_"))}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env["HOME"] = str(self.base)
        env["CKPTINSPECT_WIDTH"] = "200"
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # never leave __pycache__ owned by nobody in the repo
        env.update(extra or {})
        return env

    def argv(self, args: Sequence[str]) -> list[str]:
        return [*self.prefix, sys.executable, *args]

    def run(self, args: Sequence[str], env: dict[str, str] | None = None, timeout: float = 600,
            ) -> subprocess.CompletedProcess[str]:
        """`python ARGS` as the unprivileged user, from the base dir; output captured as text."""
        return subprocess.run(self.argv(args), cwd=self.base, env=self.env(env), capture_output=True, text=True,
                              timeout=timeout, check=False)

    def cli(self, *args: str, env: dict[str, str] | None = None, timeout: float = 600,
            ) -> subprocess.CompletedProcess[str]:
        """`python -m ckptinspect ARGS` as the unprivileged user."""
        return self.run(["-m", "ckptinspect", *args], env, timeout)

    def popen(self, args: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(args), cwd=self.base, env=self.env(env), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    # --- placing files --------------------------------------------------------------------------------------------

    def place(self, name: str = "case") -> Path:
        """A fresh, empty dir the child can enter and list (0755), under the world-traversable base."""
        self._n += 1
        d = self.base / f"{self._n:03d}-{name}"
        d.mkdir(mode=0o755)
        d.chmod(0o755)
        return d

    def copy(self, src: Path, name: str | None = None) -> Path:
        """A copy of `src` (a sample checkpoint or save dir) in a fresh dir, readable by the child (dirs 0755,
        files 0644: a sample's modes are whatever the checkout gave them)."""
        dst = self.place(name or src.name) / src.name
        shutil.copytree(src, dst) if src.is_dir() else shutil.copy2(src, dst)
        for root, dirs, files in os.walk(dst):
            os.chmod(root, 0o755)
            for f in files:
                os.chmod(os.path.join(root, f), 0o644)
        return dst

    def own(self, path: Path) -> None:
        """Hand `path` (and everything under it) to the child's user, so it may write there."""
        if os.geteuid() != 0 or self.uid == 0:
            return
        for root, dirs, files in os.walk(path):
            os.chown(root, self.uid, self.gid)
            for f in files:
                os.chown(os.path.join(root, f), self.uid, self.gid, follow_symlinks=False)

    def can_read(self, path: Path) -> bool:
        """Whether the child can open `path` for reading (checks the setup of a test, not the tool)."""
        r = self.run(["-c", f"open({str(path)!r}, 'rb').close()"])
        return r.returncode == 0

    def cleanup(self) -> None:
        restore_modes(self.base)
        shutil.rmtree(self.base, ignore_errors=True)


def restore_modes(root: Path) -> None:
    """Give back owner rwx on every dir and rw on every file under `root`, so it can be removed as a non-root user."""
    if not root.exists():
        return
    os.chmod(root, 0o755)
    for dirpath, dirs, files in os.walk(root):
        for d in dirs:
            p = os.path.join(dirpath, d)
            if not os.path.islink(p):
                os.chmod(p, 0o755)
        for f in files:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | stat.S_IRUSR | stat.S_IWUSR)


_PROBE = "import ckptinspect, rich, typer; print(ckptinspect.__file__)"


def _works(prefix: list[str], base: Path) -> bool:
    """The child starts, imports this checkout's ckptinspect and its dependencies."""
    u = Unprivileged(prefix, 0, 0, "", base)
    r = u.run(["-c", _PROBE], timeout=60)
    return r.returncode == 0 and r.stdout.strip().startswith(str(REPO))


def _make(base: Path) -> Unprivileged | str:
    """The first way that works, or why none does."""
    if os.geteuid() != 0:
        return Unprivileged([], os.geteuid(), os.getegid(), f"as the current non-root user (uid {os.geteuid()})",
                            base)
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return "running as root and setpriv (util-linux) cannot be found: file modes cannot be enforced"
    nobody = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
    if _works(nobody, base):
        return Unprivileged(nobody, NOBODY, NOBODY, "as nobody (setpriv --reuid=65534)", base)
    nocaps = [setpriv, "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", "--"]
    if _works(nocaps, base):
        return Unprivileged(nocaps, 0, 0, "as uid 0 without capabilities (setpriv --bounding-set=-all): "
                            "nobody cannot reach this interpreter", base)
    return "running as root and neither nobody nor a capability-less root can start this interpreter"


def _enforced(u: Unprivileged) -> bool:
    probe = u.place("mode-probe") / "denied"
    probe.write_bytes(b"x")
    probe.chmod(0)
    return not u.can_read(probe)


@pytest.fixture(scope="session")
def unprivileged() -> Iterator[Unprivileged]:
    """A session-wide `Unprivileged` (skips with the reason where file modes cannot be enforced)."""
    base = Path(tempfile.mkdtemp(prefix="ckptinspect-unpriv-"))
    base.chmod(0o755)  # mkdtemp makes it 0700: the child must be able to enter it
    made = _make(base)
    if isinstance(made, str):
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(made)
    if not _enforced(made):
        made.cleanup()
        pytest.skip(f"file modes do not bind the child process ({made.how}): a mode-000 file stays readable")
    try:
        yield made
    finally:
        made.cleanup()
