"""``manage.py tenant_create SLUG --name NAME --admin USER``: a tenant and its
administrator, the platform operator's way (README, "A second tenant").

One transaction makes the tenant, a new staff account ``USER`` (never a superuser)
and its membership as the tenant's administrator, with the ``membership.granted``
event whose actor is ``system:tenant_create``; on any error nothing is written and
the command exits 1 with the reason (the slug or the username is taken, the slug is
not one, the password is refused).

The password is generated and printed once, unless ``--password-from-env VAR``
names an environment variable holding it (then nothing secret is printed). The
administrator logs in at ``/admin/`` and adds the tenant's agents, contracts,
connectors and members from there.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from typing import Any, Final

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.validators import validate_email, validate_slug
from django.db import IntegrityError, transaction

from audit import payloads
from audit import services as audit_services
from audit.models import EventCode
from portal import scope, services
from portal.actors import Actor
from portal.models import Role, Tenant

ACTOR: Final = Actor.system("tenant_create")
SLUG_MAX: Final = Tenant._meta.get_field("slug").max_length or 63
NAME_MAX: Final = Tenant._meta.get_field("name").max_length or 200
USERNAME_MAX: Final = 150  # django.contrib.auth's User.username


def _check(validate: Callable[[str], None], value: str, what: str) -> None:
    try:
        validate(value)
    except ValidationError as exc:
        raise CommandError(f"{what} {value!r}: {' '.join(exc.messages)}") from None


@transaction.atomic(durable=True)
def tenant_with_admin(
    *, slug: str, name: str, username: str, email: str, password: str
) -> Tenant:
    """The tenant, its administrator's account and membership, and their event.

    Raises:
        CommandError: the slug or the username is taken.
    """
    if Tenant.objects.filter(slug=slug).exists():
        raise CommandError(f"a tenant with slug {slug!r} exists; nothing was changed")
    accounts = get_user_model().objects
    if accounts.filter(username=username).exists():
        raise CommandError(
            f"an account {username!r} exists; nothing was changed (a tenant "
            "administrator gives an existing account a role on the Memberships page)"
        )
    tenant = services.tenant_write(slug=slug, name=name)
    user = accounts.create_user(username, email=email, password=password)
    user.is_staff = True  # the admin's pages; what they show is the membership's
    user.save(update_fields=["is_staff"])
    with scope.tenant_scope([tenant.pk]):
        services.membership_write(tenant=tenant, user_id=user.pk, role=Role.ADMIN)
        audit_services.event_append(
            tenant_id=tenant.pk,
            code=EventCode.MEMBERSHIP_GRANTED,
            actor=ACTOR,
            data=payloads.MembershipGranted(
                {
                    "user_id": user.pk,
                    "username": username,
                    "role": Role.ADMIN.value,
                    "previous_role": None,
                }
            ),
        )
    return tenant


class Command(BaseCommand):
    help = (
        "Create a tenant and its administrator (a new staff account, not a "
        "superuser); the password is printed once unless --password-from-env."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug", help="the tenant's short name (letters, digits, -)")
        parser.add_argument("--name", required=True, help="the tenant's full name")
        parser.add_argument(
            "--admin", required=True, metavar="USER", help="the new account's username"
        )
        parser.add_argument("--email", default="", help="the new account's e-mail")
        parser.add_argument(
            "--password-from-env",
            metavar="VAR",
            help="read the account's password from this environment variable",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        slug, name, username = options["slug"], options["name"], options["admin"]
        email = options["email"]
        _check(validate_slug, slug, "slug")
        if email:
            _check(validate_email, email, "--email")
        for what, value, most in (
            ("slug", slug, SLUG_MAX),
            ("--name", name, NAME_MAX),
            ("--admin", username, USERNAME_MAX),
        ):
            if not value.strip() or len(value) > most:
                raise CommandError(f"{what} must be 1 to {most} characters: {value!r}")
        printed = options["password_from_env"] is None
        password = self._password(options["password_from_env"], username)
        try:
            tenant = tenant_with_admin(
                slug=slug, name=name, username=username, email=email, password=password
            )
        except IntegrityError as exc:  # taken meanwhile by a concurrent command
            raise CommandError(
                f"slug {slug!r} or account {username!r} was taken meanwhile; "
                f"nothing was changed ({exc.__class__.__name__})"
            ) from None
        self.stdout.write(f"tenant_create: created tenant {tenant.slug!r} ({name})")
        self.stdout.write(
            f"tenant_create: created account {username!r}, tenant administrator "
            f"of {tenant.slug!r} (not a superuser); log in at /admin/"
        )
        if printed:
            self.stdout.write(
                f"tenant_create: password for {username!r}: {password} "
                "(shown once; change it at /admin/password_change/)"
            )

    def _password(self, variable: str | None, username: str) -> str:
        if variable is None:
            return secrets.token_urlsafe(18)
        password = os.environ.get(variable, "")
        if not password:
            raise CommandError(f"--password-from-env: ${variable} is not set or empty")
        probe = get_user_model()(username=username)
        try:
            validate_password(password, user=probe)
        except ValidationError as exc:
            raise CommandError(
                f"the password in ${variable} is refused: {' '.join(exc.messages)}"
            ) from None
        return password
