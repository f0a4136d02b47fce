"""``manage.py seed_demo``: a demo tenant, staff users and an agent key, for dev only.

Besides people and an agent, it seeds the customer-issue → ticket workflow of the
example agent (examples/customer_issue_agent.py): the published contract
``customer-issue`` v1, the connector to the ticket desk (``ticket-desk``, the
``python -m ticketdesk`` that ``manage.py up`` runs) and the agent's grant to
``create_ticket`` there.

Running it again leaves the same tenant, users, agent, contract and grant, resets
the demo passwords (so the credentials it prints always work) and points the
connector at the given desk; the agent gets a new key each run, because a key's
secret is shown only when it is issued.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.management.base import BaseCommand, CommandError, CommandParser

from portal import scope, services
from portal.models import Agent, Role, Tenant
from tasks import services as task_services
from tasks.credentials import public_jwk
from tasks.models import Connector, Contract
from ticketdesk.harness import write_jwks

TENANT_SLUG: Final = "demo"
TENANT_NAME: Final = "Demo Co"
AGENT_NAME: Final = "demo-agent"
# Development-only credentials, printed on purpose; production refuses to seed.
# (username, password, role in the demo tenant). None is a superuser (the platform
# operator): what each person sees and may do comes from their membership.
USERS: Final = (
    ("admin", "admin-demo-password", Role.ADMIN),
    ("reviewer", "reviewer-demo-password", Role.REVIEWER),
    ("support", "support-demo-password", Role.SUPPORT),
)

# The ticket desk `up` runs beside the portal. The connector's key pair is the
# portal's; the desk verifies the gateway's credentials with the public key, which
# the seed writes into the desk's JWKS file (the desk reads it again on change).
TICKETDESK_TARGET: Final = "ticket-desk"
TICKETDESK_ACTION: Final = "create_ticket"
TICKETDESK_DEFAULT_PORT: Final = 8100
CONTRACT_KEY: Final = "customer-issue"
# The seed's worked example: an issue may become a ticket only with a fresh e-mail
# address from the CRM and a plan from billing; the desk sees the e-mail only.
CONTRACT_SPEC: Final[Mapping[str, Any]] = {
    "object_type": "customer_issue",
    "required_fields": [
        {"name": "email", "source": "crm", "max_age_s": 300},
        {"name": "plan", "source": "billing", "max_age_s": 3600},
    ],
    "policy": {
        "read_fields": ["email"],
        "write_targets": [TICKETDESK_TARGET],
        "credential_ttl_s": 60,
    },
    "receipt": {"required": True, "type": "ticket_id"},
}


def ticketdesk_port() -> int:
    """The desk's port: ``PORTAL_TICKETDESK_PORT`` or 8100 (``up`` reads the same)."""
    return int(os.environ.get("PORTAL_TICKETDESK_PORT", TICKETDESK_DEFAULT_PORT))


def ticketdesk_default_url() -> str:
    return f"http://127.0.0.1:{ticketdesk_port()}"


def ticketdesk_keys_path() -> Path:
    """The desk's JWKS file, ``$PORTAL_VAR_DIR/ticketdesk-keys.json`` (``up`` gives
    the desk the same path)."""
    return Path(settings.VAR_DIR) / "ticketdesk-keys.json"


