"""One governed action in one call: register or find, lease, reserve, execute, settle.

``action_take`` is what ``POST /api/v1/actions`` (and the MCP server's tool calls)
run. It composes the six-call lifecycle's services (``services.task_register``,
``task_lease_acquire``, ``task_transition``, ``operation_reserve``, then the gateway
through ``dispatch.operation_dispatch``) and adds no business rule of its own: the
checks, the call, the receipt and the hand-over to a person are the gateway's.

Identity: the request's ``idempotency_key`` is the operation's key (the business
identity of the side effect). The task is registered under a client task id derived
from it (``client_task_id_for``), so a retry finds the same task and the same
operation, and the remote system is called at most once per key.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from portal.idempotency import IdempotentRequestInFlight
from portal.models import Agent
from portal.tracing import NO_TRACE, Trace

from .gateway.common import TestHook, no_hook

Status = Literal[
    "verified", "refused", "human_required", "unknown", "accepted", "failed"
]
"""What an action came to, for the agent:

- ``verified``: done, the receipt (``provider_reference``) proves it;
- ``refused``: a gateway check refused before any call (``reason_code``,
  ``failed_check``, ``failed_fields``); the task waits for a person
  (``desk_item_id``); do not retry with a new key;
- ``human_required``: a person must decide (after the call, or already with one);
- ``unknown``: the call's result is in doubt (or the call is under way); the portal
  looks the receipt up by key; poll ``status_url`` or repeat the same call;
- ``accepted``: queued for a worker (``respond_async``); poll ``status_url``;
- ``failed``: the remote system rejected the action; this key is spent.
"""

# The owner name of the lease an action call holds while it works.
LEASE_OWNER_PREFIX: Final = "action:"
# How long that lease lives: the call renews nothing, so it outlives a slow remote
# call (the connector's timeout is far shorter) and lapses soon after a crash.
LEASE_TTL_S: Final = 120
# What a caller that found the same key in flight is told to wait, in seconds.
IN_FLIGHT_RETRY_AFTER_S: Final = 1


@dataclass(frozen=True, kw_only=True)
class FieldRead:
    """One field the agent read: its value, where from, and when."""

    value: Any
    source: str
    read_at: dt.datetime


@dataclass(frozen=True, kw_only=True)
class ActionRequest:
    """One governed action, whole.

    ``idempotency_key`` is the side effect's business identity (the operation key,
    e.g. ``ticket-for-issue-1042``); ``arguments`` is the operation's input (hashed
    with RFC 8785 + SHA-256). The same key with the same action, target, object and
    arguments is the same action; the field reads may differ between retries (a
    retry reads again), they are checked fresh by the gateway each time.

    ``contract_key`` (and ``contract_version``) pin the field contract; omitted, the
    tenant's one published contract for ``object_type`` that lists ``target`` as a
    write target is pinned. ``workflow_key`` defaults to the action.
    """

    action: str
    target: str
    object_type: str
    object_id: str
    object_version: str
    fields: Mapping[str, FieldRead]
    arguments: Any
    idempotency_key: str
    contract_key: str | None = None
    contract_version: int | None = None
    workflow_key: str | None = None
    workflow_version: str = "1"


@dataclass(frozen=True, kw_only=True)
class ActionOutcome:
    """What became of the action: an answer the agent can act on without guessing.

    ``next_step`` says what to do in words; ``status_url`` is the operation's
    detail (``/api/v1/operations/{id}``) to poll. ``created`` is True when this call
    reserved the operation (False: an earlier call with the same key did).
    """

    status: Status
    operation_id: uuid.UUID
    task_id: uuid.UUID
    operation_state: str
    task_state: str
    next_step: str
    status_url: str
    created: bool = False
    reason_code: str | None = None
    failed_check: str | None = None
    failed_fields: tuple[str, ...] = ()
    provider_reference: str | None = None
    result: Mapping[str, Any] | None = None
    desk_item_id: uuid.UUID | None = None
    attempts: int = 0
    details: Mapping[str, Any] = field(default_factory=dict)


class ActionInFlight(IdempotentRequestInFlight):
    """Another call with this action key is under way; repeat the same call later."""


def client_task_id_for(idempotency_key: str) -> str:
    """The client task id a one-call action registers its task under."""
    raise NotImplementedError


def action_take(
    *,
    agent: Agent,
    request: ActionRequest,
    respond_async: bool = False,
    trace: Trace = NO_TRACE,
    _test_hook: TestHook = no_hook,
) -> ActionOutcome:
    """Take one governed action: register or find the task, lease it, reserve the
    operation, let the gateway check, call and verify, then settle the task.

    Guarantee: the remote system is called at most once per ``idempotency_key``
    (the gateway's guarantee); no transaction is open during the call; every step
    commits on its own, so a crash anywhere is finished by repeating the same call.
    Repeating a settled action answers the stored outcome without a lease and
    without calling out. On ``verified`` the task is ``succeeded``; on a refusal or
    ``human_required`` the task waits for a person (the gateway moved it); on
    ``failed`` the task is ``failed``; on ``unknown`` the lease is given back and
    recovery settles the operation (repeat the call to settle the task).

    With ``respond_async`` the checks run now and a worker makes the call
    (``accepted``).

    Raises:
        IdempotencyKeyReused: the key was used for another action (another action,
            target, object or arguments); nothing was executed.
        ActionInFlight: another call with the same key holds the task right now.
        ActionNotGranted: the agent holds no grant for the action and target.
        ContractNotFound: no such published contract (or none to infer).
        ContractRetired: the contract version is retired.
        ValidationFailed: the request is not valid (e.g. several contracts fit).
        SensitiveValue: an identifier carries a secret or personal data.
    """
    raise NotImplementedError
