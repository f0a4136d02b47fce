"""``manage.py agent_key {list,revoke,rotate,expire}``: an operator's key management.

- ``list [--tenant SLUG]``: keys by prefix, agent, tenant and status.
- ``revoke PREFIX``: the key authenticates nobody from the next request on.
- ``rotate PREFIX (--until TIME | --overlap-s N)``: a new key for the same agent now
  (its secret printed once); the old one works until the cutoff, then only the new.
- ``expire PREFIX --until TIME``: the key stops at TIME (an earlier expiry is kept).

TIME is ISO 8601 with a UTC offset (``2027-01-31T18:00:00+00:00``). Each change
commits with one audit event whose actor is ``system:agent_key`` (the tenant
administrator's way is the admin's API keys page, console/admin/identity.py).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Final

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from console import services as console_services
from portal import scope
from portal import services as portal_services
from portal.actors import Actor
from portal.db import db_now
from portal.exceptions import PortalError
from portal.models import AgentKey, Tenant

ACTOR: Final = Actor.system("agent_key")


# The audited changes are the admin's own (console/services.py), with the operator
# as the actor; the command adds only its transaction.


@transaction.atomic(durable=True)
def key_revoke(*, key: AgentKey) -> bool:
    """Revoke ``key`` with its event; False if it was revoked already."""
    was_live = key.revoked_at is None
    console_services.agent_key_revoke_as(key=key, actor=ACTOR)
    return was_live


@transaction.atomic(durable=True)
def key_rotate(*, key: AgentKey, until: dt.datetime) -> portal_services.IssuedKey:
    """A new key for ``key``'s agent; ``key`` works until ``until``."""
    return console_services.agent_key_rotate_as(
        key=key, actor=ACTOR, old_valid_until=until
    )


@transaction.atomic(durable=True)
def key_expire(*, key: AgentKey, until: dt.datetime) -> AgentKey:
    """Set ``key``'s expiry (an earlier one is kept), with its event if it changed."""
    return console_services.agent_key_expire_as(key=key, actor=ACTOR, expires_at=until)


def _time(value: str) -> dt.datetime:
    try:
        moment = dt.datetime.fromisoformat(value)
    except ValueError:
        raise CommandError(f"not an ISO 8601 time: {value!r}") from None
    if moment.tzinfo is None:
        raise CommandError(f"give the UTC offset too: {value!r}")
    return moment


class Command(BaseCommand):
    help = "List, revoke, rotate (with overlap) or expire agent API keys."

    def add_arguments(self, parser: CommandParser) -> None:
        verbs = parser.add_subparsers(dest="verb", required=True)
        listing = verbs.add_parser("list", help="keys with their status")
        listing.add_argument("--tenant", help="only this tenant's keys (slug)")
        revoke = verbs.add_parser("revoke", help="revoke a key now")
        revoke.add_argument("prefix")
        rotate = verbs.add_parser(
            "rotate", help="a new key now; the old one valid until the cutoff"
        )
        rotate.add_argument("prefix")
        cutoff = rotate.add_mutually_exclusive_group(required=True)
        cutoff.add_argument("--until", type=_time, help="ISO 8601 with UTC offset")
        cutoff.add_argument(
            "--overlap-s", type=int, help="the old key works this many seconds more"
        )
        expire = verbs.add_parser("expire", help="the key stops at the time given")
        expire.add_argument("prefix")
        expire.add_argument(
            "--until", type=_time, required=True, help="ISO 8601 with UTC offset"
        )

    def handle(self, *args: Any, verb: str, **options: Any) -> None:
        # The platform operator's command: every tenant's keys, as the admin shows
        # a superuser (row-level security, docs/database-roles.md).
        tenant_ids = Tenant.objects.values_list("pk", flat=True)
        with scope.tenant_scope(tenant_ids):
            self._handle(verb, options)

    def _handle(self, verb: str, options: dict[str, Any]) -> None:
        if verb == "list":
            self._list(options.get("tenant"))
            return
        key = (
            AgentKey.objects.select_related("agent", "tenant")
            .filter(prefix=options["prefix"])
            .first()
        )
        if key is None:
            raise CommandError(f"no key with prefix {options['prefix']!r}")
        try:
            if verb == "revoke":
                done = key_revoke(key=key)
                self.stdout.write(
                    f"revoked {key.prefix} ({key.agent.name}, {key.tenant.slug})"
                    if done
                    else f"{key.prefix} was revoked already"
                )
            elif verb == "rotate":
                until = options["until"] or db_now() + dt.timedelta(
                    seconds=options["overlap_s"]
                )
                issued = key_rotate(key=key, until=until)
                self.stdout.write(
                    f"{key.prefix} works until {until.isoformat()}; new key for "
                    f"{key.agent.name!r}: {issued.secret} (shown once)"
                )
            else:
                key = key_expire(key=key, until=options["until"])
                assert key.expires_at is not None
                self.stdout.write(
                    f"{key.prefix} expires at {key.expires_at.isoformat()}"
                )
        except PortalError as error:
            raise CommandError(error.detail) from error

    def _list(self, tenant: str | None) -> None:
        keys = AgentKey.objects.select_related("agent", "tenant").order_by(
            "tenant__slug", "agent__name", "created_at"
        )
        if tenant:
            keys = keys.filter(tenant__slug=tenant)
        now = db_now()
        for key in keys:
            if key.revoked_at is not None:
                status = f"revoked {key.revoked_at.isoformat()}"
            elif key.expires_at is not None and key.expires_at <= now:
                status = f"expired {key.expires_at.isoformat()}"
            elif key.expires_at is not None:
                status = f"live until {key.expires_at.isoformat()}"
            else:
                status = "live"
            self.stdout.write(
                f"{key.prefix}  {key.tenant.slug}  {key.agent.name}  {status}"
            )
