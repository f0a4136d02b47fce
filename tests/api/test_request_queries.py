"""Statements per hot API request, counted: a request that grows a query fails here.

The reserve and transition requests are the ones ``bench/api.py`` measures against
raw SQL (docs/performance.md). Each statement is a round trip to PostgreSQL inside
the request, so a new one (a lazy ``agent.tenant``, a second key lookup, a check
that reads what the request already holds) shows up as latency and CPU on every
agent call. The budgets are today's counts; lower them when a change saves one.

Counted through Django's execute wrapper, as ``bench/api.py`` reports them, on the
steady-state request (the second, after the first warmed the agent's caches), less
the test's own savepoint statements (the test runs in a transaction, production
does not).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.statements import label, statements

from .conftest import AgentClient, register_and_claim

pytestmark = pytest.mark.django_db

# The statements of one request (labels as bench/api.py prints them): the key with
# its agent and tenant, found through the key's tenant and counted in the request-rate
# window (one function, portal_agent_key_authenticate); the reservation's reads (the
# grant, the contract, the policy set, the freeze flags and the limits, one
# statement); the reservation; the event with its outbox row.
RESERVE_MAX_STATEMENTS = 4
# The key (with its tenant and rate window), the transition, the event + outbox.
TRANSITION_MAX_STATEMENTS = 3


def reserve(api: AgentClient, task: dict[str, Any], key: str) -> Any:
    return api.post(
        f"/api/v1/tasks/{task['id']}/operations",
        {
            "idempotency_key": key,
            "action": "create_ticket",
            "target": "desk",
            "input": {"queue": "billing"},
        },
        **{"Lease-Token": str(task["lease"]["token"])},
    )


def test_a_reserve_request_runs_at_most_its_budget_of_statements(
    api: AgentClient,
) -> None:
    task = register_and_claim(api)
    assert reserve(api, task, "warm-1").status_code == 201
    with statements() as seen:
        answer = reserve(api, task, "steady-2")
    assert answer.status_code == 201, answer.json()
    labels = [label(sql) for sql in seen]
    assert len(labels) <= RESERVE_MAX_STATEMENTS, labels
    # The one that matters most: the reservation itself is one statement, and the
    # event and its outbox row another (not a statement per row).
    assert sum(sql.lstrip().upper().startswith("INSERT") for sql in seen) <= 3, labels


def test_a_transition_request_runs_at_most_its_budget_of_statements(
    api: AgentClient,
) -> None:
    first = register_and_claim(api, "issue-1")
    second = register_and_claim(api, "issue-2")
    for task in (first, second):
        path = f"/api/v1/tasks/{task['id']}/transitions"
        body = {"to": "succeeded", "expected_state_version": task["state_version"]}
        token = {"Lease-Token": str(task["lease"]["token"])}
        if task is first:
            assert api.post(path, body, **token).status_code == 200
            continue
        with statements() as seen:
            answer = api.post(path, body, **token)
        assert answer.status_code == 200, answer.json()
        labels = [label(sql) for sql in seen]
        assert len(labels) <= TRANSITION_MAX_STATEMENTS, labels
