"""Diff of two checkpoints: orchestration and tensors (`diff.py`), args classification (`args.py`), values (`values.py`)."""
