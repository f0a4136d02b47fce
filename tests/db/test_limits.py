"""The limits' invariants in the database, with raw SQL as the app role.

The usage counter cannot hold more than its window allows (a CHECK, whatever the
statement), a rate limit's charge is one statement that refuses the call past the
limit, and another tenant's limits, budgets, usage and request counters can be
neither read nor changed (row-level security; the composite keys are proved in
test_composite_fks.py).
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.db import ProgrammingError, connection, transaction

from limits.models import Budget, LimitUsage, RateLimit
from portal import scope
from portal.models import AgentRequestWindow

from .conftest import execute, refused_by

pytestmark = pytest.mark.django_db

TABLES = (
    "limits_ratelimit",
    "limits_budget",
    "limits_limitusage",
    "portal_agentrequestwindow",
)


def _rows(tenant, make_agent) -> dict[str, object]:
    agent = make_agent(tenant=tenant)
    limit = RateLimit.objects.create(
        tenant=tenant, agent=agent, action="a", max_calls=3
    )
    budget = Budget.objects.create(
        tenant=tenant, agent=agent, action="a", argument="amount", max_total=10
    )
    now = dt.datetime.now(dt.UTC)
    usage = LimitUsage.objects.create(
        tenant=tenant, budget=budget, window_start=now, used=4, allowed=10
    )
    window = AgentRequestWindow.objects.create(
        tenant=tenant, agent=agent, window_start=now, requests=1
    )
    return {"limit": limit, "budget": budget, "usage": usage, "window": window}


def test_the_counter_can_never_hold_more_than_its_window_allows(tenant, make_agent):
    usage = _rows(tenant, make_agent)["usage"]
    with refused_by("limits_limitusage_within_check"):
        execute("UPDATE limits_limitusage SET used = allowed + 1 WHERE id = %s",
                [usage.pk])  # fmt: skip
    with refused_by("limits_limitusage_within_check"):
        execute("UPDATE limits_limitusage SET used = -1 WHERE id = %s", [usage.pk])
    assert LimitUsage.objects.get(pk=usage.pk).used == Decimal(4)


def test_a_usage_row_counts_for_exactly_one_limit(tenant, make_agent):
    rows = _rows(tenant, make_agent)
    with refused_by("limits_limitusage_one_limit_check"):
        execute(
            "UPDATE limits_limitusage SET rate_limit_id = %s WHERE id = %s",
            [rows["limit"].pk, rows["usage"].pk],
        )


@pytest.mark.parametrize("table", TABLES)
def test_raw_sql_in_tenant_a_cannot_read_or_change_bs_limits(
    table, tenant, other_tenant, make_agent
):
    _rows(tenant, make_agent)
    _rows(other_tenant, make_agent)
    with scope.tenant_scope([tenant.pk]), connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table} WHERE tenant_id = %s",
                       [other_tenant.pk])  # fmt: skip
        assert cursor.fetchone() == (0,)
        cursor.execute(f"SELECT count(*) FROM {table}")
        assert cursor.fetchone() == (1,)  # A's own row only
        cursor.execute(f"UPDATE {table} SET tenant_id = tenant_id WHERE tenant_id = %s",
                       [other_tenant.pk])  # fmt: skip
        assert cursor.rowcount == 0
        cursor.execute(f"DELETE FROM {table} WHERE tenant_id = %s", [other_tenant.pk])
        assert cursor.rowcount == 0
        with (
            pytest.raises(ProgrammingError, match="row-level security"),
            transaction.atomic(),
        ):
            cursor.execute(f"UPDATE {table} SET tenant_id = %s", [other_tenant.pk])
    with scope.tenant_scope([other_tenant.pk]), connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table}")
        assert cursor.fetchone() == (1,)  # B's row untouched


def test_the_request_counter_is_unlogged(db):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relpersistence FROM pg_class WHERE relname = %s",
            ["portal_agentrequestwindow"],
        )
        assert cursor.fetchone() == ("u",)
