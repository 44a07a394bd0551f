"""`audit`: run every check on a checkpoint or save dir, and list a save dir's iterations (`audit.py`); who wrote what:
bytes per save-time rank and file, split by component (`summary.py`); lineage across a save dir's iterations, CK524 a stale save (`lineage.py`).
"""
