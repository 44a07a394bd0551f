"""`retain`: a read-only retention plan for a save dir — which iteration dirs could be deleted, and why each kept one
stays. `facts.py` reads the save dir (each iteration classified as `ls` does, its manifest checked, the age rule of
`formats/inflight.py` for the unfinished ones); `plan.py` is the pure rule set that turns those facts and a
`RetainPolicy` into a frozen `RetainPlan`. Nothing is deleted: the plan is text, JSON or NUL-separated paths.
"""

from ckptinspect.commands.retain.facts import IterationFacts, ManifestState, SaveDirFacts, TrackerState, read_facts
from ckptinspect.commands.retain.plan import Entry, Reason, RetainPlan, RetainPolicy, plan_retention, retain

__all__ = ["IterationFacts", "Entry", "ManifestState", "Reason", "RetainPlan", "RetainPolicy", "SaveDirFacts",
           "TrackerState", "plan_retention", "read_facts", "retain"]
