"""People with roles in a tenant, logged in to the admin's test client."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.test import Client

from portal import services as portal_services
from portal.models import Role, Tenant


@pytest.fixture
def make_person(db: None) -> Callable[..., User]:
    def make(username: str, *, tenant: Tenant | None, role: str | None) -> User:
        user = User.objects.create_user(
            username, f"{username}@example.com", "pw-console-tests", is_staff=True
        )
        if tenant is not None and role is not None:
            portal_services.membership_grant(tenant=tenant, user=user, role=Role(role))
        return user

    return make


@pytest.fixture
def login(client: Client) -> Callable[[User], Client]:
    def as_(user: User) -> Client:
        client.force_login(user)
        return client

    return as_
