"""One event per check pass (issue 23): a governed execute writes one
``gateway.checked`` event listing every check's verdict, and the credentials it
issued are recorded in the operation's ``operation.executing`` event, not in rows of
their own."""

from __future__ import annotations

from audit.models import Event
from tasks.models import Credential

from .conftest import World


def _events(started: dict) -> list[Event]:
    return list(
        Event.objects.filter(operation_id=started["operation"]["id"]).order_by("id")
    )


def test_a_verified_execute_writes_six_operation_events_one_of_them_the_checks(
    world: World,
):
    started = world.start_task()

    response = world.execute(started)

    assert response.status_code == 200, response.text
    assert response.json()["outcome"] == "verified"
    events = _events(started)
    # Before: 13 (five gateway.checked passes, two credential.issued, the
    # last-moment credential check as its own gateway.checked, ...).
    assert [e.code for e in events] == [
        "operation.reserved",
        "gateway.checked",
        "operation.executing",
        "connector.called",
        "receipt.queried",
        "operation.verified",
    ]
    checked = events[1]
    assert checked.reason_code is None
    assert checked.payload == {
        "verdict": "passed",
        "checks": [
            {"check": "contract", "verdict": "passed"},
            {"check": "fields", "verdict": "passed", "fields": ["email", "plan"]},
            {"check": "target", "verdict": "passed", "target": "ticket-desk"},
            {
                "check": "permission",
                "verdict": "passed",
                "executed_by": {"type": "agent", "id": str(world.agent.pk)},
            },
            {"check": "version", "verdict": "passed", "version": "7"},
        ],
    }
    executing = events[2].payload
    credentials = {
        str(c.pk): c
        for c in Credential.objects.filter(operation_id=started["operation"]["id"])
    }
    assert [c["use"] for c in executing["issued"]] == ["execute", "lookup"]
    assert {c["credential_id"] for c in executing["issued"]} == set(credentials)
    execute = executing["issued"][0]
    row = credentials[execute["credential_id"]]
    assert execute == {
        "credential_id": str(row.pk),
        "use": "execute",
        "action": "create_ticket",
        "target": "ticket-desk",
        "fields": ["email"],
        "expires_at": row.expires_at.isoformat(),
        "ttl_s": 60,
    }
    assert executing["checks"] == [
        {"check": "credential", "verdict": "passed", "credential_id": str(row.pk)}
    ]
    assert not Event.objects.filter(
        tenant_id=world.tenant.pk, code="credential.issued"
    ).exists()


def test_a_refused_pass_lists_the_checks_that_passed_then_the_refusal(world: World):
    started = world.start_task()

    response = world.execute(started, fields=world.fields(plan=None))

    assert response.status_code == 422, response.text
    assert response.json()["code"] == "FIELD_MISSING"
    events = _events(started)
    [checked] = [e for e in events if e.code == "gateway.checked"]
    assert checked.reason_code == "FIELD_MISSING"
    assert checked.payload["verdict"] == "refused"
    assert checked.payload["check"] == "fields"
    assert [(c["check"], c["verdict"]) for c in checked.payload["checks"]] == [
        ("contract", "passed"),
        ("fields", "refused"),
    ]
    assert checked.payload["checks"][1]["conflicting_fields"] == [
        {"field": "plan", "problem": "FIELD_MISSING"}
    ]
    assert "operation.executing" not in [e.code for e in events]
    assert not Credential.objects.filter(
        operation_id=started["operation"]["id"]
    ).exists()
