"""What the commands do, built on the model, the readers, the services and the checks; one package per command.

- `audit/`: `audit.py` runs every check on a checkpoint or a save dir (and the `ls` listing); `summary.py` says who
  wrote what (bytes per rank and component).
- `coverage/`: `coverage.py` per-tensor chunk coverage of one checkpoint; `picture.py` the chunk-grid picture of one
  tensor.
- `diff/`: `diff.py` orchestration and tensors; `args.py` which args Megatron checks on load; `values.py` chunk bytes
  compared; `optim.py` optimizer state across DistributedOptimizer formats; `reformulated.py` N-D reformulated state.
- `estimate/`: what a save costs before the job runs (its `__init__` walks the stages); `concentration.py` is CK801,
  which `audit` adds.
- `manifest/`: `manifest.py` writes `integrity.json`; `report.py` merges shard reports (verifying is
  `services/integrity_verify.py`).
- `resume/`: the rule table that predicts what a resume restores (its `__init__` names the modules in order).
- `retain/`: `facts.py` reads a save dir for a retention plan (each iteration classified, manifest checked, age
  rule); `plan.py` the pure rules deciding which iteration dirs could be deleted and why each kept one stays.
- `watch/`: `state.py` the pure state machine of `watch` (snapshots of a save dir in, events out); `poll.py` the
  polls, the audit of each iteration once its final marker appears, and the polling loop.
- `values/`: the value scan: `scan.py` units of work read in bounded pieces, `report.py` per-tensor results and the
  `--shard` merge, `rules.py` the value findings (CK901-CK911).
- `scan/`: `scan.py` the walk over a path's directories (one file's scan is `services/safety_scan.py`).

They may use each other without a cycle (`audit` uses `estimate`; the layering test checks it). They are not named at
the top level of `ckptinspect` because the top level holds the public functions of the same names
(`ckptinspect.audit(...)`, `ckptinspect.diff(...)`).
"""
