"""What an operator does to a dead outbox row: retry it, or dismiss it. Each audited.

A row goes ``dead`` after ``PORTAL_OUTBOX_MAX_ATTEMPTS`` failed publishes
(audit/relay.py) and then holds its task's later rows back. A person holding
``manage_outbox`` on the row's tenant may put it back in line (**retry**) or give
up on it (**dismiss**: the relay never claims it again, and the task's later rows
flow). Each call changes one row and writes one event naming the person, in one
transaction. The admin's "Retry selected dead rows" / "Dismiss selected dead rows"
actions (console/admin/trail.py) call these once per row.

Unlike ``relay.outbox_retry_dead`` (the operator's shell tool, which grants a fresh
attempt budget), a retry here keeps ``attempts``: the count stays the row's true
history, so a row that fails again goes straight back to ``dead`` after this one
extra try instead of looping through the whole backoff ladder again.
"""

from __future__ import annotations

import uuid

from django.db import transaction
from django.db.models import DateTimeField, Func

from portal.actors import Actor
from portal.exceptions import NotFound
from portal.models import Tenant, TenantPerm
from portal.roles import Person, require_tenant_perm

from . import payloads, services
from .exceptions import OutboxRowNotDead
from .models import EventCode, Outbox, OutboxState


class _AppNow(Func):
    """``app_now()``, the SQL clock the relay compares ``available_at`` with."""

    template = "app_now()"
    output_field = DateTimeField()


def _dead_row_for_update(*, tenant: Tenant, outbox_id: uuid.UUID) -> Outbox:
    try:
        row = (
            Outbox.objects.select_for_update(of=("self",))
            .only("id", "tenant_id", "event_id", "topic", "key", "state", "attempts")
            .get(tenant=tenant, pk=outbox_id)
        )
    except Outbox.DoesNotExist:
        raise NotFound(outbox_id=str(outbox_id)) from None  # another tenant's: 404
    if row.state != OutboxState.DEAD:
        raise OutboxRowNotDead(outbox_id=str(outbox_id), state=row.state)
    return row


def _facts(row: Outbox) -> payloads.OutboxRow:
    return {
        "outbox_id": str(row.pk),
        "event_id": str(row.event_id),
        "topic": row.topic,
        "key": row.key,
        "attempts": row.attempts,
    }


@transaction.atomic(durable=True)
def outbox_retry(*, tenant: Tenant, by: Person, outbox_id: uuid.UUID) -> Outbox:
    """Put one dead row of the tenant back in line: ``pending``, due now.

    Guarantee: the row's state change and one ``outbox.retried`` event naming ``by``
    commit together. ``attempts`` and ``last_error`` are kept. The relay is nudged
    after commit (through the event's own outbox row).

    Raises:
        PermissionDenied, TenantNotVisible: ``by`` lacks ``manage_outbox`` here.
        NotFound: no such row in this tenant.
        OutboxRowNotDead: the row is pending, sent or dismissed (nothing changes).
    """
    require_tenant_perm(user=by, perm=TenantPerm.MANAGE_OUTBOX, tenant=tenant)
    row = _dead_row_for_update(tenant=tenant, outbox_id=outbox_id)
    Outbox.objects.filter(tenant=tenant, pk=row.pk).update(
        state=OutboxState.PENDING, available_at=_AppNow(), leased_until=None
    )
    services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.OUTBOX_RETRIED,
        actor=Actor.of_user(by),
        data=_facts(row),
    )
    row.refresh_from_db()
    return row


@transaction.atomic(durable=True)
def outbox_dismiss(*, tenant: Tenant, by: Person, outbox_id: uuid.UUID) -> Outbox:
    """Give up on one dead row of the tenant: ``dismissed``, never published.

    Guarantee: the row's state change and one ``outbox.dismissed`` event naming
    ``by`` commit together. The relay never claims a dismissed row, and it no longer
    holds its task's later rows back. Final: a dismissed row cannot be retried.

    Raises:
        PermissionDenied, TenantNotVisible: ``by`` lacks ``manage_outbox`` here.
        NotFound: no such row in this tenant.
        OutboxRowNotDead: the row is pending, sent or dismissed (nothing changes).
    """
    require_tenant_perm(user=by, perm=TenantPerm.MANAGE_OUTBOX, tenant=tenant)
    row = _dead_row_for_update(tenant=tenant, outbox_id=outbox_id)
    Outbox.objects.filter(tenant=tenant, pk=row.pk).update(state=OutboxState.DISMISSED)
    services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.OUTBOX_DISMISSED,
        actor=Actor.of_user(by),
        data=_facts(row),
    )
    row.refresh_from_db()
    return row
