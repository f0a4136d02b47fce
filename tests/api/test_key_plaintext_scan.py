"""No table holds the plaintext of an API key (issue 25, S07).

Keys are issued, rotated, used (writes under an ``Idempotency-Key``, a traced
request), guessed at with their real prefix, revoked and used again; then every
text, varchar, json and jsonb column of every table in the database is read, as a
superuser (row-level security hides nothing from it), for each key's secret and for
the secret part after its prefix. A new column or table is scanned without a change
here: the list comes from ``information_schema``.
"""

from __future__ import annotations

import datetime as dt
import uuid

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from psycopg import sql
from rest_framework.test import APIClient

from portal import services as portal_services
from tests.api.conftest import REGISTRATION, AgentClient

_TEXT_TYPES = ("text", "character varying", "character", "json", "jsonb")


def _text_columns(admin: psycopg.Connection) -> list[tuple[str, str, str]]:
    return admin.execute(
        """
        SELECT c.table_schema, c.table_name, c.column_name
        FROM information_schema.columns c
        JOIN information_schema.tables t
          ON t.table_schema = c.table_schema AND t.table_name = c.table_name
        WHERE c.table_schema NOT IN ('pg_catalog', 'information_schema')
          AND t.table_type = 'BASE TABLE'
          AND c.data_type = ANY(%s)
        ORDER BY 1, 2, 3
        """,
        [list(_TEXT_TYPES)],
    ).fetchall()


def _call(secret: str, method: str, path: str, data: object = None, **headers: str):
    http = APIClient()
    http.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    if method == "GET":
        return http.get(path, headers=headers)
    return http.post(path, data, format="json", headers=headers)


@pytest.mark.django_db(transaction=True)
def test_no_column_of_any_table_holds_an_issued_key(api: AgentClient) -> None:
    # Given keys issued, rotated, used, guessed at, revoked and used again
    first = api.secret
    key = api.agent.keys.get()
    rotated = portal_services.agent_key_rotate(
        key=key, old_valid_until=dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
    ).secret
    second_agent_key = portal_services.agent_key_issue(agent=api.agent).secret
    secrets = [first, rotated, second_agent_key]
    for index, secret in enumerate(secrets):
        ok = _call(
            secret, "POST", "/api/v1/tasks",
            {**REGISTRATION, "client_task_id": f"scan-{index}"},
            **{"Idempotency-Key": f"scan-{uuid.uuid4()}"},
            traceparent="00-" + "ab" * 16 + "-" + "cd" * 8 + "-01",
        )  # fmt: skip
        assert ok.status_code == 201, ok.json()
        prefix = secret.split(".")[0]
        guessed = _call(f"{prefix}.not-the-secret", "GET", "/api/v1/tasks")
        assert guessed.status_code == 401
        # A secret sent as data, where an agent might paste it by mistake, is
        # refused or stored: either way the scan below must not find it.
        _call(
            secret, "POST", "/api/v1/tasks",
            {**REGISTRATION, "client_task_id": secret[:200]},
        )  # fmt: skip
    portal_services.agent_key_revoke(key=api.agent.keys.order_by("created_at")[0])
    assert _call(first, "GET", "/api/v1/tasks").status_code == 401

    # When every text and JSON column of every table is searched for them
    found: list[tuple[str, str, str, str]] = []
    with psycopg.connect(
        settings.DATABASE_URL, dbname=connection.settings_dict["NAME"], autocommit=True
    ) as admin:
        columns = _text_columns(admin)
        assert len(columns) > 100  # the whole schema, not a hand-written list
        for schema, table, column in columns:
            for secret in secrets:
                tail = secret.split(".", 1)[1]
                query = sql.SQL(
                    "SELECT count(*) FROM {}.{} WHERE strpos({}::text, %s) > 0"
                ).format(
                    sql.Identifier(schema),
                    sql.Identifier(table),
                    sql.Identifier(column),
                )
                row = admin.execute(query, [tail]).fetchone()
                if row and row[0]:
                    found.append((schema, table, column, secret.split(".")[0]))

    # Then no column holds any of them, whole or the part after the prefix
    assert found == []
