"""Pickle-safety scan of a path (`scan.py`: the walk over directories). One file and the containers pickles hide in
are scanned one layer down, shared with the audit's safety check: `services/safety_scan.py`, `services/safety_containers.py`.
"""
