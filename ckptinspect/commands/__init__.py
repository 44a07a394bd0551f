"""Capabilities: what the commands do, built on the model, the format readers and the checks.

One package per capability: `audit` (orchestration, `ls` listing, summary), `manifest` (write, verify, merge, hashing),
`diff` (args, tensors, values), `resume` (resume prediction), `scan` (pickle-safety scan, container walking),
`coverage` (chunk-grid picture), `estimate` (what a save costs before the job runs; CK801). They are not named at
the top level of `ckptinspect` because the top level holds the public functions of the same names
(`ckptinspect.audit(...)`, `ckptinspect.diff(...)`, ...): a subpackage `ckptinspect.audit` would replace the
function `ckptinspect.audit` the moment it is imported.
"""
