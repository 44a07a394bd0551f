"""`values CKPT`: the streamed value scan (statistics, fingerprints, findings CK901-CK911) and its `--shard` merge.

- `scan.py`: the units of work (one per tensor chunk box), reading their bytes in bounded pieces, worker processes,
  slices for `--shard K/N`.
- `report.py`: per-tensor results (`TensorScan`), the report, merging shard reports.
- `rules.py`: the value findings, pure functions of the per-tensor statistics.
- `layers.py`: zero layer slices of Megatron's stacked tensors; `desync.py`: CK911, a bf16 / fp16 weight against its
  fp32 main param.
"""
