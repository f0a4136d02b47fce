"""A published policy set never changes, and one tenant never reaches another's.

Raw SQL on the test connection is the app role's (tests/conftest.py): each refusal
below is the database's own (policies migration 0002), not the service's.
"""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from policies import services
from policies.models import PolicySet
from portal import scope
from tests.db.conftest import execute, refused_by, refused_for_privilege
from tests.support.db import connect_as

PERMIT = "permit(principal, action, resource);"
TRIGGER = "policies_policyset_immutable_trg"


@pytest.fixture
def published(tenant, agent) -> PolicySet:  # the agent's grants are the actions
    draft = services.policy_set_draft(tenant=tenant, text=PERMIT)
    return services.policy_set_publish(
        tenant=tenant, version=draft.version, contract_specs=[]
    )


@pytest.mark.parametrize(
    "assignment",
    [
        "text = 'forbid(principal, action, resource);'",
        "version = 7",
        "state = 'draft'",
        "published_at = now()",
        "created_at = created_at - interval '1 day'",
        "note = 'changed'",
        "retired_at = now()",  # retiring is a state change, not a date alone
    ],
)
def test_a_published_policy_set_cannot_change(published, assignment):
    with refused_by(TRIGGER):
        execute(
            f"UPDATE policies_policyset SET {assignment} WHERE id = %s", [published.pk]
        )


def test_the_app_role_cannot_delete_a_published_policy_set(published):
    with refused_by(TRIGGER):
        execute("DELETE FROM policies_policyset WHERE id = %s", [published.pk])


def test_a_published_policy_set_can_be_retired_once_and_is_frozen_then(published):
    retire = (
        "UPDATE policies_policyset SET state = %s, retired_at = now() WHERE id = %s"
    )
    with refused_by(TRIGGER):  # no retirement without its time
        execute(
            "UPDATE policies_policyset SET state = 'retired' WHERE id = %s",
            [published.pk],
        )
    assert execute(retire, ["retired", published.pk]) == 1
    with refused_by(TRIGGER):
        execute(retire, ["published", published.pk])
    with refused_by(TRIGGER):
        execute(
            "UPDATE policies_policyset SET text = 'x' WHERE id = %s", [published.pk]
        )


def test_a_draft_can_still_change_and_go(tenant):
    draft = services.policy_set_draft(tenant=tenant, text=PERMIT)
    sql = "UPDATE policies_policyset SET text = 'forbid(principal, action, resource);'"
    assert execute(f"{sql} WHERE id = %s", [draft.pk]) == 1
    assert execute("DELETE FROM policies_policyset WHERE id = %s", [draft.pk]) == 1


def test_a_tenant_has_at_most_one_published_policy_set(published):
    with refused_by("policies_policyset_one_published_uniq"):
        execute(
            """
            INSERT INTO policies_policyset (id, tenant_id, version, state, text, note,
                created_at, updated_at, published_at)
            VALUES (gen_random_uuid(), %s, 99, 'published', %s, '', now(), now(),
                now())
            """,
            [published.tenant_id, PERMIT],
        )


def test_raw_sql_in_one_tenant_neither_reads_nor_writes_anothers(
    published, other_tenant
):
    with scope.tenant_scope([other_tenant.pk]), connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM policies_policyset WHERE tenant_id = %s",
            [published.tenant_id],
        )
        assert cursor.fetchone() == (0,)
        cursor.execute(
            "DELETE FROM policies_policyset WHERE tenant_id = %s",
            [published.tenant_id],
        )
        assert cursor.rowcount == 0
    with scope.tenant_scope([other_tenant.pk]), refused_for_privilege():
        execute(
            """
            INSERT INTO policies_policyset (id, tenant_id, version, state, text, note,
                created_at, updated_at)
            VALUES (gen_random_uuid(), %s, 98, 'draft', %s, '', now(), now())
            """,
            [published.tenant_id, PERMIT],
        )
    assert PolicySet.objects.filter(tenant_id=published.tenant_id).count() == 1


@pytest.mark.django_db(transaction=True)
def test_only_the_operator_deletes_a_published_policy_set(tenant, make_agent):
    """The tenant deletion runs as the operator: the one role the trigger lets
    delete a published version (docs/tenant-deletion.md)."""
    make_agent(tenant=tenant)
    draft = services.policy_set_draft(tenant=tenant, text=PERMIT)
    services.policy_set_publish(tenant=tenant, version=draft.version, contract_specs=[])
    delete = "DELETE FROM policies_policyset WHERE tenant_id = %s"
    scope_sql = "SELECT set_config('portal.tenant_ids', %s, false)"
    with connect_as("app") as app:
        app.execute(scope_sql, [str(tenant.pk)])
        with pytest.raises(psycopg.errors.IntegrityConstraintViolation) as caught:
            app.execute(delete, [tenant.pk])
        assert caught.value.diag.constraint_name == TRIGGER
    with connect_as("operator") as operator:
        operator.execute(scope_sql, [str(tenant.pk)])
        assert operator.execute(delete, [tenant.pk]).rowcount == 1
    assert not PolicySet.objects.filter(tenant=tenant).exists()
