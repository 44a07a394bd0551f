"""Coverage: the chunk-grid picture of one tensor (`picture.py`)."""
