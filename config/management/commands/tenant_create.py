"""``manage.py tenant_create SLUG --name NAME --admin USER``: a tenant and its
administrator, the platform operator's way from a shell (README, "A second
tenant"); the operator's page (``/admin/tenants/new/``) is the other door, on the
same business function (console/tenants.py).

One transaction makes the tenant with its ``tenant.created`` event, a new staff
account ``USER`` (never a superuser) and its membership as the tenant's
administrator, with the ``membership.granted`` event; both events' actor is
``system:tenant_create``. On any error nothing is written and the command exits 1
with the reason (the slug or the name is taken, the slug is not one, the username
is taken, the password is refused).

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
from django.core.validators import validate_email
from django.db import IntegrityError

from console import tenants
from portal.actors import Actor
from portal.exceptions import ValidationFailed

ACTOR: Final = Actor.system("tenant_create")
USERNAME_MAX: Final = 150  # django.contrib.auth's User.username


def _check(validate: Callable[[str], None], value: str, what: str) -> None:
    try:
        validate(value)
    except ValidationError as exc:
        raise CommandError(f"{what} {value!r}: {' '.join(exc.messages)}") from None


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
        if email:
            _check(validate_email, email, "--email")
        if not username.strip() or len(username) > USERNAME_MAX:
            raise CommandError(
                f"--admin must be 1 to {USERNAME_MAX} characters: {username!r}"
            )
        printed = options["password_from_env"] is None
        password = self._password(options["password_from_env"], username)
        try:
            tenant, _ = tenants.tenant_with_account(
                slug=slug,
                name=name,
                username=username,
                email=email,
                password=password,
                actor=ACTOR,
            )
        except ValidationFailed as exc:
            raise CommandError(f"{exc.detail} Nothing was changed.") from None
        except IntegrityError as exc:  # the username was taken meanwhile
            raise CommandError(
                f"slug {slug!r} or account {username!r} was taken meanwhile; "
                f"nothing was changed ({exc.__class__.__name__})"
            ) from None
        self.stdout.write(
            f"tenant_create: created tenant {tenant.slug!r} ({tenant.name})"
        )
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
