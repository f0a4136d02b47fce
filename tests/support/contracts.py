"""The customer-issue contract the tests publish, written out once.

``SPEC`` is the README demo's contract (``seed_demo``): a ticket at the desk
``TARGET`` needs a fresh e-mail address from the CRM (at most 300 s old) and a plan
from billing (at most 3600 s); the desk may see the e-mail; a ``ticket_id`` receipt
is required. ``customer_issue_spec`` makes the variants some tiers need: fewer
fields, another target, a longer age.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

TARGET: Final = "ticket-desk"

# Each field's source system and the age the demo's contract allows it.
_FIELDS: Final = {"email": ("crm", 300), "plan": ("billing", 3600)}
# What the desk may see of them.
_READ: Final = ("email",)


def customer_issue_spec(
    *,
    fields: Sequence[str] = ("email", "plan"),
    target: str = TARGET,
    max_age_s: int | None = None,
) -> dict[str, Any]:
    """The customer-issue contract with ``fields`` required (each at its demo age,
    or ``max_age_s`` for all), writing to ``target``."""
    return {
        "object_type": "customer_issue",
        "required_fields": [
            {
                "name": name,
                "source": _FIELDS[name][0],
                "max_age_s": max_age_s or _FIELDS[name][1],
            }
            for name in fields
        ],
        "policy": {
            "read_fields": [name for name in fields if name in _READ],
            "write_targets": [target],
            "credential_ttl_s": 60,
        },
        "receipt": {"required": True, "type": "ticket_id"},
    }


SPEC: Final = customer_issue_spec()
