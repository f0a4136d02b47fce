"""The loaded tenants with their people, agents, contract and connector, made
through the services as an admin would make them."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password

from portal import scope, services
from portal.models import Agent, Role, Tenant
from tasks import services as task_services
from tasks.models import Connector, Contract

from .rows import (
    ACTION,
    AGENTS_PER_TENANT,
    CONTRACT_KEY,
    CONTRACT_SPEC,
    PASSWORD,
    ROLES,
    TARGET,
    TenantSetUp,
)

# --- Tenants, people, agents: through the services ---------------------------------


def tenants_set_up(
    *, count: int, report: Callable[[str], None]
) -> tuple[list[TenantSetUp], list[float]]:
    """Create (or find) the ``scale-tNN`` tenants with their people and agents.

    Returns the tenants and their weights (tenant *n*: 1/n). Running it again
    changes nothing but the users' passwords, which are reset to ``PASSWORD``.
    """
    made: list[TenantSetUp] = []
    # One hash for every user: PBKDF2 is slow by design, and these are test logins.
    password_hash = make_password(PASSWORD)
    for n in range(1, count + 1):
        slug = f"scale-t{n:02d}"
        tenant = Tenant.objects.filter(slug=slug).first()
        if tenant is None:
            tenant = services.tenant_create(slug=slug, name=f"Scale tenant {n:02d}")
        with scope.tenant_scope([tenant.pk]):  # row-level security: this tenant
            made.append(_tenant_set_up(tenant=tenant, n=n, password_hash=password_hash))
    report(
        f"{count} tenants scale-t01..scale-t{count:02d}; users reviewer-tNN, "
        f"support-tNN, admin-tNN (password {PASSWORD!r})"
    )
    return made, [1 / n for n in range(1, count + 1)]


def _tenant_set_up(*, tenant: Tenant, n: int, password_hash: str) -> TenantSetUp:
    """One tenant's people, agents, contract and connector."""
    slug = tenant.slug
    support_ids = []
    for prefix, role in ROLES:
        user, _ = get_user_model().objects.get_or_create(username=f"{prefix}-t{n:02d}")
        user.is_staff = True
        user.is_superuser = False
        user.password = password_hash
        user.save()
        services.membership_grant(tenant=tenant, user=user, role=role)
        if role == Role.SUPPORT:
            support_ids.append(user.pk)
    agents = []
    for a in range(1, AGENTS_PER_TENANT + 1):
        name = f"agent-t{n:02d}-{a}"
        agent = Agent.objects.filter(tenant=tenant, name=name).first()
        if agent is None:
            agent = services.agent_create(tenant=tenant, name=name)
        services.agent_grant(agent=agent, action=ACTION, target=TARGET)
        agents.append((str(agent.pk), name))
    contract = (
        Contract.objects.filter(tenant=tenant, key=CONTRACT_KEY)
        .order_by("-version")
        .first()
    )
    if contract is None:
        contract = task_services.contract_create(
            tenant=tenant, key=CONTRACT_KEY, spec=CONTRACT_SPEC, publish=True
        )
    if not Connector.objects.filter(tenant=tenant, target=TARGET).exists():
        task_services.connector_save(
            tenant=tenant,
            target=TARGET,
            values={"base_url": "http://127.0.0.1:8100"},
        )
    return TenantSetUp(
        id=str(tenant.pk),
        slug=slug,
        agents=tuple(agents),
        support_user_ids=tuple(support_ids),
        contract_version=contract.version,
    )
