"""Engines shared by the audit's checks and by the commands, below both: they read files, never judge a checkpoint.

- `integrity_hashing.py`: which files a manifest covers and hashing them (threads, progress).
- `integrity_verify.py`: verifying an `integrity.json` (the audit's integrity check, `manifest verify`).
- `integrity_report.py`: what a verification returns (`FileResult`, `ManifestReport`) and its JSON form.
- `safety_scan.py`: the pickle-safety scan of one file (`.metadata`, `.pt`-like, `.distcp` with its stored items).
- `safety_containers.py`: walking one container (zip member, tar member, raw pickle) and recording what it holds.
- `chunk_bytes.py`: where a chunk's raw values are (torch_dist / DCP item archives, legacy `.pt` records) and a
  read-only view of them (`diff --values`, the value scan).
- `values.py`: the value scan of raw tensor bytes (a chunk's runs at their global indices, merged per tensor), over
  `values_stats.py` (torch-free decoding and per-tensor statistics) and `values_fingerprint.py` (the shard-invariant
  fingerprint, the contract's "Value fingerprint").
"""
