"""``DATABASE_URL`` as Django's settings, libpq's multi-host form included.

A highly available deployment (deploy/ha/, docs/scale-out.md) names every node of
the PostgreSQL cluster in one URL and lets libpq find the primary::

    postgres://portal_app@10.0.0.1:5432,10.0.0.2:5432/portal?target_session_attrs=read-write

``dj_database_url`` refuses a host list, so this module splits it off, parses the
rest with ``dj_database_url`` and gives Django the lists as libpq takes them:
``HOST = "10.0.0.1,10.0.0.2"``, ``PORT = "5432,5432"``. Django's psycopg backend
passes both to libpq unchanged, and the query (``target_session_attrs``,
``connect_timeout``) lands in ``OPTIONS``. A one-host URL is ``dj_database_url``'s
answer, untouched.

No Django import here: ``config/settings.py`` uses it before Django is set up.
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import SplitResult, quote, urlsplit, urlunsplit

import dj_database_url

DEFAULT_PORT: Final = "5432"


def _hosts(netloc: str) -> tuple[str, list[tuple[str, str]]]:
    """The user part (with its ``@``, or empty) and each ``(host, port)``."""
    userinfo, at, hostlist = netloc.rpartition("@")
    entries: list[tuple[str, str]] = []
    for entry in hostlist.split(","):
        if entry.startswith("["):  # [IPv6]:port
            host, _, rest = entry[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, _, port = entry.partition(":")
        if not host:
            raise dj_database_url.ParseError()
        if port and not port.isdigit():
            raise dj_database_url.ParseError()
        entries.append((host, port))
    return userinfo + at, entries


def is_multi_host(url: str) -> bool:
    return "," in urlsplit(url).netloc.rpartition("@")[2]


def parse(url: str, **kwargs: Any) -> dict[str, Any]:
    """Django's database settings for ``url``; keyword arguments as
    ``dj_database_url.parse`` takes them (``conn_max_age``, ...).

    Raises:
        dj_database_url.ParseError: not a database URL.
    """
    if not is_multi_host(url):
        return dict(dj_database_url.parse(url, **kwargs))
    parts: SplitResult = urlsplit(url)
    user, entries = _hosts(parts.netloc)
    first_host, first_port = entries[0]
    first = urlunsplit(
        parts._replace(
            netloc=f"{user}{first_host}" + (f":{first_port}" if first_port else "")
        )
    )
    config = dict(dj_database_url.parse(first, **kwargs))
    config["HOST"] = ",".join(host for host, _ in entries)
    # libpq wants one port, or one per host: say each, the default where unnamed.
    config["PORT"] = ",".join(port or DEFAULT_PORT for _, port in entries)
    return config


def with_user(url: str, *, user: str) -> str:
    """``url`` with its user replaced and no password, every host kept."""
    parts = urlsplit(url)
    _, entries = _hosts(parts.netloc)
    hostlist = ",".join(
        (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
        for host, port in entries
    )
    return urlunsplit(parts._replace(netloc=f"{quote(user)}@{hostlist}"))
