"""Audit: run every check on a checkpoint or save dir (`audit.py`), the `ls` listing, and the summary (`summary.py`)."""
