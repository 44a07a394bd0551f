"""Seeded fuzzing: ≥1,000 mutated checkpoints per run, across every format, through the real CLI (in-process).

Bases: the megatron-core 0.16.1 torch_dist save dir (three iterations, one never finalized), the 0.16.1 fully
reshardable save, the megatron-core 0.19.2 fixture (common_state item, integrity.json manifest), the legacy per-rank
save, and the torch DCP run. Each base is copied once per session ("pristine") and every case works on a fresh copy
of it. A case applies 1–3 mutations: truncation, byte flips (weighted towards `.metadata`, `common.pt`,
`metadata.json`, trackers and manifests), deletion, duplication, a file replaced by a directory, an empty file, a
symlink (to itself, dangling, to another file, to a parent dir), garbage or deeply nested JSON, garbage trackers,
spliced bytes. Then `audit` (JSON; sometimes `--deep` / `--all`), `scan`, and often one more read-only command run
on it, each checked for: exit code 0 or 1 (never 2/3), no traceback, JSON that parses, the tree byte-identical before
and after, and a 30 s per-run hang guard.

Reproduce: the seed and case count are printed in the terminal summary; every failure names its seed and case
index. `CKPTINSPECT_FUZZ_SEED=S CKPTINSPECT_FUZZ_CASES=N pytest tests/hostile/test_fuzz.py` reruns a whole session,
`CKPTINSPECT_FUZZ_SEED=S CKPTINSPECT_FUZZ_ONLY=I` only case I (each case has its own RNG, seeded by (seed, index)).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from ckptinspect.cli.app import app as main_app
from ckptinspect.cli.scan_cmd import register
from fuzz_hostile_ops import HOSTILE_OPS
from fuzz_stats import WORKER_KEY, Stats, summary_lines

REPO = Path(__file__).resolve().parents[2]
SAMPLES = Path(os.environ.get("CKPTINSPECT_SAMPLES", REPO / "sample_ckpts"))
FIXTURE_0192 = SAMPLES / "mcore_0_19_2"

BASES: dict[str, Path] = {
    "torch_dist-0.16": SAMPLES / "torch_dist",
    "torch_dist_fully-0.16": SAMPLES / "torch_dist_fully",
    "torch_dist-0.19.2": FIXTURE_0192,
    "legacy-0.16": SAMPLES / "legacy",
    "dcp": SAMPLES / "dcp",
    "safetensors": SAMPLES / "safetensors_sharded",  # issue 28
}
SEED = int(os.environ.get("CKPTINSPECT_FUZZ_SEED") or random.SystemRandom().randrange(1 << 32))
CASES = int(os.environ.get("CKPTINSPECT_FUZZ_CASES", "1000"))
ONLY = os.environ.get("CKPTINSPECT_FUZZ_ONLY")
HANG_SECONDS = 30.0  # a hang guard, not a speed assertion: a run takes ~0.05-0.3 s, CI machines stall at times
MAX_REPORTED = 12


# --- session statistics, printed in the terminal summary ----------------------------------------------------------


STATS = Stats()


class _Summary:
    """A plugin registered at runtime so the seed and counts show in every CI log, whatever `-q` / `-r` say. In a
    pytest-xdist worker it hands its statistics to the controller instead (tests/conftest.py prints them merged)."""

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput[WORKER_KEY] = STATS.to_json()

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if hasattr(terminalreporter.config, "workeroutput"):
            return
        terminalreporter.section("ckptinspect fuzz")
        for line in summary_lines(STATS, SEED, CASES, ONLY):
            terminalreporter.write_line(line)


@pytest.fixture(scope="module", autouse=True)
def _fuzz_summary(request: pytest.FixtureRequest) -> Iterator[None]:
    plugin = _Summary()
    pm = request.config.pluginmanager
    if not pm.has_plugin("ckptinspect-fuzz-summary"):
        pm.register(plugin, "ckptinspect-fuzz-summary")
    tr = pm.get_plugin("terminalreporter")
    capture = pm.get_plugin("capturemanager")
    if tr is not None and capture is not None:  # up front as well: a CI job killed by its timeout shows the seed
        with capture.global_and_fixture_disabled():
            tr.write_line(f"\nckptinspect fuzz: seed={SEED} cases={CASES}"
                          + (f" only={ONLY}" if ONLY is not None else ""))
    yield


# --- the tree: copy, hash ------------------------------------------------------------------------------------------


def tree_digest(root: Path) -> str:
    """A digest of everything under `root`: names, types, modes, file contents, symlink targets (not followed)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            h.update(f"{rel}\0{stat.S_IFMT(st.st_mode)}\0{st.st_mode & 0o7777}\0".encode())
            if stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(p).encode())
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def reset(pristine: Path, work: Path) -> None:
    if work.exists() or work.is_symlink():
        shutil.rmtree(work)
    shutil.copytree(pristine, work, symlinks=True)


