"""Findings: the values every check produces, the stable code table, and status arithmetic.

The code table mirrors `docs/contract.md` ("Finding codes"): codes are stable, never reused. A finding's severity and the
checkpoint status it implies come from the table, so a check only says *which* code and *what about*.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Union


class Severity(enum.Enum):
    """How bad a finding is; ordered (`rank`) so `--fail-on` can compare."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def rank(self) -> int:
        return _SEVERITY_RANK[self]


_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.ERROR: 2}


class Status(enum.Enum):
    """Status of a checkpoint or save dir (docs/contract.md "Status of a checkpoint")."""

    COMPLETE = "complete"
    INCOMPLETE = "incomplete"
    CORRUPT = "corrupt"
    UNSAFE = "unsafe"
    UNRECOGNIZED = "unrecognized"

    @property
    def rank(self) -> int:
        return _STATUS_RANK[self]


# Precedence: unsafe > corrupt > incomplete > complete. `unrecognized` sits between complete and incomplete: it only
# wins when nothing else was found (an unrecognized dir has no other findings to speak of).
_STATUS_RANK = {
    Status.COMPLETE: 0,
    Status.UNRECOGNIZED: 1,
    Status.INCOMPLETE: 2,
    Status.CORRUPT: 3,
    Status.UNSAFE: 4,
}


def worst_status(statuses: Iterable[Status]) -> Status:
    """The most severe status of `statuses` (COMPLETE for none)."""
    result = Status.COMPLETE
    for status in statuses:
        if status.rank > result.rank:
            result = status
    return result


@dataclass(frozen=True, slots=True)
class CodeInfo:
    """One row of the code table."""

    code: str
    severity: Severity
    status: Status | None  # the status it implies; None = does not change the status
    title: str
    family: str  # check family, used for JUnit test cases and grouping


def _c(code: str, sev: str, status: str | None, family: str, title: str) -> CodeInfo:
    return CodeInfo(code, Severity(sev), Status(status) if status else None, title, family)


