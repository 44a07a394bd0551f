"""`values CKPT`: the streamed value scan (statistics, fingerprints, findings CK901-CK911) and its `--shard` merge.

- `scan.py`: the units of work (one per tensor chunk box), reading their bytes in bounded pieces, worker processes,
  slices for `--shard K/N`.
- `report.py`: per-tensor results (`TensorScan`), the report, merging shard reports.
- `rules.py`: the value findings, pure functions of the per-tensor statistics.
"""
