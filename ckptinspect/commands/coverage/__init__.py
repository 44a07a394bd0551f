"""`coverage`: per-tensor chunk coverage of one checkpoint (`coverage.py`, on the coverage check's arithmetic) and the
chunk-grid picture of one tensor with gaps and overlaps marked (`picture.py`).
"""
