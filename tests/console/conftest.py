"""People of two tenants, and one row of every admin page's model in each tenant."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Model
from django.http import HttpRequest
from django.test import Client

from audit import services as audit_services
from audit.models import Event, Outbox, RetentionPolicy
from limits.models import Budget, RateLimit
from policies import services as policy_services
from policies.models import PolicySet
from portal import services as portal_services
from portal.actors import Actor
from portal.db import db_now
from portal.models import (
    Agent,
    AgentGrant,
    AgentKey,
    Invitation,
    Membership,
    Role,
    Tenant,
)
from portal.roles import ROLE_PERMISSIONS
from routing.models import Group, GroupMember, RoutingRule, Webhook
from tasks import services as task_services
from tasks.models import (
    Approval,
    Connector,
    Contract,
    Credential,
    Escalation,
    ObjectVersion,
    Operation,
    Task,
    TaskState,
)
from tests.support.contracts import SPEC

_serial = itertools.count(1)
PASSWORD = "pw-console-tests-1"


@dataclass
class Person:
    """A staff account and the tenant permissions its memberships give it."""

    name: str
    user: User
    perms: dict[str, frozenset[str]] = field(default_factory=dict)  # slug -> perms

    def may(self, perm: str, tenant: Tenant) -> bool:
        return perm in self.perms.get(tenant.slug, frozenset())

    def may_anywhere(self, perm: str) -> bool:
        return any(perm in perms for perms in self.perms.values())


@dataclass
class Cast:
    a: Tenant
    b: Tenant
    people: dict[str, Person]

    def client(self, persona: str) -> Client:
        """A test client logged in as ``persona`` (one of PERSONAS)."""
        client = Client()
        assert client.login(
            request=HttpRequest(),  # django-axes counts logins by request
            username=self.people[persona].user.username,
            password=PASSWORD,
        )
        return client


def _person(name: str, memberships: list[tuple[Tenant, Role]]) -> Person:
    user = User.objects.create_user(
        username=f"{name}-{next(_serial)}", password=PASSWORD, is_staff=True
    )
    person = Person(name=name, user=user)
    for tenant, role in memberships:
        portal_services.membership_grant(tenant=tenant, user=user, role=role)
        person.perms[tenant.slug] = ROLE_PERMISSIONS[role]
    return person


@pytest.fixture
def cast(make_tenant: Callable[..., Tenant]) -> Cast:
    """Tenant A's reviewer, support and admin; B's admin; staff of no tenant."""
    a, b = make_tenant(), make_tenant()
    people = {
        "reviewer_a": _person("reviewer", [(a, Role.REVIEWER)]),
        "support_a": _person("support", [(a, Role.SUPPORT)]),
        "admin_a": _person("admin", [(a, Role.ADMIN)]),
        "member_of_b_only": _person("admin-b", [(b, Role.ADMIN)]),
        "staff_without_membership": _person("staff", []),
    }
    return Cast(a=a, b=b, people=people)


PERSONAS = [
    "reviewer_a",
    "support_a",
    "admin_a",
    "member_of_b_only",
    "staff_without_membership",
]


@pytest.fixture
def fill(make_task: Callable[..., Task]) -> Callable[[Tenant], dict[type[Model], Any]]:
    """One row of every model with an admin page, in the tenant; returns them."""

    def make(tenant: Tenant) -> dict[type[Model], Any]:
        n = next(_serial)
        agent = portal_services.agent_create(tenant=tenant, name=f"agent-{n}")
        key = portal_services.agent_key_issue(agent=agent).key
        grant = portal_services.agent_grant(
            agent=agent, action="create_ticket", target="desk"
        )
        owner = User.objects.create_user(username=f"owner-{n}", is_staff=True)
        membership = portal_services.membership_grant(
            tenant=tenant, user=owner, role=Role.ADMIN
        )
        with transaction.atomic():
            invitation = portal_services.invitation_write(
                tenant=tenant,
                invited_by_id=owner.pk,
                email=f"invitee-{n}@example.com",
                role=Role.SUPPORT,
                valid_s=3600,
            ).invitation
        contract = task_services.contract_create(
            tenant=tenant, key=f"issue-{n}", spec=SPEC, publish=True
        )
        task = make_task(tenant=tenant, state=TaskState.HUMAN_REQUIRED)
        operation = Operation.objects.create(
            tenant=tenant,
            task=task,
            idempotency_key=f"key-{n}",
            action="create_ticket",
            target="desk",
            input_hash="0" * 64,
            input={},
            state="human_required",
        )
        credential = Credential.objects.create(
            tenant=tenant,
            operation=operation,
            object_type="customer_issue",
            object_id=f"issue-{n}",
            fields=["email"],
            action="create_ticket",
            target="desk",
            secret_hash="0" * 64,
            expires_at=db_now() + dt.timedelta(hours=1),
        )
        version = task_services.object_version_record(
            tenant=tenant, object_type="customer_issue", object_id=f"o-{n}", version="3"
        )
        connector = task_services.connector_save(
            tenant=tenant,
            target=f"desk-{n}",
            values={"base_url": "https://desk-9.example/"},
        )
        escalation = Escalation.objects.create(
            tenant=tenant, task=task, operation=operation, reason_code="FIELD_STALE"
        )
        approval = Approval.objects.create(
            tenant=tenant, operation=operation, input_hash="0" * 64, approved_by=owner
        )
        with transaction.atomic():
            event_id = audit_services.event_append(
                tenant_id=tenant.pk,
                code="task.registered",
                actor=Actor.system("tests"),
                task_id=task.pk,
            )
        policy = RetentionPolicy.objects.create(
            tenant=tenant, event_months=24, payload_days=180
        )
        # A draft: its page shows the problems and the what-if too.
        policy_set = policy_services.policy_set_draft(
            tenant=tenant, text="permit(principal, action, resource);"
        )
        rate_limit = RateLimit.objects.create(
            tenant=tenant, agent=agent, action="create_ticket", max_calls=5
        )
        budget = Budget.objects.create(
            tenant=tenant, agent=agent, action="refund", argument="amount",
            max_total=100,
        )  # fmt: skip
        group = Group.objects.create(tenant=tenant, name=f"Billing {n}")
        member = GroupMember.objects.create(tenant=tenant, group=group, user=owner)
        rule = RoutingRule.objects.create(
            tenant=tenant, reason_code="FIELD_STALE", group=group
        )
        webhook = Webhook.objects.create(
            tenant=tenant, url=f"https://hooks-{n}.example/desk"
        )
        return {
            Group: group,
            GroupMember: member,
            RoutingRule: rule,
            Webhook: webhook,
            RateLimit: rate_limit,
            Budget: budget,
            Tenant: tenant,
            RetentionPolicy: policy,
            PolicySet: policy_set,
            Agent: agent,
            AgentKey: key,
            AgentGrant: grant,
            Membership: membership,
            Invitation: invitation,
            Contract: contract,
            Task: task,
            Operation: operation,
            Credential: credential,
            ObjectVersion: version,
            Connector: connector,
            Escalation: escalation,
            Approval: approval,
            Event: Event.objects.get(pk=event_id),
            Outbox: Outbox.objects.get(event_id=event_id),
        }

    return make


@pytest.fixture
def make_person(db: None) -> Callable[..., User]:
    """A staff account, with a role in ``tenant`` when both are given."""

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
