"""``manage.py seed_demo``: a demo tenant, staff users and an agent key, for dev only.

Running it again leaves the same tenant, users and agent and resets the demo
passwords, so the credentials it prints always work; the agent gets a new key each
run, because a key's secret is shown only when it is issued.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.management.base import BaseCommand, CommandError

from portal import services
from portal.models import Agent, Role, Tenant

TENANT_SLUG: Final = "demo"
TENANT_NAME: Final = "Demo Co"
AGENT_NAME: Final = "demo-agent"
# Development-only credentials, printed on purpose; production refuses to seed.
# (username, password, role in the demo tenant, superuser?)
USERS: Final = (
    # A membership too: the admin site's querysets keep to the user's tenants.
    ("admin", "admin-demo-password", Role.ADMIN, True),
    ("reviewer", "reviewer-demo-password", Role.REVIEWER, False),
    ("support", "support-demo-password", Role.SUPPORT, False),
)


def seed(*, report: Callable[[str], None]) -> str:
    """Create or refresh the demo data; return the new agent key's secret.

    Raises:
        CommandError: production settings, or the demo tenant was deleted.
    """
    if settings.PRODUCTION:
        raise CommandError(
            "seed_demo makes users with published passwords; it refuses to run "
            "with production settings (DJANGO_SECRET_KEY set, DJANGO_DEBUG off)."
        )
    # Reads here are by natural key, which portal.selectors does not offer; a
    # one-off dev command is no reason to add public selectors for them.
    tenant = Tenant.objects.filter(slug=TENANT_SLUG).first()
    if tenant is None:
        tenant = services.tenant_create(slug=TENANT_SLUG, name=TENANT_NAME)
        report(f"created tenant {tenant.slug!r} ({tenant.name})")
    elif tenant.deleted_at is not None:
        raise CommandError(
            f"tenant {tenant.slug!r} was deleted and is kept as a tombstone; "
            "seed a fresh database instead."
        )
    else:
        report(f"tenant {tenant.slug!r} exists")

    for username, password, role, superuser in USERS:
        user, created = _user_set(username, password, superuser=superuser)
        services.membership_grant(tenant=tenant, user=user, role=role)
        kind = "superuser" if superuser else "staff user"
        report(
            f"{'created' if created else 'reset'} {kind} {username!r} "
            f"(password {password!r}), {role.label.lower()} in {tenant.slug!r}"
        )

    agent = Agent.objects.filter(tenant=tenant, name=AGENT_NAME).first()
    if agent is None:
        agent = services.agent_create(tenant=tenant, name=AGENT_NAME)
        report(f"created agent {agent.name!r}")
    issued = services.agent_key_issue(agent=agent)
    report(f"issued a new API key for {agent.name!r}: {issued.secret} (shown once)")
    return issued.secret


def _user_set(
    username: str, password: str, *, superuser: bool
) -> tuple[AbstractBaseUser, bool]:
    """The staff user ``username`` with ``password``; True if it was created."""
    user, created = get_user_model().objects.get_or_create(username=username)
    user.is_staff = True
    user.is_superuser = superuser
    user.is_active = True
    user.set_password(password)
    user.save()
    return user, created


class Command(BaseCommand):
    help = "Create or refresh the demo tenant, users and agent (development only)."

    def handle(self, *args: Any, **options: Any) -> None:
        seed(report=lambda line: self.stdout.write(f"seed_demo: {line}"))
