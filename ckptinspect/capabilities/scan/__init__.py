"""Pickle-safety scan of a path (`scan.py`: the walk over directories). One file and the containers pickles hide in
are scanned one layer down, shared with the audit's safety check: `checks/safety_scan.py`, `checks/safety_containers.py`.
"""