CODES: Mapping[str, CodeInfo] = {
    c.code: c
    for c in (
        _c("CK100", "error", "unrecognized", "format", "no known checkpoint format here"),
        _c("CK101", "error", "incomplete", "format", "torch_dist save not finalized: .metadata without metadata.json"),
        _c("CK102", "error", "incomplete", "format", "data files present but no .metadata"),
        _c("CK103", "error", "incomplete", "format", ".metadata.tmp present (crash while writing .metadata)"),
        _c("CK104", "error", "corrupt", "format", "metadata.json unreadable or names an unknown backend"),
        _c("CK105", "error", "corrupt", "format", "common state missing"),
        _c("CK106", "error", "corrupt", "format", ".metadata unreadable or not a DCP metadata object"),
        _c("CK113", "error", "corrupt", "format", "zarr array metadata (.zarray) unreadable or inconsistent"),
        _c("CK130", "error", "incomplete", "format", "Megatron save started: nothing written but (part of) common.pt"),
        _c("CK131", "error", "incomplete", "format", "metadata.json cut short: the final marker being written or "
           "interrupted"),
        _c("CK132", "error", "incomplete", "legacy", "legacy (mp_rank_*) save being written: shard files missing or "
           "cut in an untracked iteration within the grace"),
        _c("CK133", "error", "incomplete", "tracker", "tracker being written: empty and modified within the grace"),
        _c("CK140", "error", "corrupt", "safetensors", "safetensors header length past the file or over the bound"),
        _c("CK141", "error", "corrupt", "safetensors", "safetensors header is not JSON or not a JSON object"),
        _c("CK142", "error", "corrupt", "safetensors", "safetensors header JSON nested too deeply"),
        _c("CK143", "error", "corrupt", "safetensors", "safetensors header entry or __metadata__ malformed"),
        _c("CK144", "error", "corrupt", "safetensors", "safetensors tensor of an unknown dtype"),
        _c("CK145", "error", "corrupt", "safetensors", "safetensors span length differs from dtype x shape"),
        _c("CK146", "error", "corrupt", "safetensors", "safetensors span reaches past the data area"),
        _c("CK147", "error", "corrupt", "safetensors", "safetensors spans overlap"),
        _c("CK148", "error", "corrupt", "safetensors", "safetensors gap: bytes no tensor holds before a span"),
        _c("CK149", "error", "corrupt", "safetensors", "safetensors trailing bytes after the last span"),
        _c("CK150", "error", "corrupt", "safetensors", "index places a tensor in a shard that does not hold it"),
        _c("CK151", "error", "corrupt", "safetensors", "tensor in more than one safetensors file"),
        _c("CK152", "error", "corrupt", "safetensors", "shard file named by the index is missing"),
        _c("CK153", "warning", None, "safetensors", "safetensors file the index does not name"),
        _c("CK154", "error", "corrupt", "safetensors", "model.safetensors.index.json malformed"),
        _c("CK155", "error", "corrupt", "safetensors", "tensor of a listed shard missing from the index's weight_map"),
        _c("CK110", "error", "corrupt", "legacy", "legacy shard dir missing for the topology in args"),
        _c("CK111", "error", "corrupt", "legacy", "legacy distrib_optim.pt missing"),
        _c("CK112", "warning", None, "legacy", "legacy args disagree between shard files"),
        _c("CK120", "error", "corrupt", "stack", "Megatron-Bridge run_config.yaml unreadable or not safe plain YAML"),
        _c("CK121", "warning", None, "stack", "NeMo 2 checkpoint without context/io.json"),
        _c("CK122", "error", "corrupt", "stack", "Megatron-Bridge train_state.pt is not a TrainState dict"),
        _c("CK201", "error", "corrupt", "storage", "data file named by .metadata does not exist"),
        _c("CK202", "error", "corrupt", "storage", "stored item extends past the end of its file"),
        _c("CK203", "error", "corrupt", "storage", "stored items overlap inside one file"),
        _c("CK204", "warning", None, "storage", "data file not referenced by .metadata"),
        _c("CK205", "error", "corrupt", "storage", "stored item is not a valid archive or has the wrong payload size"),
        _c("CK206", "error", "corrupt", "storage", ".pt file unreadable"),
        _c("CK207", "error", "unsafe", "storage", "stored item path leaves the checkpoint dir"),
        _c("CK208", "error", "incomplete", "storage",
           "stored item is stream-transformed and cannot be decoded here: not scanned or verified"),
        _c("CK209", "error", "incomplete", "storage",
           "file or dir cannot be read here (permission denied, I/O error): not read, so not verified"),
        _c("CK210", "info", None, "storage", "data file named by nothing in .metadata, left by the writer itself: a rank's "
           "zero-size chunk whose storage index another rank's took"),
        _c("CK220", "error", "incomplete", "storage", "object changed between listing and read (ETag differs)"),
        _c("CK221", "error", None, "storage", "object listed but reading it is denied (403)"),
        _c("CK222", "error", "corrupt", "storage", "object returned fewer bytes than its listed size"),
        _c("CK223", "error", "incomplete", "storage", "object listed but gone when read"),
        _c("CK224", "error", None, "storage", "object unreadable: transient storage errors persisted after retries"),
        _c("CK225", "info", None, "storage", "storage requests were retried (throttling, 5xx, timeouts)"),
        _c("CK301", "error", "corrupt", "coverage", "part of a tensor is covered by no chunk"),
        _c("CK302", "error", "corrupt", "coverage", "part of a tensor is covered by more than one chunk"),
        _c("CK303", "error", "corrupt", "coverage", "chunk lies outside the tensor's global shape"),
        _c("CK304", "error", "corrupt", "coverage", "chunk has no storage entry"),
        _c("CK305", "error", "corrupt", "objects", "sharded-object family is missing grid cells"),
        _c("CK306", "error", "corrupt", "objects", "sharded-object family has duplicate cells or inconsistent shapes"),
        _c("CK400", "info", None, "integrity", "no integrity manifest"),
        _c("CK401", "error", "corrupt", "integrity", "file SHA-256 differs from the manifest"),
        _c("CK402", "error", "corrupt", "integrity", "file listed in the manifest is missing or unreadable"),
        _c("CK403", "warning", None, "integrity", "top-level file not listed in the manifest"),
        _c("CK404", "error", "corrupt", "integrity", "manifest unreadable, wrong schema, or unsupported algorithm"),
        _c("CK405", "warning", None, "integrity", "manifest older than metadata.json (stale, from a previous save?)"),
        _c("CK406", "warning", None, "integrity", "temp file left by an interrupted `manifest write`"),
        _c("CK501", "warning", None, "tracker", "save dir without latest_checkpointed_iteration.txt"),
        _c("CK502", "error", "corrupt", "tracker", "tracker unparseable"),
        _c("CK503", "error", "corrupt", "tracker", "tracker names an iteration dir that does not exist"),
        _c("CK504", "error", "incomplete", "tracker", "tracker names an iteration that is not complete"),
        _c("CK505", "warning", None, "tracker", "complete iteration newer than the tracker exists"),
        _c("CK506", "warning", None, "tracker", "incomplete iteration dir exists"),
        _c("CK507", "error", "incomplete", "stack", "NeMo 2 '<ckpt>-unfinished' marker present (save not finished)"),
        _c("CK508", "error", "incomplete", "stack", "Megatron-Bridge save stopped after the payload: no train_state.pt"),
        _c("CK509", "error", "incomplete", "stack", "Megatron-Bridge save stopped before run_config.yaml"),
        _c("CK510", "warning", None, "stack", "Megatron-Bridge tokenizer/ assets expected but missing"),
        _c("CK511", "info", None, "stack", "Megatron non-persistent global checkpoint beside the save dir"),
        _c("CK512", "error", "incomplete", "stack", "NVRx local iteration: a rank's file exists in no rank dir"),
        _c("CK513", "error", "incomplete", "stack", "NVRx local .dirty file (write in progress or crashed)"),
        _c("CK514", "warning", None, "stack", "Megatron-Bridge latest_train_state.pt and the tracker disagree"),
        _c("CK515", "error", "corrupt", "stack", "Megatron FSDP: a SwiGLU linear_fc1 half (_w/_v) missing or misshaped"),
        _c("CK516", "warning", None, "stack", "Megatron FSDP: rng_state \"(pp, tp)\" grid cell missing, malformed or partial"),
        _c("CK517", "error", "corrupt", "stack", "Megatron FSDP: optimizer state without (or with partial) param_to_group_meta"),
        _c("CK540", "error", "incomplete", "stack", "a DP rank's dataloader state (Bridge energon/, torchtitan "
           "dataloader.dp_rank_*) is missing"),
        _c("CK541", "warning", None, "stack", "dataloader state of a DP rank beyond the checkpoint's DP"),
        _c("CK542", "error", "corrupt", "stack", "a dataloader state file or item is unreadable, cut or not the "
           "stack's shape"),
        _c("CK543", "warning", None, "stack", "Megatron-Bridge: no Energon dataloader state for this iteration "
           "while other iterations have it"),
        _c("CK544", "warning", None, "stack", "the DP size recorded with the dataloader state differs from the "
           "checkpoint's DP"),
        _c("CK520", "error", "incomplete", "retain", "no complete checkpoint in the save dir: nothing may be deleted"),
        _c("CK521", "warning", None, "retain", "the tracker does not name a complete iteration (kept; or unreadable: "
           "nothing deleted)"),
        _c("CK522", "info", None, "retain", "a save that may still be in flight is kept"),
        _c("CK523", "warning", None, "retain", "a --keep milestone does not exist in the save dir"),
        _c("CK524", "warning", None, "lineage", "an iteration's model weights are bit-identical to the previous "
           "iteration's (stale save)"),
        _c("CK525", "warning", None, "lineage", "an iteration dir's name and the iteration in its common state disagree"),
        _c("CK526", "warning", None, "lineage", "the tracker's iteration and the iteration stored in the dir it names "
           "disagree"),
        _c("CK527", "warning", None, "lineage", "consumed_train_samples went backwards between consecutive iterations"),
        _c("CK528", "warning", None, "lineage", "the iteration advanced but consumed_train_samples did not"),
        _c("CK529", "warning", None, "lineage", "the scheduler's step went backwards between consecutive iterations"),
        _c("CK530", "warning", None, "watch", "`watch`: a save stayed half-written (unchanged) past --stall-after"),
        _c("CK601", "error", "unsafe", "safety", "pickle references a dangerous callable (not executed)"),
        _c("CK602", "warning", None, "safety", "pickle references a global outside the allowlist"),
        _c("CK603", "error", "corrupt", "safety", "pickle or archive exceeds the reader's resource bounds"),
        _c("CK604", "error", "unsafe", "safety", "pickle calls a global that is not an inert constructor (not executed)"),
        _c("CK605", "error", "unsafe", "safety", "pickle not judged to its end: a bound of the scanner's was hit (fail "
           "closed)"),
        _c("CK606", "error", "unsafe", "safety", "TorchScript archive: torch.load would hand it to torch.jit.load, which runs "
           "its code"),
        _c("CK701", "warning", None, "args", "no training args found in the checkpoint"),
        _c("CK702", "warning", None, "args", "args disagree with the on-disk layout"),
        _c("CK703", "warning", None, "args", "args value of the wrong type or out of range (read as absent)"),
        _c("CK801", "info", None, "estimate", "weights written by DP rank 0 alone; a fully parallel save spreads them"),
        _c("CK901", "error", "corrupt", "values", "NaN in a model weight or an optimizer state tensor"),
        _c("CK902", "error", "corrupt", "values", "+Inf or -Inf in a model weight or an optimizer state tensor"),
        _c("CK903", "warning", None, "values", "subnormal values in a float32/bfloat16/float64 weight beyond 0.1 % of its "
           "elements"),
        _c("CK904", "error", "corrupt", "values", "Adam second moment (exp_avg_sq) negative"),
        _c("CK905", "warning", None, "values", "a model weight matrix is zero throughout"),
        _c("CK906", "warning", None, "values", "an optimizer moment (exp_avg / exp_avg_sq) is zero throughout"),
        _c("CK908", "warning", None, "values", "values of a tensor not read (a chunk could not be read or decoded here)"),
        _c("CK909", "info", None, "values", "values of a dtype that is not decoded (not scanned)"),
        _c("CK911", "error", "corrupt", "values", "a bf16/fp16 model weight is not the rounding of its fp32 main param"),
        _c("CK960", "error", None, "conversion", "conversion diff: no mapping for the architecture or a parameter"),
        _c("CK961", "error", None, "conversion", "conversion diff: a source parameter's target is missing from the "
           "export (or not loadable)"),
        _c("CK962", "error", None, "conversion", "conversion diff: an export tensor no source parameter maps to"),
        _c("CK963", "error", None, "conversion", "conversion diff: a target claimed by two source parameters"),
        _c("CK964", "error", None, "conversion", "conversion diff: a shape that is not the transform's"),
        _c("CK965", "error", None, "conversion", "conversion diff: a tensor whose dtype is not the export's"),
        _c("CK966", "error", None, "conversion", "conversion diff: values differ after the transform"),
        _c("CK967", "error", None, "conversion", "conversion diff: tied input/output embeddings broken"),
        _c("CK968", "error", None, "conversion", "conversion diff: vocabulary rows truncated or padding kept"),
        _c("CK969", "error", None, "conversion", "conversion diff: values of a mapped pair could not be read"),
        _c("CK910", "error", "corrupt", "values", "a parameter without the optimizer state the checkpoint's optimizer "
           "format holds for its other parameters"),
    )
}


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem (or fact) about a checkpoint.

    code: stable code from `CODES`.
    message: one human sentence, specific (names the tensor, the file, the numbers).
    subject: the tensor / object / file it is about, or None.
    path: the checkpoint (or save dir) it belongs to, as the user named it.
    details: JSON-able extra facts (coordinates, sizes, expected/actual), read-only.
    """

    code: str
    message: str
    subject: str | None = None
    path: str | None = None
    details: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        # read-only, copied once (a finding handed on keeps its view: `with_path`, `replace`)
        if not isinstance(self.details, MappingProxyType):
            object.__setattr__(self, "details", MappingProxyType(dict(self.details)))

    def __reduce__(self) -> tuple[type[Finding], tuple[Any, ...]]:
        # a read-only view cannot be pickled; findings still travel between processes
        return Finding, (self.code, self.message, self.subject, self.path, dict(self.details))

    @property
    def info(self) -> CodeInfo:
        return CODES[self.code]

    @property
    def severity(self) -> Severity:
        return CODES[self.code].severity

    @property
    def implied_status(self) -> Status | None:
        return CODES[self.code].status

    def with_path(self, path: str) -> Finding:
        """The same finding attributed to checkpoint `path` (when the producer did not know it)."""
        if self.path is not None:
            return self
        return Finding(self.code, self.message, self.subject, path, self.details)

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": self.severity.value,
            "message": self.message,
            "subject": self.subject,
            "path": self.path,
            "details": dict(self.details),
        }


def status_of(findings: Iterable[Finding]) -> Status:
    """The status a set of findings implies (COMPLETE when none implies anything)."""
    return worst_status(s for s in (f.implied_status for f in findings) if s is not None)


def matches(code: str, prefixes: Iterable[str]) -> bool:
    """True when `code` starts with one of the `--select` / `--ignore` prefixes (case-insensitive)."""
    upper = code.upper()
    return any(upper.startswith(p.upper()) for p in prefixes)


def filter_findings(
    findings: Iterable[Finding], select: Iterable[str] = (), ignore: Iterable[str] = ()
) -> list[Finding]:
    """Apply `--select` (keep only these prefixes; empty keeps all) then `--ignore`."""
    sel = list(select)
    ign = list(ignore)
    return [f for f in findings if (not sel or matches(f.code, sel)) and not matches(f.code, ign)]


def exceeds(findings: Iterable[Finding], fail_on: Severity | None) -> bool:
    """True when some finding is at or above `fail_on` (None = `--fail-on never`)."""
    if fail_on is None:
        return False
    return any(f.severity.rank >= fail_on.rank for f in findings)


# Exit codes of every command, the CLI's and the API's `exit_code()` alike (the contract's table).
EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


class FailOn(str, enum.Enum):
    """`--fail-on` / `fail_on=`: the severity at or above which findings make the exit code 1; NEVER: exit 0."""

    ERROR = "error"
    WARNING = "warning"
    NEVER = "never"

    @property
    def severity(self) -> Severity | None:
        return fail_severity(self)


FailOnLike = Union[FailOn, Literal["error", "warning", "never"], Severity, None]
"""What `fail_on=` takes: a `FailOn`, its name, a `Severity`, or None (= never: exit 0 whatever the findings)."""


def fail_severity(fail_on: FailOnLike) -> Severity | None:
    """The severity at or above which findings fail (None = never); raises ValueError for an unknown name."""
    if fail_on is None or isinstance(fail_on, Severity):
        return fail_on
    if fail_on == "never":
        return None
    if fail_on in ("error", "warning", "info"):
        return Severity(fail_on.value if isinstance(fail_on, FailOn) else fail_on)
    raise ValueError(f"fail_on={fail_on!r}: expected 'error', 'warning' or 'never'")