# --- mutations ---------------------------------------------------------------------------------------------------


_INTERESTING = (".metadata", "common.pt", "metadata.json", "latest_checkpointed_iteration.txt", "integrity.json",
                "model_optim_rng.pt", "distrib_optim.pt")
_TRACKERS = ["", "0", "-1", "release", "abc", "2\n\n", "99999999999999999999", "1" * 5000, "\x00\x01", "3.5",
             " 1 ", "iter_0000001", "400"]
_JSON = ['{}', '[]', 'null', '"torch_dist"', '{"sharded_backend": 5}', '{"sharded_backend": "zarr"}',
         '{"sharded_backend": "torch_dist", "sharded_backend_version": "x"}', '{"algorithm": "md5", "files": {}}',
         '{"algorithm": "sha256", "files": []}', '{"files": {"../../etc/passwd": "00"}}',
         '{"files": {"__0_0.distcp": 7}}', "[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000,
         "\ufeff{}", "{" + '"k": 1,' * 100 + "}"]


def _entries(root: Path) -> tuple[list[Path], list[Path]]:
    files: list[Path] = []
    dirs: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for d in dirnames:
            p = Path(dirpath) / d
            (files if p.is_symlink() else dirs).append(p)
        files.extend(Path(dirpath) / f for f in sorted(filenames))
    return files, dirs


def _pick_file(rng: random.Random, files: list[Path]) -> Path | None:
    if not files:
        return None
    interesting = [f for f in files if f.name in _INTERESTING]
    if interesting and rng.random() < 0.55:
        return rng.choice(interesting)
    return rng.choice(files)


def _regular(p: Path) -> bool:
    return p.is_file() and not p.is_symlink()


def mutate(rng: random.Random, root: Path) -> list[str]:
    """Apply 1–3 random mutations under `root`; return their descriptions (for the failure message)."""
    done: list[str] = []
    n = 1 + (rng.random() < 0.3) + (rng.random() < 0.1)
    for _ in range(n):
        files, dirs = _entries(root)
        target = _pick_file(rng, files)
        op = rng.choice(OPS)
        try:
            desc = op(rng, root, target, files, dirs)
        except OSError as e:  # a mutation that does not apply to what earlier ones left (e.g. a deleted parent)
            desc = f"{op.__name__} skipped ({e.strerror})"
        if desc:
            done.append(desc)
    return done or ["(no-op)"]


Op = Callable[[random.Random, Path, "Path | None", list[Path], list[Path]], "str | None"]


def _rel(root: Path, p: Path) -> str:
    return str(p.relative_to(root))


