"""``manage.py freeze``: the operator's kill switch (docs/limits.md).

- ``freeze --tenant SLUG``: every call of each of the tenant's agents is refused
  (``TENANT_FROZEN``); its live leases expire and its live credentials are revoked.
- ``freeze --tenant SLUG --agent NAME_OR_ID``: the same for one agent
  (``AGENT_FROZEN``).
- ``--unfreeze``: lift it.

Each change commits with one audit event whose actor is ``system:freeze`` (a tenant
administrator's ways are the admin's buttons and the staff API).
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Q

from limits import services as limits_services
from portal import scope
from portal.exceptions import PortalError
from portal.models import Agent, Tenant


class Command(BaseCommand):
    help = "Freeze (or --unfreeze) a tenant, or one of its agents (docs/limits.md)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="The tenant's slug.")
        parser.add_argument("--agent", help="An agent's name or id in that tenant.")
        parser.add_argument("--unfreeze", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(
            slug=options["tenant"], deleted_at__isnull=True
        ).first()
        if tenant is None:
            raise CommandError(f"no such tenant: {options['tenant']}")
        frozen = not options["unfreeze"]
        word = "frozen" if frozen else "unfrozen"
        with scope.tenant_scope([tenant.pk]):
            try:
                if options["agent"] is None:
                    limits_services.tenant_freeze(tenant=tenant, frozen=frozen)
                    self.stdout.write(f"tenant {tenant.slug} {word}")
                    return
                agent = _agent(tenant, options["agent"])
                limits_services.agent_freeze(
                    tenant=tenant, agent_id=agent.pk, frozen=frozen
                )
            except PortalError as error:
                raise CommandError(str(error)) from error
        self.stdout.write(f"agent {agent.name} of {tenant.slug} {word}")


def _agent(tenant: Tenant, name_or_id: str) -> Agent:
    try:
        by_id = Q(pk=uuid.UUID(name_or_id))
    except ValueError:
        by_id = Q(pk__in=[])
    agent = Agent.objects.filter(Q(name=name_or_id) | by_id, tenant=tenant).first()
    if agent is None:
        raise CommandError(f"no agent {name_or_id!r} in {tenant.slug}")
    return agent
