"""JUnit XML: one testcase per check family, a failure per error finding (warnings go to system-out)."""

from __future__ import annotations

from collections import defaultdict
from xml.etree import ElementTree as ET

from ckptinspect.findings import CODES, Finding, Severity

FAMILIES = ("format", "storage", "coverage", "objects", "legacy", "args", "integrity", "tracker", "safety")


def findings_junit(suite_name: str, findings: list[Finding]) -> str:
    by_family: dict[str, list[Finding]] = defaultdict(list)
    for f in findings:
        by_family[CODES[f.code].family].append(f)
    errors = [f for f in findings if f.severity is Severity.ERROR]
    suite = ET.Element("testsuite", name=f"ckptinspect {suite_name}", tests=str(len(FAMILIES)),
                       failures=str(sum(1 for fam in FAMILIES if any(f.severity is Severity.ERROR
                                                                     for f in by_family[fam]))),
                       errors="0")
    for fam in FAMILIES:
        case = ET.SubElement(suite, "testcase", classname=f"ckptinspect.{fam}", name=f"{fam} checks")
        fam_errors = [f for f in by_family[fam] if f.severity is Severity.ERROR]
        for f in fam_errors:
            failure = ET.SubElement(case, "failure", type=f.code, message=f.message[:500])
            failure.text = f"{f.code} {f.path or ''} {f.subject or ''}\n{f.message}"
        others = [f for f in by_family[fam] if f.severity is not Severity.ERROR]
        if others:
            out = ET.SubElement(case, "system-out")
            out.text = "\n".join(f"{f.code} {f.severity.value}: {f.message}" for f in others)
    root = ET.Element("testsuites", tests=str(len(FAMILIES)), failures=suite.get("failures", "0"))
    root.append(suite)
    del errors
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
