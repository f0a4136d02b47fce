"""Routing's tables keep every group reference inside its tenant (invariant 1) and
an item to one assignment, an event to one message per recipient: raw SQL around
the ORM is refused by name."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from routing.models import Group

pytestmark = pytest.mark.django_db

_ASSIGN = """
INSERT INTO routing_assignment (id, tenant_id, item_kind, item_id, reason_code,
    group_id, assigned_at, remind_at, escalate_at, created_at)
VALUES (%s, %s, 'desk.escalation', %s, '', %s, now(), now(), now(), now())
"""
_NOTIFY = """
INSERT INTO routing_notification (id, tenant_id, event_id, channel, recipient, facts,
    state, attempts, available_at, last_error, created_at)
VALUES (%s, %s, %s, %s, 'someone', '{}', 'pending', 0, now(), '', now())
"""


def refused(sql: str, params: list[Any]) -> str:
    with (
        pytest.raises(IntegrityError) as caught,
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql, params)
    return caught.value.__cause__.diag.constraint_name  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("table", "column", "constraint"),
    [
        ("routing_assignment", "group_id", "routing_assignment_group_same_tenant_fk"),
        ("routing_routingrule", "group_id", "routing_routingrule_group_same_tenant_fk"),
        (
            "routing_routingrule",
            "backup_group_id",
            "routing_routingrule_backup_same_tenant_fk",
        ),
    ],
)
def test_a_group_of_another_tenant_is_refused(
    tenant, other_tenant, table, column, constraint
):
    own = Group.objects.create(tenant=tenant, name="Billing")
    foreign = Group.objects.create(tenant=other_tenant, name="Theirs")
    if table == "routing_assignment":
        sql, params = _ASSIGN, [uuid.uuid4(), tenant.pk, uuid.uuid4(), foreign.pk]
    else:
        groups = {"group_id": own.pk, "backup_group_id": own.pk, column: foreign.pk}
        sql = (
            "INSERT INTO routing_routingrule (id, tenant_id, reason_code, group_id,"
            " backup_group_id, remind_after_s, escalate_after_s)"
            " VALUES (%s, %s, 'FIELD_STALE', %s, %s, 60, 300)"
        )
        params = [
            uuid.uuid4(),
            tenant.pk,
            groups["group_id"],
            groups["backup_group_id"],
        ]
    assert refused(sql, params) == constraint


def test_an_item_has_one_assignment_and_an_event_one_message_per_recipient(tenant):
    group = Group.objects.create(tenant=tenant, name="Billing")
    item, event = uuid.uuid4(), uuid.uuid4()
    with connection.cursor() as cursor:
        cursor.execute(_ASSIGN, [uuid.uuid4(), tenant.pk, item, group.pk])
        cursor.execute(_NOTIFY, [uuid.uuid4(), tenant.pk, event, "email"])
    assert (
        refused(_ASSIGN, [uuid.uuid4(), tenant.pk, item, group.pk])
        == "routing_assignment_item_uniq"
    )
    assert (
        refused(_NOTIFY, [uuid.uuid4(), tenant.pk, event, "email"])
        == "routing_notification_once_uniq"
    )
    assert (
        refused(_NOTIFY, [uuid.uuid4(), tenant.pk, uuid.uuid4(), "sms"])
        == "routing_notification_channel_check"
    )


def test_the_reminder_comes_before_the_escalation(tenant):
    group = Group.objects.create(tenant=tenant, name="Billing")
    sql = (
        "INSERT INTO routing_routingrule (id, tenant_id, reason_code, group_id,"
        " remind_after_s, escalate_after_s) VALUES (%s, %s, '', %s, 300, 300)"
    )
    assert (
        refused(sql, [uuid.uuid4(), tenant.pk, group.pk])
        == "routing_routingrule_intervals_check"
    )
