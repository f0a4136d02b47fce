"""Desk comments (console.DeskComment) by raw SQL: tenant walls and append-only.

The tests' connection is the app role's. A comment is a tenant's row (row-level
security, the composite key to its task) and append-only: the app role may not
update or delete one, and a trigger refuses an UPDATE even to a role that was
granted it. Only the operator deletes them, with the rest of a deleted tenant.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import ProgrammingError, connection, transaction
from psycopg import sql

from console.models import DeskComment
from portal import db_roles, scope
from tests.support.db import connect_as

from .conftest import execute, refused_by, refused_for_privilege

pytestmark = pytest.mark.django_db

INSERT = (
    "INSERT INTO console_deskcomment (id, tenant_id, task_id, author_id, body,"
    " created_at) VALUES (gen_random_uuid(), %s, %s, %s, %s, now())"
)


@pytest.fixture
def comments(tenant, other_tenant, make_task, django_user_model) -> dict[str, Any]:
    """One task with one comment in each tenant, written through the ORM."""
    author = django_user_model.objects.create_user("commenter")
    rows: dict[str, Any] = {"author": author}
    for name, owner in (("a", tenant), ("b", other_tenant)):
        task = make_task(tenant=owner)
        rows[f"{name}_task"] = task
        rows[name] = DeskComment.objects.create(
            tenant=owner, task=task, author=author, body=f"note in {name}"
        )
    return rows


def _count(cursor: Any, tenant_id: Any) -> int:
    cursor.execute(
        "SELECT count(*) FROM console_deskcomment WHERE tenant_id = %s", [tenant_id]
    )
    return int(cursor.fetchone()[0])


def test_a_member_of_another_tenant_can_neither_read_nor_write_a_comment(
    tenant, other_tenant, comments
):
    author = comments["author"].pk
    with scope.tenant_scope([other_tenant.pk]), connection.cursor() as cursor:
        # B's scope reads B's comment and none of A's, even by id
        assert _count(cursor, other_tenant.pk) == 1
        assert _count(cursor, tenant.pk) == 0
        cursor.execute(
            "SELECT body FROM console_deskcomment WHERE id = %s", [comments["a"].pk]
        )
        assert cursor.fetchall() == []
        # a comment written into A from B's scope is refused by the policy
        with pytest.raises(ProgrammingError) as caught, transaction.atomic():
            cursor.execute(
                INSERT, [tenant.pk, comments["a_task"].pk, author, "planted"]
            )
        assert "row-level security" in str(caught.value)
    with scope.tenant_scope([tenant.pk]), connection.cursor() as cursor:
        cursor.execute("SELECT body FROM console_deskcomment")
        assert cursor.fetchall() == [("note in a",)]


def test_a_comment_cannot_point_at_another_tenants_task(tenant, other_tenant, comments):
    # in A's scope, a comment of A on B's task: the composite key refuses it
    with (
        scope.tenant_scope([tenant.pk]),
        refused_by("console_deskcomment_task_same_tenant_fk"),
    ):
        execute(
            INSERT,
            [tenant.pk, comments["b_task"].pk, comments["author"].pk, "cross"],
        )


def test_a_blank_comment_is_refused(tenant, comments):
    with refused_by("console_deskcomment_body_check"):
        execute(INSERT, [tenant.pk, comments["a_task"].pk, comments["author"].pk, " "])


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE console_deskcomment SET body = 'rewritten' WHERE id = %s",
        "DELETE FROM console_deskcomment WHERE id = %s",
    ],
)
def test_the_app_role_cannot_change_or_delete_a_comment(comments, statement):
    with refused_for_privilege():
        execute(statement, [comments["a"].pk])
    assert DeskComment.objects.get(pk=comments["a"].pk).body == "note in a"


@pytest.mark.django_db(transaction=True)
def test_an_update_is_refused_even_with_the_privilege(
    tenant, make_task, django_user_model
):
    """The second wall: a superuser grants the app role UPDATE, becomes it, and the
    trigger still refuses (rolled back, grant included)."""
    comment = DeskComment.objects.create(
        tenant=tenant,
        task=make_task(tenant=tenant),
        author=django_user_model.objects.create_user("committed"),
        body="as written",
    )
    app = db_roles.app_role()
    with connect_as("admin") as conn:
        conn.execute(
            sql.SQL("GRANT UPDATE ON console_deskcomment TO {}").format(
                sql.Identifier(app)
            )
        )
        conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(app)))
        conn.execute(
            "SELECT set_config('portal.tenant_ids', %s, true)", [str(tenant.pk)]
        )
        # the app role, in the comment's tenant, sees the row it is about to change
        assert conn.execute(
            "SELECT body FROM console_deskcomment WHERE id = %s", [comment.pk]
        ).fetchall() == [("as written",)]
        with pytest.raises(psycopg.errors.IntegrityConstraintViolation) as caught:
            conn.execute(
                "UPDATE console_deskcomment SET body = 'rewritten' WHERE id = %s",
                [comment.pk],
            )
        conn.rollback()
    assert caught.value.diag.constraint_name == "console_deskcomment_append_only_trg"
    assert DeskComment.objects.get(pk=comment.pk).body == "as written"


def test_the_privileges_are_as_documented(db):
    """App role: SELECT and INSERT only; the operator deletes (tenant deletion)."""
    rows = {}
    with connect_as("admin") as conn:
        for role in (db_roles.app_role(), db_roles.OPERATOR_ROLE):
            rows[role] = [
                privilege
                for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE")
                if conn.execute(
                    "SELECT has_table_privilege(%s, 'console_deskcomment', %s)",
                    [role, privilege],
                ).fetchone()
                == (True,)
            ]
    assert rows == {
        db_roles.app_role(): ["SELECT", "INSERT"],
        db_roles.OPERATOR_ROLE: ["SELECT", "INSERT", "DELETE"],
    }
