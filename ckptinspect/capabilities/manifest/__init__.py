"""Integrity manifests: write / verify / merge (`manifest.py`), reports (`report.py`), parallel hashing (`hashing.py`)."""
