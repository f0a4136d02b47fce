"""The Cedar schema a tenant's policies are validated against at publish.

Generated, never written by hand: entity types are fixed (docs/policies.md, "The
entity model"), the actions are the ones the tenant's agents are granted, and the
context's ``fields`` record names every field the tenant's published contracts
require or read. Evaluation itself runs without the schema; it is the publish-time
check that a policy names real actions and reads attributes that exist.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from portal.models import AgentGrant, Tenant

_STRING: Final = {"type": "String"}
_LONG: Final = {"type": "Long"}


def _record(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "Record", "attributes": dict(attributes)}


ENTITY_TYPES: Final[dict[str, Any]] = {
    "Agent": {"shape": _record({"name": _STRING})},
    "Target": {},
    "BusinessObject": {
        "memberOfTypes": ["Target"],
        "shape": _record({"type": _STRING, "id": _STRING, "version": _STRING}),
    },
    # The operation's top-level arguments, as text (tags: any argument name).
    "Arguments": {"tags": _STRING},
    # Its numeric arguments and numeric field values, as whole numbers.
    "Amounts": {"tags": _LONG},
}


def contract_field_names(specs: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every field the contract specs require or read, sorted, once each."""
    names: set[str] = set()
    for spec in specs:
        names.update(field["name"] for field in spec.get("required_fields", ()))
        names.update(spec.get("policy", {}).get("read_fields", ()))
    return sorted(names)


def granted_actions(*, tenant: Tenant) -> list[str]:
    """The actions the tenant's agents hold grants for: the governed actions."""
    return sorted(
        set(AgentGrant.objects.filter(tenant=tenant).values_list("action", flat=True))
    )


def schema_for(*, actions: Sequence[str], field_names: Sequence[str]) -> dict[str, Any]:
    """The Cedar schema (JSON form) for these actions and contract fields."""
    context = _record(
        {
            "action": _STRING,
            "target": _STRING,
            "phase": _STRING,
            "contract": _STRING,
            "contract_version": _LONG,
            "time": _record({"weekday": _STRING, "hour": _LONG, "date": _STRING}),
            "input": {"type": "Entity", "name": "Arguments"},
            "amounts": {"type": "Entity", "name": "Amounts"},
            "fields": _record(
                {name: {**_STRING, "required": False} for name in field_names}
            ),
        }
    )
    return {
        "": {
            "entityTypes": ENTITY_TYPES,
            "actions": {
                action: {
                    "appliesTo": {
                        "principalTypes": ["Agent"],
                        "resourceTypes": ["BusinessObject"],
                        "context": context,
                    }
                }
                for action in actions
            },
        }
    }