def op_truncate(rng: random.Random, root: Path, t: Path | None, files: list[Path], dirs: list[Path]) -> str | None:
    if t is None or not _regular(t):
        return None
    size = t.stat().st_size
    at = rng.choice([0, 1, rng.randrange(size + 1), max(0, size - rng.randrange(1, 64)), size // 2]) if size else 0
    with open(t, "r+b") as f:
        f.truncate(at)
    return f"truncate {_rel(root, t)} at {at}/{size}"


def op_flip(rng: random.Random, root: Path, t: Path | None, files: list[Path], dirs: list[Path]) -> str | None:
    if t is None or not _regular(t) or t.stat().st_size == 0:
        return None
    data = bytearray(t.read_bytes())
    k = rng.choice([1, 1, 2, 4, 8, 32])
    window = len(data) if rng.random() < 0.6 else min(len(data), 4096)  # headers matter most
    spots = []
    for _ in range(k):
        i = rng.randrange(window)
        if rng.random() < 0.5:
            data[i] ^= 1 << rng.randrange(8)
        else:
            data[i] = rng.randrange(256)
        spots.append(i)
    t.write_bytes(bytes(data))
    return f"flip {k} byte(s) of {_rel(root, t)} at {sorted(spots)[:8]}"


def op_delete(rng: random.Random, root: Path, t: Path | None, files: list[Path], dirs: list[Path]) -> str | None:
    if dirs and rng.random() < 0.2:
        d = rng.choice(dirs)
        shutil.rmtree(d)
        return f"delete dir {_rel(root, d)}"
    if t is None:
        return None
    t.unlink()
    return f"delete {_rel(root, t)}"


def op_duplicate(rng: random.Random, root: Path, t: Path | None, files: list[Path], dirs: list[Path]) -> str | None:
    if dirs and rng.random() < 0.3:
        d = rng.choice(dirs)
        new = d.with_name(rng.choice(["iter_0000009", "iter_0000000", "release", "step-99", d.name + "_copy"]))
        if new.exists() or new.is_symlink():
            return None
        shutil.copytree(d, new, symlinks=True)
        return f"duplicate dir {_rel(root, d)} -> {new.name}"
    if t is None or not _regular(t):
        return None
    names = [t.name + ".bak", "__9_0.distcp", ".metadata.tmp", "common.pt", ".metadata", "__0_0.distcp",
             "metadata.json", "model_optim_rng.pt", "x.pt"]
    dst_dir = rng.choice(dirs + [root]) if rng.random() < 0.3 else t.parent
    new = dst_dir / rng.choice(names)
    if new == t:
        return None
    if new.exists() or new.is_symlink():
        if not _regular(new):
            return None
        new.unlink()
    shutil.copyfile(t, new)
    return f"duplicate {_rel(root, t)} -> {_rel(root, new)}"


def op_to_dir(rng: random.Random, root: Path, t: Path | None, files: list[Path], dirs: list[Path]) -> str | None:
    if t is None:
        return None
    t.unlink()
    t.mkdir()
    if rng.random() < 0.3:
        (t / "inner.pt").write_bytes(b"\x80\x02K\x01.")
    return f"replace {_rel(root, t)} by a directory"


def op_symlink(rng: random.Random, root: Path, t: Path | None, files: list[Path], dirs: list[Path]) -> str | None:
    kind = rng.choice(["self", "dangling", "other", "parent", "dirloop"])
    if kind == "dirloop" and dirs:
        d = rng.choice(dirs)
        shutil.rmtree(d)
        d.symlink_to(d.parent if rng.random() < 0.5 else d.name)  # to its parent, or to itself
        return f"replace dir {_rel(root, d)} by a symlink loop"
    if t is None:
        return None
    t.unlink()
    if kind == "self":
        t.symlink_to(t.name)
    elif kind == "dangling":
        t.symlink_to("does-not-exist-" + t.name)
    elif kind == "other" and files:
        other = rng.choice(files)
        t.symlink_to(os.path.relpath(other, t.parent))
    else:
        t.symlink_to("..")
    return f"replace {_rel(root, t)} by a symlink ({kind})"


def op_empty(rng: random.Random, root: Path, t: Path | None, files: list[Path], dirs: list[Path]) -> str | None:
    if t is None:
        return None
    if t.is_symlink():
        t.unlink()
    t.write_bytes(b"")
    return f"empty {_rel(root, t)}"


def op_text(rng: random.Random, root: Path, t: Path | None, files: list[Path], dirs: list[Path]) -> str | None:
    """Garbage in the text files: the tracker, metadata.json, integrity.json (created when absent)."""
    candidates = [p for p in [root / "latest_checkpointed_iteration.txt", *[d / "metadata.json" for d in dirs],
                              *[d / "integrity.json" for d in dirs]] if not p.is_dir()]
    p = rng.choice(candidates)
    if p.is_symlink():
        p.unlink()
    if p.name.endswith(".txt"):
        text = rng.choice(_TRACKERS)
    elif rng.random() < 0.2 and p.exists():
        text = p.read_text(errors="replace")[: rng.randrange(1, 64)]
    else:
        text = rng.choice(_JSON)
    p.write_text(text, encoding="utf-8")
    return f"write {_rel(root, p)} = {text[:40]!r}{'...' if len(text) > 40 else ''}"


def op_append(rng: random.Random, root: Path, t: Path | None, files: list[Path], dirs: list[Path]) -> str | None:
    if t is None or not _regular(t):
        return None
    junk = rng.choice([b"\x00" * 64, b"PK\x05\x06" + b"\x00" * 18, b"\x80\x04K\x01.", bytes(rng.randrange(256)
                                                                                                for _ in range(100))])
    with open(t, "ab") as f:
        f.write(junk)
    return f"append {len(junk)} bytes to {_rel(root, t)}"


def op_splice(rng: random.Random, root: Path, t: Path | None, files: list[Path], dirs: list[Path]) -> str | None:
    """Overwrite a span of `t` with bytes from another file (e.g. an item of one .distcp into another)."""
    regular = [f for f in files if _regular(f) and f.stat().st_size > 0]
    if t is None or not _regular(t) or not regular or t.stat().st_size == 0:
        return None
    src = rng.choice(regular).read_bytes()
    data = bytearray(t.read_bytes())
    n = min(len(src), len(data), rng.choice([16, 256, 4096]))
    a, b = rng.randrange(len(src) - n + 1), rng.randrange(len(data) - n + 1)
    data[b : b + n] = src[a : a + n]
    t.write_bytes(bytes(data))
    return f"splice {n} bytes into {_rel(root, t)} at {b}"


OPS: list[Op] = [op_truncate, op_truncate, op_flip, op_flip, op_flip, op_delete, op_duplicate, op_to_dir,
                 op_symlink, op_empty, op_text, op_text, op_append, op_splice, *HOSTILE_OPS]  # issue 18


# --- running the CLI ---------------------------------------------------------------------------------------------


class Hang(BaseException):
    """Raised by the alarm: BaseException so that neither the CLI's error table nor the runner swallows it."""


def _alarm(signum: int, frame: Any) -> None:
    raise Hang()


def _apps() -> tuple[typer.Typer, typer.Typer]:
    scan_only = typer.Typer()
    scan_only.callback()(lambda: None)
    register(scan_only)
    return main_app, scan_only


def commands(rng: random.Random, path: str) -> list[tuple[str, list[str]]]:
    """The CLI runs of one case: audit (json, sometimes --deep / --all), scan, and in half the cases one more
    read-only command (info, ls, sniff, manifest verify, coverage, text / junit audit, text scan)."""
    audit = ["audit", path, "-o", "json"]
    r = rng.random()
    if r < 0.25:
        audit.append("--deep")
    elif r < 0.35:
        audit.append("--all")
    extra = rng.choice([["info", path, "-o", "json"], ["ls", path, "-o", "json"], ["sniff", path, "-o", "json"],
                        ["manifest", "verify", path, "-o", "json"], ["coverage", path, "-o", "json"],
                        ["audit", path], ["audit", path, "-o", "junit"], ["scan", path]])
    runs = [("main", audit), ("scan", ["scan", path, "-o", "json"])]
    if rng.random() < 0.5:  # half the cases: keeps 1,000 cases within the suite's time budget
        runs.append(("scan" if extra[0] == "scan" else "main", extra))
    return runs


def run_one(runner: CliRunner, app: typer.Typer, args: list[str],
            limit: float = HANG_SECONDS) -> tuple[int, str, str, float, str | None]:
    """(exit code, stdout, stderr, seconds, problem with the run itself or None). A run still going after `limit`
    seconds is interrupted by SIGALRM (blocking reads included: the syscall returns EINTR and the handler raises)."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    t0 = time.perf_counter()
    try:
        res = runner.invoke(app, args)
    except Hang:
        return -1, "", "", time.perf_counter() - t0, f"hang: no result after {limit:.0f} s"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    dt = time.perf_counter() - t0
    problem = None
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        problem = f"exception escaped the CLI: {type(res.exception).__name__}: {res.exception}"
    return res.exit_code, res.stdout, res.stderr, dt, problem


def check_run(args: list[str], code: int, out: str, err: str) -> str | None:
    if code not in (0, 1):
        return f"exit code {code}: {(err or out).strip().splitlines()[-1:] if (err or out).strip() else ''}"
    for stream in (out, err):
        if "Traceback" in stream or "internal error" in stream:
            return "traceback / internal error in output: " + stream.strip()[-300:]
    if "json" in args:
        try:
            doc = json.loads(out)
        except ValueError as e:
            return f"JSON does not parse ({e}): {out[:200]!r}"
        if not isinstance(doc, dict) or doc.get("schema_version") != 1:
            return f"JSON without schema_version 1: {out[:200]!r}"
        if args[0] in ("audit", "scan") and "status" not in doc:
            return "JSON without status"
    return None


# --- the fuzz test -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One copy of every available base, taken once (the samples may be regenerated while tests run)."""
    root = tmp_path_factory.mktemp("fuzz-pristine")
    out: dict[str, Path] = {}
    for name, src in BASES.items():
        if src.is_dir() and any(src.iterdir()):
            shutil.copytree(src, root / name, symlinks=True)
            out[name] = root / name
        else:
            STATS.skipped_bases.append(name)
    return out


# Each base's cases are split into PARTS tests (case i of a base goes to part (i // len(BASES)) % PARTS), so a
# parallel run (pytest-xdist) can spread them; the cases, their seeds and their checks are the same in any split.
PARTS = 3


def _indices(base_pos: int, part: int) -> list[int]:
    def mine(i: int) -> bool:
        return i % len(BASES) == base_pos and (i // len(BASES)) % PARTS == part

    if ONLY is not None:
        return [int(ONLY)] if mine(int(ONLY)) else []
    return [i for i in range(CASES) if mine(i)]


@pytest.mark.fuzz
@pytest.mark.parametrize("part", range(PARTS))
@pytest.mark.parametrize("base", list(BASES))
def test_fuzz(base: str, part: int, pristine: dict[str, Path], tmp_path: Path) -> None:
    if base not in pristine:
        pytest.skip(f"{BASES[base]} not available")
    indices = _indices(list(BASES).index(base), part)
    if not indices:
        pytest.skip("no case of this base selected")
    main, scan_only = _apps()
    apps = {"main": main, "scan": scan_only}
    runner = CliRunner()
    work = tmp_path / base
    failures: list[str] = []
    signatures: dict[str, int] = {}
    for index in indices:
        rng = random.Random(f"{SEED}:{index}")
        reset(pristine[base], work)
        applied = mutate(rng, work)
        before = tree_digest(work)
        STATS.cases += 1
        STATS.per_base[base] = STATS.per_base.get(base, 0) + 1
        for app_name, args in commands(rng, str(work)):
            code, out, err, dt, problem = run_one(runner, apps[app_name], args)
            STATS.runs += 1
            STATS.seconds += dt
            STATS.exit_codes[code] = STATS.exit_codes.get(code, 0) + 1
            if dt > STATS.slowest[0]:
                STATS.slowest = (dt, f"case {index} ({base}) {' '.join(args[:1])}")
            problem = problem or check_run(args, code, out, err)
            if problem is None and tree_digest(work) != before:
                problem = "the checkpoint tree changed"
            if problem is not None:
                STATS.failures += 1
                sig = f"{args[0]}: {problem[:80]}"
                signatures[sig] = signatures.get(sig, 0) + 1
                if len(failures) < MAX_REPORTED:
                    failures.append(
                        f"seed={SEED} case={index} base={base} mutations={applied}\n"
                        f"    ckptinspect {' '.join(a if a != str(work) else '<ckpt>' for a in args)} -> {problem}\n"
                        f"    reproduce: CKPTINSPECT_FUZZ_SEED={SEED} CKPTINSPECT_FUZZ_ONLY={index} "
                        f"pytest tests/hostile/test_fuzz.py -k {base}")
                if problem.startswith("hang") or problem.startswith("the checkpoint tree"):
                    break
    shutil.rmtree(work, ignore_errors=True)
    if failures:
        summary = "\n".join(f"  {n}× {s}" for s, n in sorted(signatures.items(), key=lambda kv: -kv[1]))
        pytest.fail(f"{sum(signatures.values())} failing run(s) in {len(indices)} case(s) of {base}; by kind:\n"
                    f"{summary}\nfirst failures:\n" + "\n".join(failures), pytrace=False)


def test_fuzz_case_count_meets_the_floor() -> None:
    """The default run mutates at least 1,000 checkpoints (a smaller CKPTINSPECT_FUZZ_CASES is a local choice)."""
    if "CKPTINSPECT_FUZZ_CASES" in os.environ or ONLY is not None:
        pytest.skip("case count chosen by the environment")
    assert CASES >= 1000


# --- special files, outside the random mix ------------------------------------------------------------------------


@pytest.mark.parametrize("victim", [".metadata", "common.pt", "metadata.json", "../latest_checkpointed_iteration.txt",
                                    "__0_0.distcp"])
def test_a_fifo_in_place_of_a_checkpoint_file_does_not_hang(victim: str, pristine: dict[str, Path],
                                                            tmp_path: Path) -> None:
    """Opening a FIFO for reading blocks until a writer appears: a reader must check for a regular file first."""
    if "torch_dist_fully-0.16" not in pristine:
        pytest.skip("sample not available")
    work = tmp_path / "save"
    reset(pristine["torch_dist_fully-0.16"], work)
    path = work / "iter_0000001" / victim
    path.unlink()
    os.mkfifo(path)
    main, scan_only = _apps()
    runner = CliRunner()
    for app, args in ((main, ["audit", str(work), "-o", "json"]), (main, ["info", str(work), "-o", "json"]),
                      (scan_only, ["scan", str(work), "-o", "json"])):
        code, out, err, dt, problem = run_one(runner, app, args, limit=10.0)
        problem = problem or check_run(args, code, out, err)
        assert problem is None, f"ckptinspect {args[0]} with a FIFO at {victim}: {problem}"
