"""People for the operations pages' tests: staff users holding a role per tenant.

Plain helpers, not fixtures: the tests that call them are marked ``django_db``.
"""

from __future__ import annotations

import itertools

from django.contrib.auth.models import User
from django.test import Client

from portal import services as portal_services
from portal.models import Role, Tenant

PASSWORD = "ops-tests-password-1"
_numbers = itertools.count(1)


def person(role: str | None = None, *tenants: Tenant) -> User:
    """A staff user (never a superuser) holding ``role`` in each of ``tenants``."""
    user = User.objects.create_user(
        f"{role or 'nobody'}-{next(_numbers)}", password=PASSWORD, is_staff=True
    )
    for tenant in tenants:
        assert role is not None, "a membership needs a role"
        portal_services.membership_grant(tenant=tenant, user=user, role=Role(role))
    return user


def logged_in(user: User) -> Client:
    """A test client with the user's session."""
    client = Client()
    client.force_login(user)
    return client