def seed(
    *,
    report: Callable[[str], None],
    ticketdesk_url: str | None = None,
    ticketdesk_keys: Path | None = None,
) -> str:
    """Create or refresh the demo data; return the new agent key's secret.

    Each run issues the demo agent a new key and revokes its older ones, so exactly
    one demo key is valid after it.

    ``ticketdesk_url`` (default: ``http://127.0.0.1:$PORTAL_TICKETDESK_PORT``, port
    8100) says where the ``ticket-desk`` connector calls; its public key goes into
    the desk's JWKS file ``ticketdesk_keys`` (default ``ticketdesk_keys_path()``),
    bound to the demo tenant.

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
    # Row-level security: the rest works in the demo tenant.
    with scope.tenant_scope([tenant.pk]):
        return _seed_tenant(
            tenant=tenant,
            report=report,
            ticketdesk_url=ticketdesk_url,
            ticketdesk_keys=ticketdesk_keys or ticketdesk_keys_path(),
        )


def _seed_tenant(
    *,
    tenant: Tenant,
    report: Callable[[str], None],
    ticketdesk_url: str | None,
    ticketdesk_keys: Path,
) -> str:
    for username, password, role in USERS:
        user, created = _user_set(username, password)
        services.membership_grant(tenant=tenant, user=user, role=role)
        report(
            f"{'created' if created else 'reset'} staff user {username!r} "
            f"(password {password!r}), {role.label.lower()} in {tenant.slug!r}"
        )

    agent = Agent.objects.filter(tenant=tenant, name=AGENT_NAME).first()
    if agent is None:
        agent = services.agent_create(tenant=tenant, name=AGENT_NAME)
        report(f"created agent {agent.name!r}")
    services.agent_grant(
        agent=agent, action=TICKETDESK_ACTION, target=TICKETDESK_TARGET
    )
    report(f"{agent.name!r} may {TICKETDESK_ACTION} on {TICKETDESK_TARGET!r}")
    _contract_seed(tenant, report=report)
    _connector_set(
        tenant,
        url=ticketdesk_url or ticketdesk_default_url(),
        keys=ticketdesk_keys,
        report=report,
    )
    # Only the hash of a key is stored, so the last one cannot be shown again: each
    # run issues a fresh key and revokes the ones before (one valid demo key).
    issued, revoked = services.agent_key_replace(agent=agent)
    report(f"issued a new API key for {agent.name!r}: {issued.secret} (shown once)")
    if revoked:
        prefixes = ", ".join(key.prefix for key in revoked)
        report(f"revoked the previous demo key(s) of {agent.name!r}: {prefixes}")
    return issued.secret


def _contract_seed(tenant: Tenant, *, report: Callable[[str], None]) -> None:
    """Publish ``customer-issue`` v1 unless some version of it exists.

    An existing version is left alone, even a retired or edited one: published
    versions are immutable, and a person who changed the contract meant it.
    """
    latest = (
        Contract.objects.filter(tenant=tenant, key=CONTRACT_KEY)
        .order_by("-version")
        .first()
    )
    if latest is not None:
        report(f"contract {CONTRACT_KEY!r} exists (v{latest.version}, {latest.status})")
        return
    contract = task_services.contract_create(
        tenant=tenant, key=CONTRACT_KEY, spec=CONTRACT_SPEC, publish=True
    )
    report(f"published contract {CONTRACT_KEY!r} v{contract.version}")


def _connector_set(
    tenant: Tenant, *, url: str, keys: Path, report: Callable[[str], None]
) -> None:
    """Point the ``ticket-desk`` connector at the desk ``up`` started, and install
    its public key in the desk's JWKS file ``keys``.

    The desk's port may differ from run to run; an unchanged connector is left as
    it is (the service writes an event only for a change). A new connector gets its
    key pair from the service; the private key never leaves the portal.
    """
    existing = Connector.objects.filter(tenant=tenant, target=TICKETDESK_TARGET).first()
    if existing is not None and existing.base_url == url:
        report(f"connector {TICKETDESK_TARGET!r} -> {url} unchanged")
        connector = existing
    else:
        connector = task_services.connector_save(
            tenant=tenant, target=TICKETDESK_TARGET, values={"base_url": url}
        )
        report(
            f"{'updated' if existing else 'created'} connector {TICKETDESK_TARGET!r} "
            f"-> {url}"
        )
    write_jwks(keys, public_jwk(connector.public_key), tenant=str(tenant.pk))
    report(f"the desk trusts key {connector.key_id} ({keys})")


def _user_set(username: str, password: str) -> tuple[AbstractBaseUser, bool]:
    """The staff user ``username`` with ``password``; True if it was created."""
    user, created = get_user_model().objects.get_or_create(username=username)
    user.is_staff = True
    user.is_superuser = False
    user.is_active = True
    user.set_password(password)
    user.save()
    return user, created


class Command(BaseCommand):
    help = (
        "Create or refresh the demo tenant, users, agent, customer-issue contract and "
        "ticket-desk connector (development only)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--ticketdesk-url",
            default=ticketdesk_default_url(),
            help="where the ticket-desk connector calls (default: "
            "http://127.0.0.1:$PORTAL_TICKETDESK_PORT, port 8100, as `up` runs it)",
        )
        parser.add_argument(
            "--ticketdesk-keys",
            type=Path,
            default=None,
            help="the desk's JWKS file, where the connector's public key goes "
            "(default: $PORTAL_VAR_DIR/ticketdesk-keys.json, as `up` runs the desk)",
        )

    def handle(
        self,
        *args: Any,
        ticketdesk_url: str,
        ticketdesk_keys: Path | None,
        **options: Any,
    ) -> None:
        seed(
            report=lambda line: self.stdout.write(f"seed_demo: {line}"),
            ticketdesk_url=ticketdesk_url,
            ticketdesk_keys=ticketdesk_keys,
        )
