"""Integrity manifests: write (`manifest.py`), merge of shard reports (`report.py`). Verifying, the report types and
the hashing sit one layer down, shared with the audit's integrity check: `services/integrity_{verify,report,hashing}.py`.
"""
