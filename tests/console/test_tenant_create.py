"""``manage.py tenant_create``: a tenant and its administrator in one transaction,
or a clear error (exit 1) and nothing written."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from audit.models import Event, EventCode
from portal.models import Membership, Role, Tenant

pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(__file__).resolve().parents[2]
PRINTED = re.compile(r"password for 'ada': (\S+) \(shown once")


def tenant_create(*args: str) -> str:
    out = io.StringIO()
    call_command("tenant_create", *args, stdout=out)
    return out.getvalue()


def counts() -> tuple[int, int, int, int]:
    return (
        Tenant.objects.count(),
        User.objects.count(),
        Membership.objects.count(),
        Event.objects.count(),
    )


def test_makes_the_tenant_and_its_administrator_and_prints_the_password_once():
    out = tenant_create("acme", "--name", "Acme Ltd", "--admin", "ada")

    tenant = Tenant.objects.get(slug="acme")
    assert tenant.name == "Acme Ltd"
    ada = User.objects.get(username="ada")
    assert (ada.is_staff, ada.is_superuser, ada.is_active) == (True, False, True)
    assert list(Membership.objects.values_list("tenant__slug", "user", "role")) == [
        ("acme", ada.pk, Role.ADMIN)
    ]
    password = PRINTED.search(out)
    assert password, out
    assert ada.check_password(password[1])
    # The membership is on the tenant's record, by the command.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT code, actor_type, actor_id, payload->>'username' FROM audit_event"
            " WHERE tenant_id = %s ORDER BY chain_seq",
            [tenant.pk],
        )
        assert cursor.fetchall() == [
            (EventCode.TENANT_CREATED, "system", "tenant_create", None),
            (EventCode.MEMBERSHIP_GRANTED, "system", "tenant_create", "ada"),
        ]


def test_the_password_from_the_environment_is_not_printed(monkeypatch):
    monkeypatch.setenv("ACME_ADMIN_PASSWORD", "a-long-enough-passphrase-7")

    out = tenant_create(
        "acme", "--name", "Acme", "--admin", "ada", "--email", "ada@acme.test",
        "--password-from-env", "ACME_ADMIN_PASSWORD",
    )  # fmt: skip

    assert "a-long-enough-passphrase-7" not in out and "password" not in out
    ada = User.objects.get(username="ada")
    assert ada.check_password("a-long-enough-passphrase-7")
    assert ada.email == "ada@acme.test"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("demo", "--name", "Again", "--admin", "newcomer"), "slug 'demo' exists"),
        (("acme", "--name", " DEMO ", "--admin", "ada"), "named 'DEMO' exists"),
        (("acme", "--name", "Acme", "--admin", "taken"), "account 'taken' exists"),
        (("Not a slug!", "--name", "X", "--admin", "ada"), "slug 'Not a slug!' is not"),
        (("acme", "--name", " ", "--admin", "ada"), "name must be 1 to 200"),
        (("acme", "--name", "x" * 201, "--admin", "ada"), "name must be 1 to 200"),
        (("a" * 64, "--name", "X", "--admin", "ada"), "slug must be 1 to 63"),
        (("acme", "--name", "X", "--admin", "ada", "--email", "no"), "--email 'no'"),
        (
            ("acme", "--name", "X", "--admin", "ada", "--password-from-env", "UNSET"),
            "$UNSET is not set",
        ),
        (
            ("acme", "--name", "X", "--admin", "ada", "--password-from-env", "WEAK"),
            "the password in $WEAK is refused",
        ),
    ],
)
def test_a_refused_request_says_why_and_writes_nothing(
    monkeypatch, make_tenant, args, message
):
    make_tenant(slug="demo")
    User.objects.create_user("taken", password="pw-for-tests-only-1")
    monkeypatch.delenv("UNSET", raising=False)
    monkeypatch.setenv("WEAK", "password")
    before = counts()

    with pytest.raises(CommandError, match=re.escape(message)):
        tenant_create(*args)

    assert counts() == before


def test_an_existing_slug_exits_1_with_the_reason_on_stderr(make_tenant):
    make_tenant(slug="demo")
    # The test database, by the URL the test run was given.
    test_db = connection.settings_dict["NAME"]
    env = {**os.environ, "PORTAL_DEV_MODE": "1"}
    env["DATABASE_URL"] = settings.DATABASE_URL.rsplit("/", 1)[0] + "/" + test_db

    done = subprocess.run(
        [sys.executable, "manage.py", "tenant_create", "demo", "--name", "D",
         "--admin", "dora"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip

    assert done.returncode == 1, done.stdout + done.stderr
    assert "A tenant with the slug 'demo' exists. Nothing was changed." in done.stderr
    assert not User.objects.filter(username="dora").exists()
