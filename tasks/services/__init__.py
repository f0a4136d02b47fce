"""Writes of tasks, leases, operations and contracts.

Each use-case service is one durable transaction that writes the state change, one
event and (through ``event_append``) one outbox row together (docs/style.md R4, R5).

The hot paths (transition, lease, claim, reserve, outcome) are hand-written single
statements: the guard, the write and the read-back happen in one round trip, so a
zero-row result means "someone moved on" and only then is the row read again to say
why (``STALE_STATE``, ``LEASE_EXPIRED``, ...). Every expiry comparison uses the one
SQL clock, ``app_now()``.

One module per concern: ``tasks`` (registration, transitions, leases, claim, the
reaper and wake-up), ``operations`` (reserve, move, begin, outcome) and
``configuration`` (contracts, connectors, object versions). Callers import the
services from here, ``tasks.services``, as the app's one write API.
"""

from __future__ import annotations

from .configuration import (
    CONNECTOR_SETTINGS,
    URL_SETTINGS,
    connector_save,
    contract_create,
    contract_publish,
    contract_retire,
    object_version_record,
)
from .operations import (
    OUTCOMES,
    Reservation,
    operation_begin_execution,
    operation_move,
    operation_record_outcome,
    operation_reserve,
    operation_sensitive_fields,
)
from .tasks import (
    LEASABLE_STATES,
    Registration,
    task_claim_next,
    task_lease_acquire,
    task_lease_release,
    task_lease_renew,
    task_register,
    task_transition,
    unscoped_leases_reap,
    unscoped_waiting_tasks_wake,
)

__all__ = [
    "CONNECTOR_SETTINGS",
    "LEASABLE_STATES",
    "OUTCOMES",
    "URL_SETTINGS",
    "Registration",
    "Reservation",
    "connector_save",
    "contract_create",
    "contract_publish",
    "contract_retire",
    "object_version_record",
    "operation_begin_execution",
    "operation_move",
    "operation_record_outcome",
    "operation_reserve",
    "operation_sensitive_fields",
    "task_claim_next",
    "task_lease_acquire",
    "task_lease_release",
    "task_lease_renew",
    "task_register",
    "task_transition",
    "unscoped_leases_reap",
    "unscoped_waiting_tasks_wake",
]
