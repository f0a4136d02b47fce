"""Check a policy set before it is published: it parses, fits the schema, and its
annotations mean something (docs/policies.md, "Publishing").

cedarpy reports a parse error without its position, and a schema error by the
parser's policy id; each problem here carries the line it is on, found by parsing
growing prefixes of the text (a set is small: one parse takes microseconds).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import cedarpy

# Big enough for any policy set a person writes and reviews; bounds the prefix scan.
MAX_TEXT_CHARS: Final = 64 * 1024
# Annotations the engine reads, and what their value must be.
_WHOLE_NUMBER_ANNOTATIONS: Final = ("quorum", "credential_ttl_s")


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One reason a policy set cannot be published."""

    message: str
    line: int | None = None
    policy: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"message": self.message, "line": self.line, "policy": self.policy}

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line is not None else ""
        return f"{where}{self.message}"


def _parses(text: str) -> int | None:
    """How many policies ``text`` holds, or None when it does not parse."""
    try:
        return len(cedarpy.PolicySet.from_str(text))
    except ValueError:
        return None


def _parse_error_line(lines: list[str], message: str) -> int:
    """The first line by which the whole text's parse error has shown itself."""
    for count in range(1, len(lines) + 1):
        try:
            cedarpy.PolicySet.from_str("".join(lines[:count]))
        except ValueError as error:
            if str(error) == message:
                return count
    return len(lines)


def policy_lines(text: str) -> dict[str, int]:
    """Each policy's id (``policy0``, …) -> the line it starts on (1-based)."""
    lines = text.splitlines(keepends=True)
    starts: dict[str, int] = {}
    seen = 0
    start = 1
    for count in range(1, len(lines) + 1):
        parsed = _parses("".join(lines[:count]))
        if parsed is not None and parsed > seen:
            starts[f"policy{seen}"] = start
            seen = parsed
            start = count + 1
        elif parsed is not None:
            start = count + 1  # blank lines and comments between policies
        elif lines[start - 1].strip() == "" and start == count:
            start = count + 1
    return starts


def _annotation_problems(
    annotations: Mapping[str, Mapping[str, str]], lines: Mapping[str, int]
) -> list[Problem]:
    problems = []
    for policy_id, notes in annotations.items():
        for name in _WHOLE_NUMBER_ANNOTATIONS:
            value = notes.get(name)
            if value is not None and not (value.isdigit() and int(value) > 0):
                problems.append(
                    Problem(
                        message=f"@{name}({value!r}) must be a whole number above 0",
                        line=lines.get(policy_id),
                        policy=policy_id,
                    )
                )
        if "quorum" in notes and "approval" not in notes:
            problems.append(
                Problem(
                    message="@quorum without @approval",
                    line=lines.get(policy_id),
                    policy=policy_id,
                )
            )
    return problems


_AMOUNTS: Final = {".": {"left": {"Var": "context"}, "attr": "amounts"}}


def _amounts_named(node: Any) -> set[str]:
    """Every attribute a policy's JSON form reads or tests (``.``, ``has``) on
    ``context.amounts``."""
    names: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if (
                key in (".", "has")
                and isinstance(value, dict)
                and value.get("left") == _AMOUNTS
                and isinstance(value.get("attr"), str)
            ):
                names.add(value["attr"])
            names |= _amounts_named(value)
    elif isinstance(node, list):
        for value in node:
            names |= _amounts_named(value)
    return names


def _undeclared_amount_problems(
    policies: Mapping[str, Any], schema: Mapping[str, Any], lines: Mapping[str, int]
) -> list[Problem]:
    """An amount no published contract declares: Cedar types ``has`` on it as
    false, so the policy would publish and never match (docs/policies.md)."""
    amounts = schema.get("", {}).get("entityTypes", {}).get("Amounts", {})
    declared = set(amounts.get("shape", {}).get("attributes", {}))
    return [
        Problem(
            message=f"context.amounts.{name}: no published contract declares "
            f"{name!r} among its amount_fields, so this would never match",
            line=lines.get(policy_id),
            policy=policy_id,
        )
        for policy_id, policy in policies.items()
        for name in sorted(_amounts_named(policy.get("conditions")) - declared)
    ]


def policy_problems(*, text: str, schema: Mapping[str, Any]) -> list[Problem]:
    """Every reason ``text`` cannot be published against ``schema``; [] if none."""
    if not text.strip():
        return [Problem(message="the policy set is empty")]
    if len(text) > MAX_TEXT_CHARS:
        return [Problem(message=f"longer than {MAX_TEXT_CHARS} characters")]
    try:
        parsed = json.loads(cedarpy.policies_to_json_str(text))
    except ValueError as error:
        lines = text.splitlines(keepends=True)
        return [Problem(message=str(error), line=_parse_error_line(lines, str(error)))]
    if parsed.get("templates"):
        return [Problem(message="templates (?principal, ?resource) are not supported")]
    lines_by_policy = policy_lines(text)
    result = cedarpy.validate_policies(text, dict(schema))
    problems = [
        Problem(
            message=error.error,
            line=lines_by_policy.get(error.policy_id),
            policy=error.policy_id or None,
        )
        for error in result.errors
    ]
    annotations = {
        policy_id: dict(policy.get("annotations") or {})
        for policy_id, policy in parsed.get("staticPolicies", {}).items()
    }
    policies = parsed.get("staticPolicies", {})
    return (
        problems
        + _undeclared_amount_problems(policies, schema, lines_by_policy)
        + _annotation_problems(annotations, lines_by_policy)
    )
