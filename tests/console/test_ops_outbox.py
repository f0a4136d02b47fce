"""The outbox monitor: its figures, and retrying or dismissing dead rows, per role."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext

from audit import outbox_admin, relay
from audit import services as audit_services
from audit.models import Event, EventCode, Outbox, OutboxState
from console import dashboard
from portal.actors import Actor
from portal.exceptions import PermissionDenied, TenantNotVisible
from portal.models import Tenant

from .ops_people import logged_in, person

CHANGELIST = "/admin/audit/outbox/"


def make_row(
    tenant: Tenant,
    *,
    state: str = OutboxState.PENDING,
    created_ago_s: float = 0,
    sent_after_s: float | None = None,
    attempts: int = 0,
    task_id: uuid.UUID | None = None,
) -> Outbox:
    """An outbox row (with its event) in ``state``, created ``created_ago_s`` ago by
    the database clock and, if sent, sent ``sent_after_s`` after that."""
    with transaction.atomic():
        event_id = audit_services.event_append(
            tenant_id=tenant.pk,
            code=EventCode.TASK_REGISTERED,
            actor=Actor.system("ops-tests"),
            task_id=task_id,
        )
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE audit_outbox SET
                state = %(state)s::text, attempts = %(attempts)s,
                created_at = app_now() - make_interval(secs => %(ago)s),
                sent_at = CASE WHEN %(state)s::text = 'sent' THEN app_now()
                    - make_interval(secs => %(ago)s) + make_interval(secs => %(after)s)
                    END,
                available_at = app_now() - make_interval(secs => %(ago)s),
                last_error = CASE WHEN %(state)s::text = 'dead' THEN 'broker said no' ELSE ''
                    END
            WHERE event_id = %(event)s
            """,
            {
                "state": state,
                "attempts": attempts,
                "ago": created_ago_s,
                "after": sent_after_s or 0,
                "event": event_id,
            },
        )
    return Outbox.objects.get(event_id=event_id)


def post_action(client: Client, action: str, rows: list[Outbox]) -> object:
    return client.post(
        CHANGELIST,
        {
            "action": action,
            "_selected_action": [str(row.pk) for row in rows],
            "index": "0",
        },
        follow=True,
    )


def events_of(tenant: Tenant, code: str) -> list[Event]:
    return list(Event.objects.filter(tenant=tenant, code=code).order_by("created_at"))


# --- The figures -----------------------------------------------------------------


@pytest.mark.django_db
def test_the_monitor_counts_known_rows_per_tenant(tenant, other_tenant):
    # given: in tenant: 2 pending (the oldest 120 s old), 3 dead, 4 sent in the last
    # hour with 1, 2, 3 and 10 s of delivery lag, and 1 sent two hours ago (100 s)
    make_row(tenant, created_ago_s=120)
    make_row(tenant, created_ago_s=5)
    for _ in range(3):
        make_row(tenant, state=OutboxState.DEAD, created_ago_s=600, attempts=8)
    for lag in (1, 2, 3, 10):
        make_row(tenant, state=OutboxState.SENT, created_ago_s=60, sent_after_s=lag)
    make_row(tenant, state=OutboxState.SENT, created_ago_s=7300, sent_after_s=100)
    make_row(tenant, state=OutboxState.DISMISSED, created_ago_s=900)
    # and other rows in another tenant
    make_row(other_tenant, state=OutboxState.DEAD)
    make_row(other_tenant, created_ago_s=9999)

    # when
    (health,) = dashboard.outbox_health(tenants=[tenant])

    # then
    assert (health.pending.value, health.dead.value) == (2, 3)
    assert health.sent_last_hour.value == 4
    assert health.relay_lag_s == pytest.approx(120, abs=5)
    assert health.lag_sample == 5
    # percentile_cont over [1, 2, 3, 10, 100]: the median, and 10 + 0.8 * 90
    assert health.lag_p50_s == pytest.approx(3)
    assert health.lag_p95_s == pytest.approx(82)
    assert not health.dead.capped


@pytest.mark.django_db
def test_an_empty_outbox_has_no_lag(tenant):
    (health,) = dashboard.outbox_health(tenants=[tenant])
    assert (health.pending.value, health.dead.value, health.sent_last_hour.value) == (
        0,
        0,
        0,
    )
    assert health.relay_lag_s is None and health.lag_sample == 0
    assert health.lag_p50_s is None


