"""Shared fixtures. ``make_*`` fixtures derive the tenant from the parent object."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.db.models.signals import post_save

from portal import db_roles, scope
from portal.actors import Actor
from portal.db import db_now
from portal.models import Agent, AgentGrant, Tenant
from tasks.models import Operation, OperationState, Task, TaskState
from tests.support.db import migrated_template
from tests.support.desk import desk, ticketdesk_server

__all__ = ["desk", "ticketdesk_server"]  # the ticket desk's fixtures, for every tier

_counter = itertools.count(1)


def pytest_configure(config: pytest.Config) -> None:
    from django.conf import settings

    # WhiteNoise warns about a missing STATIC_ROOT and the suite turns warnings into
    # errors; a fresh clone has not run collectstatic yet.
    Path(settings.STATIC_ROOT).mkdir(parents=True, exist_ok=True)
    # No worker consumes the tests' broker: commits need not nudge a relay run
    # (tests/worker/ exercises the nudge itself).
    settings.PORTAL_RELAY_NUDGE = False


@pytest.fixture(scope="session", autouse=True)
def one_hash_per_password() -> Iterator[None]:
    """Each password the tests give their accounts is hashed once, then reused.

    Django's PBKDF2 takes a million iterations, a second or more a hash on a busy
    2-core machine, and the tests make thousands of accounts with a handful of
    passwords. The hash stays Django's default (a server in another process
    verifies it as it would any); only its salt is shared between accounts.
    """
    from django.contrib.auth import base_user, hashers
    from django.contrib.auth import models as auth_models

    original = hashers.make_password
    hashes: dict[str, str] = {}

    def make_password(
        password: str | None, salt: str | None = None, hasher: str = "default"
    ) -> str:
        if not isinstance(password, str) or salt is not None or hasher != "default":
            return original(password, salt, hasher)
        if password not in hashes:
            hashes[password] = original(password)
        return hashes[password]

    base_user.make_password = make_password  # type: ignore[attr-defined]
    auth_models.make_password = make_password  # type: ignore[attr-defined]
    try:
        yield
    finally:
        base_user.make_password = original  # type: ignore[attr-defined]
        auth_models.make_password = original  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def django_db_modify_db_settings(
    django_db_modify_db_settings: None,
    django_db_use_migrations: bool,
    django_db_keepdb: bool,
    request: pytest.FixtureRequest,
) -> None:
    """Make both roles from DATABASE_URL (an administrator's); create as the owner.

    The owner creates the test database (``portal/db_roles.py``) as a copy of a
    template migrated once for all of the run's processes (xdist's workers, then the
    serial phase; ``tests.support.db.migrated_template``), so each worker's
    ``<name>_gwN`` is a file copy, not a migration. The ``django_db_setup`` below
    then turns the tests' connection into the app role's.
    """
    from django.conf import settings

    if not db_roles.can_create_roles(settings.DATABASE_URL):
        raise pytest.UsageError(
            "the tests make their two database roles: DATABASE_URL must name a role "
            "that may create roles (e.g. postgres)"
        )
    db_roles.ensure_roles(settings.DATABASE_URL)
    settings.DATABASE_OWNER_URL = db_roles.url_as(
        settings.DATABASE_URL, user=db_roles.OWNER_ROLE
    )
    settings.DATABASE_APP_ROLE = db_roles.APP_ROLE
    if django_db_use_migrations and not django_db_keepdb:
        test = settings.DATABASES["default"]["TEST"]
        worker = getattr(request.config, "workerinput", {}).get("workerid")
        base = test["NAME"].removesuffix(f"_{worker}") if worker else test["NAME"]
        test["TEMPLATE"] = migrated_template(f"{base}_template")
    db_roles.use_role("default", user=db_roles.OWNER_ROLE)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """After the owner migrated: the test clock for the app role, then connect as it.

    Fails the run when the tests' connection is not the app role, so no test can
    pass by the owner's or a superuser's power (docs/database-roles.md).
    """
    with django_db_blocker.unblock():
        with (
            db_roles.connected_as("default", db_roles.owner_url()) as owner,
            owner.cursor() as cursor,
        ):
            db_roles.grant_app_role(cursor, test_clock=True)
        db_roles.use_role("default", user=db_roles.APP_ROLE)
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_user")
            (current,) = cursor.fetchone()
        assert current == db_roles.APP_ROLE, f"tests connect as {current}"
    yield
    with django_db_blocker.unblock():
        # Dropping the test database is the owner's.
        db_roles.use_role("default", user=db_roles.OWNER_ROLE)


@pytest.fixture(autouse=True)
def tenant_scope_of_the_test() -> Iterator[None]:
    """Each test works in the tenants it makes (row-level security, portal/scope.py).

    Every tenant created during the test joins the test's scope, whatever made it;
    the scope ends with the test, so none leaks into the next one.
    """

    def include(
        sender: type[Tenant], instance: Tenant, created: bool, **_: Any
    ) -> None:
        if created:
            scope.include(instance.pk)

    post_save.connect(include, sender=Tenant, dispatch_uid="tenant_scope_of_the_test")
    try:
        with scope.unit_of_work():
            yield
    finally:
        post_save.disconnect(sender=Tenant, dispatch_uid="tenant_scope_of_the_test")


def _unique(prefix: str) -> str:
    return f"{prefix}-{next(_counter)}"


@pytest.fixture
def make_tenant(db: None) -> Callable[..., Tenant]:
    def make(**fields: Any) -> Tenant:
        slug = fields.pop("slug", _unique("tenant"))
        return Tenant.objects.create(slug=slug, name=slug.title(), **fields)

    return make


@pytest.fixture
def tenant(make_tenant: Callable[..., Tenant]) -> Tenant:
    return make_tenant()


@pytest.fixture
def other_tenant(make_tenant: Callable[..., Tenant]) -> Tenant:
    return make_tenant()


# Actions the fixtures' agents may reserve, on any target.
GRANTED_ACTIONS = ("create_ticket", "a")


@pytest.fixture
def make_agent() -> Callable[..., Agent]:
    def make(*, tenant: Tenant, grants: tuple[str, ...] = GRANTED_ACTIONS) -> Agent:
        agent = Agent.objects.create(tenant=tenant, name=_unique("agent"))
        for action in grants:
            AgentGrant.objects.create(
                tenant=tenant, agent=agent, action=action, target="*"
            )
        return agent

    return make


@pytest.fixture
def agent(tenant: Tenant, make_agent: Callable[..., Agent]) -> Agent:
    return make_agent(tenant=tenant)


@pytest.fixture
def actor(agent: Agent) -> Actor:
    return Actor.of_agent(agent)


@pytest.fixture
def make_task(tenant: Tenant) -> Callable[..., Task]:
    """A task in any state; ``leased=True`` gives it a live lease (token 1)."""

    def make(
        *,
        tenant: Tenant = tenant,
        state: str = TaskState.PENDING,
        leased: bool = False,
        lease_seconds: float = 60,
        **fields: Any,
    ) -> Task:
        if leased:
            now = db_now()
            fields.update(
                lease_owner="worker-1",
                lease_token=fields.get("lease_token", 1),
                lease_acquired_at=now,
                lease_expires_at=now + dt.timedelta(seconds=lease_seconds),
            )
        defaults: dict[str, Any] = {
            "client_task_id": _unique("client-task"),
            "registration_hash": "0" * 64,
            "workflow_key": "customer-issue",
            "workflow_version": "1",
            "object_type": "customer_issue",
            "object_id": _unique("issue"),
            "object_version": "1",
        }
        return Task.objects.create(tenant=tenant, state=state, **{**defaults, **fields})

    return make


@pytest.fixture
def make_operation(make_task: Callable[..., Task]) -> Callable[..., Operation]:
    """An operation in any state, on ``task`` (a new leased running task if none)."""

    def make(
        *, task: Task | None = None, state: str = OperationState.RESERVED, **fields: Any
    ) -> Operation:
        if task is None:
            task = make_task(state=TaskState.RUNNING, leased=True)
        defaults: dict[str, Any] = {
            "idempotency_key": _unique("key"),
            "action": "create_ticket",
            "target": "ticket-desk",
            "input_hash": "0" * 64,
            "input": {},
        }
        if state == OperationState.VERIFIED:
            defaults["provider_reference"] = "receipt-1"
        return Operation.objects.create(
            tenant_id=task.tenant_id, task=task, state=state, **{**defaults, **fields}
        )

    return make
