"""Login lockout on the admin (django-axes; issue 19 §1): five failures for one
username from one address lock that pair out for 15 minutes with a 429 page; others
are unaffected; the operator's axes_reset_username, or the cool-off, unlocks; no
password reaches a log or axes' tables."""

from __future__ import annotations

import logging

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test import Client

pytestmark = pytest.mark.django_db

LOGIN = "/admin/login/?next=/admin/"
RIGHT = "pw-lockout-tests-right-1"
WRONG = "pw-lockout-tests-WRONG-"


def _try(client: Client, username: str, password: str, ip: str = "203.0.113.7"):
    return client.post(
        LOGIN, {"username": username, "password": password}, REMOTE_ADDR=ip
    )


def _logged_in(response) -> bool:
    return response.status_code == 302 and response["Location"] == "/admin/"


@pytest.fixture
def ada(db) -> User:
    return User.objects.create_user("ada", password=RIGHT, is_staff=True)


def test_25_wrong_passwords_then_the_right_one_is_refused(ada, caplog):
    client = Client()
    caplog.set_level(logging.DEBUG)

    answers = [_try(client, "ada", f"{WRONG}{n}") for n in range(25)]
    right = _try(client, "ada", RIGHT)

    # The form again four times; the fifth failure locks, and so does all after it.
    assert [a.status_code for a in answers[:4]] == [200] * 4
    assert {a.status_code for a in answers[4:]} == {429}
    assert right.status_code == 429 and not _logged_in(right)
    page = right.content.decode()
    assert "Too many failed logins" in page and "15 minutes" in page
    assert "axes_reset_username" in page
    assert "frame-ancestors 'none'" in right["Content-Security-Policy"]
    assert "_auth_user_id" not in client.session
    # No password, wrong or right, in a log line or in axes' stored form data.
    logged = "\n".join(record.getMessage() for record in caplog.records)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(string_agg(t::text, '|'), '') FROM axes_accessattempt t"
        )
        stored = cursor.fetchone()[0]
    assert "203.0.113.7" in stored  # the attempt row is there
    for secret in (RIGHT, WRONG):
        assert secret not in logged and secret not in stored


def test_another_user_and_another_address_are_not_affected(ada):
    User.objects.create_user("bob", password=RIGHT, is_staff=True)
    for n in range(6):
        _try(Client(), "ada", f"{WRONG}{n}")
    assert _try(Client(), "ada", RIGHT).status_code == 429

    assert _logged_in(_try(Client(), "bob", RIGHT))  # same address, other user
    assert _logged_in(_try(Client(), "ada", RIGHT, ip="198.51.100.9"))  # elsewhere


def test_the_operator_unlocks_with_axes_reset_username(ada):
    for n in range(5):
        _try(Client(), "ada", f"{WRONG}{n}")
    assert _try(Client(), "ada", RIGHT).status_code == 429

    call_command("axes_reset_username", "ada")

    assert _logged_in(_try(Client(), "ada", RIGHT))


def test_the_lock_lifts_after_the_cool_off(ada):
    for n in range(5):
        _try(Client(), "ada", f"{WRONG}{n}")
    assert _try(Client(), "ada", RIGHT).status_code == 429
    # Fourteen minutes on, still locked; sixteen on, free (the attempts' clock).
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE axes_accessattempt SET attempt_time = now() - interval '14 minutes'"
        )
    assert _try(Client(), "ada", RIGHT).status_code == 429
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE axes_accessattempt SET attempt_time = now() - interval '16 minutes'"
        )

    assert _logged_in(_try(Client(), "ada", RIGHT))


def test_a_success_clears_the_count(ada):
    for n in range(4):
        _try(Client(), "ada", f"{WRONG}{n}")
    assert _logged_in(_try(Client(), "ada", RIGHT))
    for n in range(4):
        _try(Client(), "ada", f"{WRONG}{n}")

    assert _logged_in(_try(Client(), "ada", RIGHT))


def test_behind_a_trusted_proxy_the_forwarded_address_counts(ada, settings):
    settings.PORTAL_TRUSTED_PROXIES = 1

    def via_proxy(password: str, client_ip: str):
        return Client().post(
            LOGIN,
            {"username": "ada", "password": password},
            REMOTE_ADDR="10.0.0.1",  # the proxy, for everyone
            # What the client wrote itself, then what the proxy appended.
            HTTP_X_FORWARDED_FOR=f"192.0.2.1, {client_ip}",
        )

    for n in range(5):
        via_proxy(f"{WRONG}{n}", "203.0.113.7")
    assert via_proxy(RIGHT, "203.0.113.7").status_code == 429

    assert _logged_in(via_proxy(RIGHT, "198.51.100.9"))
