"""JSON Schema validation of `-o json` documents against `docs/schema/` (draft 2020-12, a real validator)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schema"


@cache
def validator(command: str) -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMAS / f"{command.replace(' ', '-')}.schema.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def validate_document(doc: dict[str, Any]) -> None:
    """Validate one `-o json` document against the schema of the command it names; raise on the first error."""
    errors = sorted(validator(doc["command"]).iter_errors(doc), key=lambda e: list(e.absolute_path))
    assert not errors, f"{doc['command']}: {errors[0].message} at {list(errors[0].absolute_path)}"
