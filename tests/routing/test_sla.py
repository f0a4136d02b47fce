"""The SLA clock on the test clock (app_now()): a reminder after one interval, an
escalation to the backup group after the other, each once, with its event, its
notifications and a breach counted; a resolved item is left alone."""

from __future__ import annotations

import pytest
from django.db import connection

from audit.models import Event, EventCode
from portal import metrics
from routing import services as routing_services
from routing.models import Assignment, Notification
from tests.support.db import db_clock_offset

from .conftest import escalate_with_canary

pytestmark = pytest.mark.django_db


def breaches(reason_code: str) -> float:
    return metrics.SLA_BREACHES.labels(reason_code)._value.get()


def events(desk, code: str) -> int:
    return Event.objects.filter(tenant=desk.tenant, code=code).count()


def test_reminder_then_escalation_to_the_backup_group(
    desk, make_task, make_operation, django_capture_on_commit_callbacks
):
    # given a FIELD_STALE item (remind after 60 s, escalate after 300 s)
    _, record = escalate_with_canary(make_task, make_operation, desk.tenant)
    assignment = Assignment.objects.get(tenant=desk.tenant, item_id=record.pk)
    before = breaches("FIELD_STALE")

    # when the sweep runs now: nothing is due
    assert routing_services.sla_sweep() == (0, 0)

    # when it runs 61 s later: one reminder to Billing (Ana's e-mail, the webhook)
    with db_clock_offset(61):
        assert routing_services.sla_sweep() == (1, 0)
        assert routing_services.sla_sweep() == (0, 0)  # once only
    assignment.refresh_from_db()
    assert assignment.reminded_at is not None and assignment.escalated_at is None
    assert events(desk, EventCode.DESK_ITEM_REMINDED) == 1
    reminded = Notification.objects.filter(
        tenant=desk.tenant, facts__event=EventCode.DESK_ITEM_REMINDED
    )
    assert sorted(reminded.values_list("channel", "recipient")) == sorted(
        [("email", str(desk.members["ana"].pk)), ("webhook", str(desk.webhook.pk))]
    )

    # when it runs 301 s later: escalated to On-call, a breach counted at commit
    with db_clock_offset(301), django_capture_on_commit_callbacks(execute=True):
        assert routing_services.sla_sweep() == (0, 1)
    with db_clock_offset(3600):
        assert routing_services.sla_sweep() == (0, 0)  # once only

    # then the item is On-call's, with its event and notifications to Cy
    assignment.refresh_from_db()
    assert assignment.group_id == desk.backup.pk
    assert assignment.escalated_at is not None
    assert events(desk, EventCode.DESK_ITEM_ESCALATED) == 1
    escalated = Notification.objects.filter(
        tenant=desk.tenant, facts__event=EventCode.DESK_ITEM_ESCALATED
    )
    assert ("email", str(desk.members["cy"].pk)) in escalated.values_list(
        "channel", "recipient"
    )
    assert breaches("FIELD_STALE") == before + 1


def test_a_resolved_item_is_neither_reminded_nor_escalated(
    desk, make_task, make_operation
):
    # given an item whose escalation a person resolved
    _, record = escalate_with_canary(make_task, make_operation, desk.tenant)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tasks_escalation SET resolved_at = now(), resolution = 'fail'"
            " WHERE id = %s",
            [record.pk],
        )

    # when the sweep runs past both deadlines
    with db_clock_offset(3600):
        assert routing_services.sla_sweep() == (0, 0)

    # then the item is closed and no event was written
    assert Assignment.objects.get(item_id=record.pk).closed_at is not None
    assert events(desk, EventCode.DESK_ITEM_REMINDED) == 0
    assert events(desk, EventCode.DESK_ITEM_ESCALATED) == 0


def test_an_item_without_a_rule_goes_to_the_default_group(
    desk, make_task, make_operation, settings
):
    # given a reason code no rule names and no default rule
    _, record = escalate_with_canary(
        make_task, make_operation, desk.tenant, reason="RESULT_UNKNOWN"
    )

    # then the item is the 'Takeover desk' group's, on the default intervals
    assignment = Assignment.objects.select_related().get(item_id=record.pk)
    assert assignment.group.name == routing_services.DEFAULT_GROUP
    assert (assignment.escalate_at - assignment.assigned_at).total_seconds() == (
        settings.PORTAL_SLA_ESCALATE_AFTER_S
    )


def test_another_tenants_items_are_out_of_the_sweeps_reach(
    desk, make_task, make_operation, other_tenant
):
    """The sweep works under the scope its discovery function returns: a due item
    of one tenant never brings another tenant's rows into view."""
    escalate_with_canary(make_task, make_operation, desk.tenant)
    with connection.cursor() as cursor, db_clock_offset(61):
        cursor.execute("SELECT * FROM routing_tenants_with_due_work()")
        found = {str(row[0]) for row in cursor.fetchall()}
    assert str(desk.tenant.pk) in found
    assert str(other_tenant.pk) not in found


def test_an_item_resolved_after_its_escalation_is_closed(
    desk, make_task, make_operation
):
    # given an item escalated past its deadline, then resolved by a person
    _, record = escalate_with_canary(make_task, make_operation, desk.tenant)
    with db_clock_offset(301):
        assert routing_services.sla_sweep() == (0, 1)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tasks_escalation SET resolved_at = now(), resolution = 'fail'"
            " WHERE id = %s",
            [record.pk],
        )
        # (its notifications went out: they bring no sweep to the tenant)
        cursor.execute("UPDATE routing_notification SET state = 'sent'")

    # when the next sweep runs
    with db_clock_offset(400):
        routing_services.sla_sweep()

    # then the item is closed and no longer counts as past its SLA
    assert Assignment.objects.get(item_id=record.pk).closed_at is not None
