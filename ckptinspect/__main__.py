"""`python -m ckptinspect`: the same entry point as the console script."""

from __future__ import annotations

from ckptinspect.cli.app import main

if __name__ == "__main__":
    main()
