"""`watch`: follow a live run's save dir. `state.py` is the pure state machine (snapshots in, events out, testable
without sleeping); `poll.py` reads the snapshots, audits an iteration once its final marker appears, and runs the
polling loop. Read-only: nothing is written into the save dir.
"""

from ckptinspect.commands.watch.poll import WatchOptions, check_save_dir, follow, signature
from ckptinspect.commands.watch.state import STALL_CODE, Event, EventKind, Seen, Snapshot, Verdict, Watcher

__all__ = ["STALL_CODE", "Event", "EventKind", "Seen", "Snapshot", "Verdict", "WatchOptions", "Watcher",
           "check_save_dir", "follow", "signature"]
