"""Every admin URL, tried as every kind of person: who gets in, and what they see.

The URLs come from the admin registry (changelist, change, add, delete, history and
each action of every page) plus the autocomplete endpoint. People: tenant A's
reviewer, support and admin, tenant B's admin ("member of B only") and a staff
account with no membership. Expected answers come from the roles policy
(portal.roles.ROLE_PERMISSIONS) and each page's declared permissions, which
tests/console/test_registry.py pins to the policy table.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib import admin
from django.test import Client
from django.urls import reverse

from console.admin.base import TenantScopedAdmin
from portal.ids import new_id
from tests.support.tenancy import tenant_fingerprint

from .conftest import PERSONAS, Cast
from .test_registry import scoped_admins

pytestmark = pytest.mark.django_db


def _pages() -> list[tuple[type, TenantScopedAdmin]]:
    return [
        (model, model_admin)
        for model, model_admin in scoped_admins()
        if isinstance(model_admin, TenantScopedAdmin)
    ]


def _url(model: Any, view: str, *args: object) -> str:
    meta = model._meta
    return reverse(f"admin:{meta.app_label}_{meta.model_name}_{view}", args=args)


def _row(rows: dict, model: Any):
    return rows.get(model) or rows[model._meta.concrete_model]


@pytest.fixture
def world(cast: Cast, fill):
    return cast, fill(cast.a), fill(cast.b)


@pytest.mark.parametrize("persona", PERSONAS)
def test_reading_pages(world, persona):
    """One test per person, walking every page (fixtures are the slow part)."""
    cast, rows_a, rows_b = world
    person = cast.people[persona]
    client = cast.client(persona)
    for model, model_admin in _pages():
        _check_page(cast, rows_a, rows_b, person, client, model, model_admin)


def _check_page(cast, rows_a, rows_b, person, client, model, model_admin):
    row_a, row_b = _row(rows_a, model), _row(rows_b, model)
    reads_a = person.may(model_admin.view_perm, cast.a)
    reads_some = person.may_anywhere(model_admin.view_perm)

    # changelist: open to anyone who reads the page in some tenant, A's rows only
    # to A's readers, B's rows never to A's people
    listing = client.get(_url(model, "changelist"))
    assert listing.status_code == (200 if reads_some else 403)
    if reads_some:
        text = listing.content.decode()
        # a real title, not Django's "Select takeover desk item to view"
        title = re.search(r"<title>(.*?)</title>", text, re.S)
        assert title and not title.group(1).startswith("Select "), model
        assert "to view</h1>" not in text and "to change</h1>" not in text, model
        pk_a = _url(model, "change", row_a.pk)
        pk_b = _url(model, "change", row_b.pk)
        assert (pk_a in text) == reads_a
        assert (pk_b in text) == person.may(model_admin.view_perm, cast.b)

    # change page of A's row: like a missing row for a reader elsewhere
    change = client.get(_url(model, "change", row_a.pk))
    missing = client.get(_url(model, "change", new_id()))
    if reads_a:
        assert change.status_code == 200
        title = re.search(r"<title>(.*?)</title>", change.content.decode(), re.S)
        assert title and not title.group(1).startswith(("View ", "Change ")), model
    else:
        assert change.status_code == missing.status_code
        assert change.status_code in (302, 403)
        assert str(row_a.pk) not in change.content.decode()

    # history: the same rule
    history = client.get(_url(model, "history", row_a.pk))
    if reads_a:
        assert history.status_code == 200
    else:
        assert history.status_code in (302, 403)

    # delete: nobody, ever, through the admin
    assert client.get(_url(model, "delete", row_a.pk)).status_code in (302, 403)
    assert client.post(
        _url(model, "delete", row_a.pk), {"post": "yes"}
    ).status_code in (
        302,
        403,
    )
    assert type(row_a)._default_manager.filter(pk=row_a.pk).exists()

    # add: only where the page allows adding and the person manages some tenant
    adds = model_admin.has_add_permission(_request_of(client, person))
    assert client.get(_url(model, "add")).status_code == (200 if adds else 403)


def _request_of(client: Client, person):
    from django.test import RequestFactory

    request = RequestFactory().get("/admin/")
    request.user = person.user
    return request


@pytest.mark.parametrize("persona", PERSONAS)
def test_a_refused_change_changes_nothing(world, persona):
    """Every action and every change form, posted against A's rows by each person:
    rows of A change only when the person manages A, and B never changes."""
    from audit.models import Event, EventCode
    from portal.models import TenantPerm

    cast, rows_a, _ = world
    person = cast.people[persona]
    client = cast.client(persona)
    before_b = tenant_fingerprint(cast.b.pk)
    before_a = tenant_fingerprint(cast.a.pk)
    events_a = set(Event.objects.filter(tenant=cast.a).values_list("pk", flat=True))
    managed_a = False
    for model, model_admin in _pages():
        row = _row(rows_a, model)
        for name in model_admin.actions or []:
            needed = getattr(getattr(model_admin, name), "allowed_permissions", ())
            may = model_admin.manage_perm is not None and person.may(
                model_admin.manage_perm, cast.a
            )
            managed_a = managed_a or may
            response = client.post(
                _url(model, "changelist"),
                {"action": name, "_selected_action": [str(row.pk)]},
            )
            assert response.status_code in (200, 302, 403), (model, name)
            assert needed
        # a change form posted with the row's own values plus a rename
        client.post(_url(model, "change", row.pk), {"name": "renamed-by-post"})
    assert tenant_fingerprint(cast.b.pk) == before_b
    # The task page's evidence export is an action that changes nothing but the
    # trail's record of it (an audit.exported event, and the checkpoint and
    # transparency log head it signs).
    added = Event.objects.filter(tenant=cast.a).exclude(pk__in=events_a)
    exported = added.filter(code=EventCode.AUDIT_EXPORTED)
    assert exported.exists() == person.may(TenantPerm.EXPORT_TRAIL, cast.a)
    if not managed_a:
        assert {event.code for event in added} <= {EventCode.AUDIT_EXPORTED}
        # (a chain's head row moves with each event)
        trail = (
            "audit_event",
            "audit_outbox",
            "audit_checkpoint",
            "audit_chainhead",
            "audit_logentry",
            "audit_treehead",
        )
        after_a = tenant_fingerprint(cast.a.pk)
        for table in trail:
            before_a.pop(table), after_a.pop(table)
        assert after_a == before_a


@pytest.mark.parametrize("persona", PERSONAS)
def test_autocomplete_offers_only_the_persons_tenants(world, persona):
    cast, rows_a, rows_b = world
    from portal.models import Agent, AgentGrant

    person = cast.people[persona]
    client = cast.client(persona)
    response = client.get(
        reverse("admin:autocomplete"),
        {"app_label": "portal", "model_name": "agentgrant", "field_name": "agent"},
    )
    agent_admin = admin.site._registry[Agent]
    assert isinstance(agent_admin, TenantScopedAdmin)
    assert AgentGrant in admin.site._registry
    if not person.may_anywhere(agent_admin.view_perm):
        assert response.status_code == 403
        return
    assert response.status_code == 200
    offered = {item["id"] for item in response.json()["results"]}
    assert (str(rows_a[Agent].pk) in offered) == person.may(
        agent_admin.view_perm, cast.a
    )
    assert (str(rows_b[Agent].pk) in offered) == person.may(
        agent_admin.view_perm, cast.b
    )


@pytest.mark.parametrize("persona", PERSONAS)
def test_exports_and_desk_buttons_per_person(world, persona):
    """The admin's own URLs outside the registry's views: the event export (CSV and
    JSON Lines) and the takeover desk's buttons."""
    from audit.models import Event
    from tasks.models import Task

    cast, rows_a, _ = world
    person = cast.people[persona]
    client = cast.client(persona)
    from portal.models import TenantPerm

    # export: readers with export_trail get their own tenants' rows only
    for fmt in ("csv", "jsonl"):
        url = reverse("admin:audit_event_export", args=[fmt])
        response = client.get(url)
        if not person.may_anywhere(TenantPerm.EXPORT_TRAIL):
            assert response.status_code == 403, (persona, fmt)
            continue
        assert response.status_code == 200, (persona, fmt)
        body = b"".join(response.streaming_content).decode()
        event_a = rows_a[Event]
        assert (str(event_a.pk) in body) == person.may(TenantPerm.EXPORT_TRAIL, cast.a)

    # desk: claiming A's waiting task works only for A's people with work_takeover
    task = rows_a[Task]
    before = Task.objects.get(pk=task.pk).state_version
    response = client.post(reverse("admin:console_takeoveritem_claim", args=[task.pk]))
    claimed = Task.objects.get(pk=task.pk)
    if person.may(TenantPerm.WORK_TAKEOVER, cast.a):
        assert claimed.state == "human_claimed"
        assert claimed.lease_owner == f"user:{person.user.pk}"
    else:
        assert response.status_code in (403, 404), persona
        assert claimed.state_version == before
