"""The field-contract spec and its JSON Schema (docs/architecture.md, domain model)."""

from __future__ import annotations

import json
from typing import Any, Final

import jsonschema

from audit.redaction import SENSITIVE_KINDS

from .exceptions import ContractInvalid

_NAME = {"type": "string", "minLength": 1, "maxLength": 100}
RISK_CLASSES: Final = ("low", "medium", "high", "critical")

CONTRACT_SPEC_SCHEMA: Final[dict[str, Any]] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["object_type", "required_fields", "policy", "receipt"],
    "properties": {
        "object_type": _NAME,
        "required_fields": {
            "type": "array",
            "maxItems": 100,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "source", "max_age_s"],
                "properties": {
                    "name": _NAME,
                    "source": _NAME,
                    "max_age_s": {"type": "integer", "minimum": 0},
                },
            },
        },
        "policy": {
            "type": "object",
            "additionalProperties": False,
            "required": ["read_fields", "write_targets", "credential_ttl_s"],
            "properties": {
                "read_fields": {"type": "array", "items": _NAME, "maxItems": 100},
                "write_targets": {"type": "array", "items": _NAME, "maxItems": 100},
                "credential_ttl_s": {"type": "integer", "minimum": 1, "maximum": 3600},
            },
        },
        "receipt": {
            "type": "object",
            "additionalProperties": False,
            "required": ["required", "type"],
            "properties": {"required": {"type": "boolean"}, "type": _NAME},
        },
        # The arguments (or checked fields) that are amounts of money: what a
        # tenant's policies compare as numbers (context.amounts.<name>;
        # docs/policies.md). Versions that declare none count every number.
        "amount_fields": {"type": "array", "items": _NAME, "maxItems": 20},
        # How much harm the action can do, for the tenant's policies
        # (context.risk_class); "" in the policy context when not declared.
        "risk_class": {"enum": list(RISK_CLASSES)},
        # Field names whose values are personal data or secrets, wherever they
        # appear as a key (the operation's input, call fields, result, evidence):
        # stored as a keyed hash, never as the value (docs/redaction.md).
        # (Names are checked by contract_spec_validate: OpenAPI 3.0, which embeds
        # this schema, has no propertyNames.)
        "sensitive_fields": {
            "type": "object",
            "maxProperties": 100,
            "additionalProperties": {"enum": sorted(SENSITIVE_KINDS)},
        },
    },
}

_VALIDATOR = jsonschema.Draft202012Validator(CONTRACT_SPEC_SCHEMA)


def contract_spec_validate(spec: Any) -> None:
    """Check a contract spec against the schema, and field names for duplicates.

    Raises:
        ContractInvalid: with every problem found, each with its JSON path.
    """
    problems = [
        {
            "path": "/" + "/".join(str(part) for part in error.absolute_path),
            "message": error.message,
        }
        for error in sorted(_VALIDATOR.iter_errors(spec), key=lambda e: e.json_path)
    ]
    if not problems:
        names = [field["name"] for field in spec["required_fields"]]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            problems.append(
                {"path": "/required_fields", "message": f"duplicate names {duplicates}"}
            )
        problems.extend(
            {
                "path": "/sensitive_fields",
                "message": "a field name is 1 to 100 characters",
            }
            for name in spec.get("sensitive_fields") or {}
            if not 0 < len(name) <= 100
        )
    if problems:
        raise ContractInvalid(problems=problems)


def contract_sensitive_fields(spec: Any) -> dict[str, str]:
    """The spec's declared sensitive fields (name -> ``personal`` | ``secret``).

    Versions published before ``sensitive_fields`` existed declare none.
    """
    if isinstance(spec, str | bytes):  # a raw statement's jsonb
        spec = json.loads(spec)
    declared = spec.get("sensitive_fields") if isinstance(spec, dict) else None
    return dict(declared) if isinstance(declared, dict) else {}


def contract_receipt_required(spec: Any) -> bool:
    """Whether a call under this spec is verified only by a confirming receipt
    lookup: ``receipt.required``, true where the spec (or its value) is missing, as
    in the seed's contracts."""
    receipt = spec.get("receipt") if isinstance(spec, dict) else None
    required = receipt.get("required") if isinstance(receipt, dict) else None
    return required is None or bool(required)


def contract_amount_fields(spec: Any) -> tuple[str, ...] | None:
    """The spec's declared amount fields, or None when it declares none (then a
    policy's ``context.amounts`` counts every number, as before the declaration)."""
    declared = spec.get("amount_fields") if isinstance(spec, dict) else None
    return tuple(declared) if isinstance(declared, list) else None


def contract_risk_class(spec: Any) -> str:
    """The spec's declared risk class, or "" when it declares none."""
    declared = spec.get("risk_class") if isinstance(spec, dict) else None
    return declared if isinstance(declared, str) else ""