@pytest.mark.django_db
def test_the_monitor_page_shows_the_admins_tenant_only(tenant, other_tenant):
    make_row(tenant, state=OutboxState.DEAD)
    make_row(tenant, created_ago_s=30)
    hidden = make_row(other_tenant, state=OutboxState.DEAD)
    admin = person("admin", tenant)

    response = logged_in(admin).get(CHANGELIST)

    assert response.status_code == 200
    monitor = response.context["outbox_health"]
    assert [h.tenant for h in monitor] == [tenant]
    html = response.content.decode()
    assert 'id="outbox-monitor"' in html and f'data-tenant="{tenant.slug}"' in html
    assert other_tenant.slug not in html and str(hidden.pk) not in html
    # The state filter is a fixed list; there is no topic filter to DISTINCT over.
    assert "By topic" not in html


@pytest.mark.django_db
def test_the_monitor_page_runs_a_bounded_number_of_queries(tenant, make_tenant):
    # given: one admin of one tenant, and one of four tenants with more rows
    admin = person("admin", tenant)
    make_row(tenant, state=OutboxState.DEAD)
    many = [make_tenant() for _ in range(4)]
    busy = person("admin", *many)
    for other in many:
        for state in (OutboxState.DEAD, OutboxState.PENDING, OutboxState.SENT):
            make_row(other, state=state, sent_after_s=1)

    def queries(user) -> int:
        client = logged_in(user)
        with CaptureQueriesContext(connection) as captured:
            assert client.get(CHANGELIST).status_code == 200
        return len(captured)

    # then: the same count of statements whatever the tenants and rows. 18: the
    # admin's nav resolves each distinct view permission of its pages to tenant ids
    # once per request (two statements each, cached on the request); since the policy
    # set and limit pages (view_perm export_trail) those are manage_outbox,
    # view_trail, manage_tenant and export_trail.
    assert queries(admin) == queries(busy) <= 18


@pytest.mark.django_db
def test_the_search_finds_a_message_by_its_event_id_in_the_persons_tenants(
    tenant, other_tenant
):
    # given: two rows here and one in a tenant the admin does not hold
    wanted, _ = make_row(tenant), make_row(tenant)
    elsewhere = make_row(other_tenant)
    client = logged_in(person("admin", tenant))

    def found(term: str) -> list[str]:
        response = client.get(CHANGELIST, {"q": term})
        assert response.status_code == 200
        return [str(row.pk) for row in response.context["cl"].result_list]

    # then: the key (the event id) finds its row, in either case; anything else,
    # or another tenant's event id, finds nothing
    assert wanted.key == str(wanted.event_id)
    assert found(wanted.key) == found(wanted.key.upper()) == [str(wanted.pk)]
    assert found(elsewhere.key) == []
    assert found("not-an-id") == []
    assert len(found("")) == 2


# --- Retry and dismiss -------------------------------------------------------------


@pytest.mark.django_db
def test_a_tenant_admin_retries_a_dead_row(tenant):
    dead = make_row(tenant, state=OutboxState.DEAD, created_ago_s=600, attempts=8)
    admin = person("admin", tenant)

    response = post_action(logged_in(admin), "retry_dead", [dead])

    assert response.status_code == 200
    assert "back in line" in response.content.decode()
    dead.refresh_from_db()
    assert dead.state == OutboxState.PENDING
    assert dead.attempts == 8  # kept: the row's true history
    assert dead.last_error == "broker said no"
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT available_at <= app_now() FROM audit_outbox WHERE id = %s",
            [dead.pk],
        )
        assert cursor.fetchone() == (True,)  # due now
    (event,) = events_of(tenant, EventCode.OUTBOX_RETRIED)
    assert (event.actor_type, event.actor_id) == ("user", str(admin.pk))
    assert event.payload["outbox_id"] == str(dead.pk)
    assert event.payload["attempts"] == 8


@pytest.mark.django_db
def test_a_tenant_admin_dismisses_a_dead_row(tenant):
    dead = make_row(tenant, state=OutboxState.DEAD)
    admin = person("admin", tenant)

    response = post_action(logged_in(admin), "dismiss_dead", [dead])

    assert "dismissed" in response.content.decode()
    dead.refresh_from_db()
    assert dead.state == OutboxState.DISMISSED
    (event,) = events_of(tenant, EventCode.OUTBOX_DISMISSED)
    assert event.actor_id == str(admin.pk) and event.payload["key"] == dead.key


