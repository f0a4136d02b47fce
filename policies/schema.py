"""The Cedar schema a tenant's policies are validated against at publish.

Generated, never written by hand: entity types are fixed (docs/policies.md, "The
entity model") but for the amounts their published contracts declare, the actions
are the ones the tenant's agents are granted, and the context's ``fields`` record
names every field the tenant's published contracts require or read. Evaluation
itself runs without the schema; it is the publish-time check that a policy names
real actions and reads attributes that exist.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from portal.models import AgentGrant, Tenant

_STRING: Final = {"type": "String"}
_LONG: Final = {"type": "Long"}


def _record(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "Record", "attributes": dict(attributes)}


def entity_types(*, amount_names: Sequence[str]) -> dict[str, Any]:
    """The entity types; ``Amounts`` has an attribute per declared amount field."""
    return {
        "Agent": {
            "shape": _record(
                {
                    "name": _STRING,
                    "sponsor": _STRING,  # the sponsor's username, "" for none
                    "trust_tier": _STRING,  # restricted, standard, trusted
                    "tags": {"type": "Set", "element": _STRING},
                }
            )
        },
        "Target": {},
        "BusinessObject": {
            "memberOfTypes": ["Target"],
            "shape": _record({"type": _STRING, "id": _STRING, "version": _STRING}),
        },
        # The operation's top-level arguments, as text (tags: any argument name).
        "Arguments": {"tags": _STRING},
        # The declared amounts (or, under a contract declaring none, every number),
        # as whole numbers: tags, and attributes for the declared ones.
        "Amounts": {
            "shape": _record(
                {name: {**_LONG, "required": False} for name in amount_names}
            ),
            "tags": _LONG,
        },
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


def contract_amount_names(specs: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every amount field the contract specs declare, sorted, once each."""
    names: set[str] = set()
    for spec in specs:
        names.update(spec.get("amount_fields") or ())
    return sorted(names)


def schema_for(
    *,
    actions: Sequence[str],
    field_names: Sequence[str],
    amount_names: Sequence[str] = (),
) -> dict[str, Any]:
    """The Cedar schema (JSON form) for these actions and contract fields."""
    context = _record(
        {
            "action": _STRING,
            "target": _STRING,
            "phase": _STRING,
            "contract": _STRING,
            "contract_version": _LONG,
            "risk_class": _STRING,  # the contract's; "" when it declares none
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
            "entityTypes": entity_types(amount_names=amount_names),
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
