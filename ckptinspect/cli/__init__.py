"""The typer CLI: options, commands, exit codes — nothing else."""