@pytest.mark.django_db
def test_only_dead_rows_are_retried_or_dismissed(tenant):
    pending = make_row(tenant)
    sent = make_row(tenant, state=OutboxState.SENT, sent_after_s=1)
    admin = person("admin", tenant)
    client = logged_in(admin)

    for action in ("retry_dead", "dismiss_dead"):
        response = post_action(client, action, [pending, sent])
        assert response.status_code == 200
        assert "Only a dead outbox row" in response.content.decode()

    assert Outbox.objects.get(pk=pending.pk).state == OutboxState.PENDING
    assert Outbox.objects.get(pk=sent.pk).state == OutboxState.SENT
    assert not Event.objects.filter(
        code__in=[EventCode.OUTBOX_RETRIED, EventCode.OUTBOX_DISMISSED]
    ).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("role", ["reviewer", "support"])
@pytest.mark.parametrize("action", ["retry_dead", "dismiss_dead"])
def test_reviewer_and_support_are_refused_and_nothing_changes(tenant, role, action):
    dead = make_row(tenant, state=OutboxState.DEAD)
    client = logged_in(person(role, tenant))

    assert client.get(CHANGELIST).status_code == 403
    response = client.post(
        CHANGELIST,
        {"action": action, "_selected_action": [str(dead.pk)], "index": "0"},
    )

    assert response.status_code == 403
    assert Outbox.objects.get(pk=dead.pk).state == OutboxState.DEAD
    assert not Event.objects.filter(
        code__in=[EventCode.OUTBOX_RETRIED, EventCode.OUTBOX_DISMISSED]
    ).exists()


@pytest.mark.django_db
def test_the_services_check_the_role_themselves(tenant, other_tenant):
    dead = make_row(tenant, state=OutboxState.DEAD)
    reviewer = person("reviewer", tenant)
    stranger = person("admin", other_tenant)

    with pytest.raises(PermissionDenied):
        outbox_admin.outbox_retry(tenant=tenant, by=reviewer, outbox_id=dead.pk)
    with pytest.raises(TenantNotVisible):
        outbox_admin.outbox_dismiss(tenant=tenant, by=stranger, outbox_id=dead.pk)

    assert Outbox.objects.get(pk=dead.pk).state == OutboxState.DEAD
    assert not Event.objects.filter(code=EventCode.OUTBOX_RETRIED).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["retry_dead", "dismiss_dead"])
def test_a_member_of_tenant_b_neither_sees_nor_changes_tenant_a_rows(
    tenant, other_tenant, action
):
    a_row = make_row(tenant, state=OutboxState.DEAD)
    b_row = make_row(other_tenant, state=OutboxState.DEAD)
    b_admin = person("admin", other_tenant)
    client = logged_in(b_admin)

    listing = client.get(CHANGELIST)
    assert listing.status_code == 200
    assert list(listing.context["cl"].result_list) == [b_row]
    assert client.get(f"{CHANGELIST}{a_row.pk}/change/").status_code in (302, 404)
    post_action(client, action, [a_row])

    assert Outbox.objects.get(pk=a_row.pk).state == OutboxState.DEAD
    assert (
        not Event.objects.filter(tenant=tenant)
        .exclude(code=EventCode.TASK_REGISTERED)
        .exists()
    )


@pytest.mark.django_db(transaction=True)
def test_the_relay_never_claims_a_dismissed_row_and_it_holds_nothing_back(tenant):
    # given: a task's first row is dead, its second pending behind it
    task_id = uuid.uuid4()
    first = make_row(tenant, state=OutboxState.DEAD, task_id=task_id)
    second = make_row(tenant, task_id=task_id)
    assert relay.outbox_claim_batch(limit=50) == []  # held back behind the dead row

    # when: the dead row is dismissed
    Outbox.objects.filter(pk=first.pk).update(state=OutboxState.DISMISSED)

    # then: the relay claims the second row, never the dismissed one
    claimed = {m.id for m in relay.outbox_claim_batch(limit=50)}
    assert second.pk in claimed and first.pk not in claimed
