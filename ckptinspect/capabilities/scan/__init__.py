"""Pickle-safety scan (`scan.py`) and the walk over the containers pickles hide in (`archives.py`)."""
