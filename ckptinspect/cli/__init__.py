"""The typer CLI: options, commands, exit codes — nothing else (results render themselves; `render/` draws them).

- `app.py`: the app and the commands sniff / ls / info / audit / coverage / diff / resume; `manifest_cmd.py`,
  `scan_cmd.py`, `estimate_cmd.py`, `values_cmd.py`, `retain_cmd.py`, `watch_cmd.py` add theirs.
- `shell.py`: output formats, the shared options, consoles, progress bars, `emit_result`, and the one error → exit
  code table (`guarded`); `progress_jsonl.py`: `--progress jsonl` events on stderr.
- `github_action.py`: the script of the GitHub Action (`action.yml`).
"""
