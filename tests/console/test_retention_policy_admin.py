"""A tenant's retention policy on the admin (docs/retention.md): its admin sets it,
each change one ``tenant.changed`` event naming them; its reviewer and support staff
read it and change nothing; another tenant's people do not see it."""

from __future__ import annotations

import pytest

from audit.models import Event, EventCode, RetentionPolicy
from console import services
from portal.exceptions import PermissionDenied, TenantNotVisible, ValidationFailed

from .conftest import Cast

pytestmark = pytest.mark.django_db

LIST = "/admin/audit/retentionpolicy/"
ADD = LIST + "add/"


def _changes(cast: Cast) -> list[Event]:
    return list(
        Event.objects.filter(tenant=cast.a, code=EventCode.TENANT_CHANGED).order_by(
            "id"
        )
    )


def _policy(cast: Cast, months: int = 24, days: int = 180) -> RetentionPolicy:
    return services.retention_policy_set(
        tenant=cast.a, by=cast.people["admin_a"].user, event_months=months,
        payload_days=days,
    )  # fmt: skip


def test_an_admin_sets_the_policy_from_the_defaults_then_changes_it(cast: Cast):
    client = cast.client("admin_a")
    admin = cast.people["admin_a"].user
    # the add form starts from the defaults
    form = client.get(ADD)
    assert form.status_code == 200
    assert 'name="event_months" value="24"' in form.content.decode()

    added = client.post(
        ADD, {"tenant": str(cast.a.pk), "event_months": "12", "payload_days": "90"}
    )
    assert added.status_code == 302, added.content.decode()[:2000]
    policy = RetentionPolicy.objects.get(tenant=cast.a)
    assert (policy.event_months, policy.payload_days) == (12, 90)
    changed = client.post(
        f"{LIST}{policy.pk}/change/", {"event_months": "12", "payload_days": "30"}
    )
    assert changed.status_code == 302
    policy.refresh_from_db()
    assert (policy.event_months, policy.payload_days) == (12, 30)

    first, second = _changes(cast)
    assert (first.actor_type, first.actor_id) == ("user", str(admin.pk))
    assert first.payload == {
        "retention_policy": {"event_months": [24, 12], "payload_days": [180, 90]}
    }
    assert second.payload == {"retention_policy": {"payload_days": [90, 30]}}


def test_payloads_may_not_outlive_their_events(cast: Cast):
    client = cast.client("admin_a")
    page = client.post(
        ADD, {"tenant": str(cast.a.pk), "event_months": "1", "payload_days": "90"}
    )
    assert page.status_code == 200  # the form again, with the error
    assert not RetentionPolicy.objects.filter(tenant=cast.a).exists()
    with pytest.raises(ValidationFailed):
        _policy(cast, months=1, days=90)
    assert _changes(cast) == []


@pytest.mark.parametrize("persona", ["reviewer_a", "support_a"])
def test_reviewers_and_support_read_it_and_change_nothing(cast: Cast, persona: str):
    policy = _policy(cast, months=18, days=60)
    events = len(_changes(cast))
    client = cast.client(persona)

    listing = client.get(LIST)
    assert listing.status_code == 200
    assert f"{LIST}{policy.pk}/change/" in listing.content.decode()
    page = client.get(f"{LIST}{policy.pk}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "18" in text and 'name="event_months"' not in text  # read-only
    assert client.get(ADD).status_code == 403
    posted = client.post(
        f"{LIST}{policy.pk}/change/", {"event_months": "2", "payload_days": "2"}
    )
    assert posted.status_code == 403
    policy.refresh_from_db()
    assert (policy.event_months, policy.payload_days) == (18, 60)
    with pytest.raises(PermissionDenied):
        services.retention_policy_set(
            tenant=cast.a, by=cast.people[persona].user, event_months=2,
            payload_days=2,
        )  # fmt: skip
    assert len(_changes(cast)) == events


def test_another_tenants_admin_sees_nothing_and_changes_nothing(cast: Cast):
    policy = _policy(cast, months=18, days=60)
    events = len(_changes(cast))
    client = cast.client("member_of_b_only")

    listing = client.get(LIST)
    assert listing.status_code == 200
    assert f"{LIST}{policy.pk}/" not in listing.content.decode()
    assert cast.a.slug not in listing.content.decode()
    # A's row is "not found" for them (the admin redirects to its index)
    assert client.get(f"{LIST}{policy.pk}/change/").status_code == 302
    client.post(
        f"{LIST}{policy.pk}/change/", {"event_months": "2", "payload_days": "2"}
    )
    # and the add form offers their own tenant only
    posted = client.post(
        ADD, {"tenant": str(cast.a.pk), "event_months": "2", "payload_days": "2"}
    )
    assert posted.status_code == 200  # refused by the form: not a choice
    policy.refresh_from_db()
    assert (policy.event_months, policy.payload_days) == (18, 60)
    with pytest.raises(TenantNotVisible):
        services.retention_policy_set(
            tenant=cast.a, by=cast.people["member_of_b_only"].user, event_months=2,
            payload_days=2,
        )  # fmt: skip
    assert len(_changes(cast)) == events


def test_staff_without_a_membership_do_not_get_in(cast: Cast):
    client = cast.client("staff_without_membership")
    assert client.get(LIST).status_code == 403
