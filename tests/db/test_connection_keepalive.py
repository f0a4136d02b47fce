"""The portal's database connections carry TCP keepalives and a user timeout
(issue 25, R15; config/settings.py): read back from the LIVE connection's socket
with ``getsockopt``, and from the server's side with ``SHOW``, not from the
settings dict, so an option libpq ignored or the server refused would show here.
What they buy under a real partition is tests/http/test_db_partition.py; the last
test here is the backend's part of it (no second connect on the way out).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import psycopg
import pytest
from django.conf import settings
from django.db import OperationalError, connection, transaction


def _live_socket() -> socket.socket:
    """A duplicate of the test connection's own socket (closing it leaves that one)."""
    connection.ensure_connection()
    raw = connection.connection
    assert raw is not None
    return socket.socket(fileno=os.dup(raw.pgconn.socket))


@pytest.mark.django_db
def test_the_client_socket_has_keepalives_and_the_user_timeout() -> None:
    options = settings.DATABASES["default"]["OPTIONS"]
    assert options["tcp_user_timeout"] > 0 and options["keepalives"] == 1
    with _live_socket() as sock:
        assert sock.family in (socket.AF_INET, socket.AF_INET6), (
            "the tests connect over TCP; a Unix socket has no keepalives"
        )
        got = {
            "keepalive": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            "user_timeout_ms": sock.getsockopt(
                socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT
            ),
            "idle_s": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            "interval_s": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            "count": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
        }
    assert got == {
        "keepalive": 1,
        "user_timeout_ms": options["tcp_user_timeout"],
        "idle_s": options["keepalives_idle"],
        "interval_s": options["keepalives_interval"],
        "count": options["keepalives_count"],
    }
    # Not the kernel's defaults (2 h idle, 75 s interval, no user timeout): the
    # options took effect rather than matching by accident.
    assert got["idle_s"] < 7200 and got["user_timeout_ms"] != 0


@pytest.mark.django_db
def test_the_server_side_of_the_connection_has_them_too() -> None:
    """A backend whose client vanished must notice by itself (rolling back and
    freeing its locks): the same values reach the server's socket."""
    options = settings.DATABASES["default"]["OPTIONS"]
    with connection.cursor() as cursor:
        # pg_settings in each setting's base unit: ms for the timeout, s for the rest.
        cursor.execute(
            "SELECT name, setting::int, unit FROM pg_settings WHERE name IN"
            " ('tcp_user_timeout', 'tcp_keepalives_idle',"
            " 'tcp_keepalives_interval', 'tcp_keepalives_count')"
        )
        server = {name: (value, unit) for name, value, unit in cursor.fetchall()}
    assert server == {
        "tcp_user_timeout": (options["tcp_user_timeout"], "ms"),
        "tcp_keepalives_idle": (options["keepalives_idle"], "s"),
        "tcp_keepalives_interval": (options["keepalives_interval"], "s"),
        "tcp_keepalives_count": (options["keepalives_count"], None),
    }


@pytest.mark.django_db(transaction=True)
def test_a_connection_lost_inside_atomic_is_not_reopened_on_the_way_out() -> None:
    """Leaving the block whose connection was lost does not connect again (across
    a partition that connect would wait out its timeout before the 503: the
    backend's ``set_autocommit``); the next statement does."""
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (backend,) = cursor.fetchone() or (None,)
    admin = psycopg.connect(
        settings.DATABASE_URL, dbname=connection.settings_dict["NAME"], autocommit=True
    )
    # Given: a block whose session the server ends half-way.
    lost = None
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            admin.execute("SELECT pg_terminate_backend(%s)", [backend])
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
    except OperationalError as error:
        lost = error
    finally:
        admin.close()
    assert lost is not None, "the block's statement should have lost its session"
    # Then: dropped, not reopened; in autocommit for the next connection.
    assert connection.connection is None
    assert connection.autocommit is True and not connection.in_atomic_block
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (again,) = cursor.fetchone() or (None,)
    assert again != backend and connection.get_autocommit()


def _options_with(**env: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import django, json; django.setup(); from django.conf import settings;"
        "print(json.dumps(settings.DATABASES['default']['OPTIONS']))"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=settings.BASE_DIR,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_zero_leaves_an_option_to_the_kernel_and_a_word_is_refused() -> None:
    # libpq passes a 0 to setsockopt, which refuses it: every connection would fail.
    done = _options_with(
        PORTAL_DB_KEEPALIVES_IDLE_S="0", PORTAL_DB_TCP_USER_TIMEOUT_S="0"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    options = json.loads(done.stdout.strip().splitlines()[-1])
    assert "keepalives_idle" not in options and "tcp_user_timeout" not in options
    assert options["keepalives"] == 1 and options["keepalives_interval"] == 1
    assert "-c tcp_user_timeout=0 " in options["options"] + " "

    refused = _options_with(PORTAL_DB_TCP_USER_TIMEOUT_S="ten")
    assert refused.returncode != 0
    assert "PORTAL_DB_TCP_USER_TIMEOUT_S='ten': a whole number >= 0" in refused.stderr
