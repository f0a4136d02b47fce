"""``GET /api/v1/tasks/{id}/evidence``: who gets a bundle, what it holds, and that the
offline verifier catches every way of tampering with it (tools/verify_bundle.py)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from rest_framework.test import APIClient

from audit import chain, checkpoints, retention
from audit import services as audit_services
from audit.evidence import checkpoint_json
from audit.jobs import checkpoint_audit_job
from audit.models import Checkpoint, Event, EventCode, RetentionPolicy
from portal import services as portal_services
from portal.actors import Actor
from portal.models import Role, Tenant
from tasks.models import Escalation, Operation, Task, TaskState
from tests.support.audit_events import append_at
from tests.support.db import connect_as
from tests.support.evidence import (
    TAMPERS,
    drop_payloads,
    run_verifier,
    tampered,
    tool,
    verdict,
)

from .conftest import AgentClient

pytestmark = pytest.mark.django_db

SECRET = "agp_0123456789ab.secret-part"


def public_pem() -> str:
    return checkpoints.public_key_pem(checkpoints.signing_key().public)


def append(task: Task, code: str = EventCode.TASK_TRANSITIONED, **data: object) -> None:
    with transaction.atomic():
        audit_services.event_append(
            tenant_id=task.tenant_id,
            task_id=task.pk,
            code=code,
            actor=Actor.system("evidence-test"),
            data=data,
        )


@pytest.fixture
def story(make_task: Callable[..., Task]) -> Task:
    """A task with seven events, an operation with a receipt, a resolved escalation."""
    task = make_task(state=TaskState.SUCCEEDED)
    append(task, EventCode.TASK_REGISTERED, note="ünïcode ✓", ratio=0.1, big=2**60)
    operation = Operation.objects.create(
        tenant_id=task.tenant_id,
        task=task,
        idempotency_key="ticket-1042",
        action="create_ticket",
        target="ticket-desk",
        input_hash="0" * 64,
        input={"summary": "Refund", "api_key": SECRET},
        state="verified",
        provider_reference="T-77",
        result={"ticket_id": "T-77", "token": SECRET},
    )
    Escalation.objects.create(
        tenant_id=task.tenant_id,
        task=task,
        operation=operation,
        reason_code="FIELD_STALE",
        evidence={"conflicting_fields": [{"field": "email"}]},
        resolution="edit",
    )
    for n in range(4):
        append(task, n=n, nested={"list": [1, 2.5, None, True], "é": "x"})
    append(task, EventCode.TASK_RESOLVED, resolution="edit", note="checked by phone")
    with transaction.atomic():
        audit_services.event_append(
            tenant_id=task.tenant_id,
            task_id=task.pk,
            operation_id=operation.pk,
            code=EventCode.OPERATION_VERIFIED,
            actor=Actor.system("evidence-test"),
            data={"provider_reference": "T-77"},
        )
    return task


def person(tenant: Tenant, name: str, role: Role | None) -> APIClient:
    user = User.objects.create_user(name, password="pw-for-tests-only-1")
    if role is not None:
        portal_services.membership_grant(tenant=tenant, user=user, role=role)
    client = APIClient()
    client.force_login(user)
    return client


def url(task: Task | uuid.UUID) -> str:
    return f"/api/v1/tasks/{getattr(task, 'pk', task)}/evidence"


def exports(tenant: Tenant) -> list[Event]:
    return list(
        Event.objects.filter(tenant=tenant, code=EventCode.AUDIT_EXPORTED).order_by(
            "id"
        )
    )


def test_the_agent_gets_a_bundle_that_verifies_offline(
    story: Task, api: AgentClient, tmp_path: Path
) -> None:
    # when the tenant's agent asks for the task's evidence (nothing checkpointed yet)
    response = api.get(url(story))
    # then it gets the bundle, signed on demand, that the standalone tool accepts
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/json"
    bundle = json.loads(response.content)
    assert bundle["coverage"]["complete"] is True
    assert bundle["checkpoint"]["head_seq"] == 7 == len(bundle["chain"]["events"])
    (tmp_path / "bundle.json").write_bytes(response.content)
    (tmp_path / "key.pem").write_text(public_pem())
    done = run_verifier(tmp_path / "bundle.json", tmp_path / "key.pem")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"intact: task {story.pk}")
    # and the export is recorded in the tenant's chain, naming the agent
    (recorded,) = exports(story.tenant)
    assert (recorded.actor_type, recorded.actor_id) == ("agent", str(api.agent.pk))
    assert recorded.task_id is None
    assert recorded.payload["task_id"] == str(story.pk)
    assert recorded.payload["events"] == 7


def test_the_bundle_proves_each_event_in_the_tenants_signed_tree_head(
    story: Task, api: AgentClient, tmp_path: Path
) -> None:
    """Issue 19 §2: every exported event has an inclusion proof in the tenant's
    signed log head, and every section is bound by the export record proven in
    it: an edit to any section is caught and named."""
    # when the bundle is exported (the on-demand run also extends the log)
    response = api.get(url(story))
    bundle = json.loads(response.content)
    # then every event of the chain is proven in the signed tree head
    assert len(bundle["log"]["inclusion"]) == 7
    (tmp_path / "key.pem").write_text(public_pem())
    (tmp_path / "bundle.json").write_bytes(response.content)
    done = run_verifier(tmp_path / "bundle.json", tmp_path / "key.pem")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].startswith("log: 7 of the 7 events included in the signed tree")
    assert lines[2].startswith(
        "bound: every section (actors, chain, checkpoint, coverage,"
    )
    assert "operations" in lines[2] and "escalations" in lines[2]
    # only the log's and the record's descriptions are not checked, and named
    assert lines[3] == (
        "not covered (no signature vouches for them, not checked): export.binding, "
        "log.format, log.rfc3161, log.tree"
    )
    # and the export record lists each section's digest, and is in the head
    assert bundle["version"] == 3
    record = bundle["export"]["event"]
    assert record["content"]["code"] == "audit.exported"
    sections = {s["section"] for s in record["payload"]["sections"]}
    assert sections == set(bundle) - {"log", "export"}
    # and an edited operations section (unseen before) is named, exit 1
    edited_ops = json.loads(response.content)
    edited_ops["operations"][0]["state"] = "failed"
    (tmp_path / "edited.json").write_text(json.dumps(edited_ops))
    done = run_verifier(tmp_path / "edited.json", tmp_path / "key.pem")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("FAILED altered in section operations: not what")
    # and a proof node changed, or a decision edited, is caught with its kind
    forged = json.loads(response.content)
    entry = next(e for e in forged["log"]["inclusion"] if e["proof"])
    entry["proof"][0] = "00" * 32
    assert verdict(forged, public_pem()) == tool.FORGED_PROOF
    edited = json.loads(response.content)
    edited["chain"]["length"] = 6
    assert verdict(edited, public_pem()) == tool.ALTERED


def test_the_bundle_holds_every_section_redacted(story: Task, api: AgentClient) -> None:
    bundle = api.get(url(story)).json()
    assert bundle["task"]["id"] == str(story.pk)
    assert bundle["tenant"] == {"id": str(story.tenant_id), "slug": story.tenant.slug}
    (operation,) = bundle["operations"]
    assert operation["provider_reference"] == "T-77"
    assert operation["input"] == {"summary": "Refund", "api_key": "[REDACTED]"}
    assert operation["result"]["token"] == "[REDACTED]"
    (receipt,) = bundle["receipts"]
    assert receipt["provider_reference"] == "T-77"
    assert [ref["code"] for ref in receipt["events"]] == ["operation.verified"]
    (escalation,) = bundle["escalations"]
    assert escalation["resolution"] == "edit"
    (decision,) = bundle["takeover_decisions"]
    assert decision["code"] == "task.resolved" and decision["seq"] == 6
    assert decision["note"] == "checked by phone"
    first = bundle["chain"]["events"][0]
    assert first["prev_hash"] is None and first["seq"] == 1
    # the integer beyond 2^53 is hashed as a decimal string (in the payload's
    # digest, chain format v2); the payload beside the content keeps it as it is
    assert first["content"]["payload_digest"] == chain.payload_digest(
        {**first["payload"], "big": str(2**60)}
    )
    assert SECRET not in json.dumps(bundle)


def test_an_unchanged_chain_is_not_signed_again(story: Task, api: AgentClient) -> None:
    checkpoint_audit_job()
    signed = Checkpoint.objects.filter(task_id=story.pk).count()
    first = api.get(url(story)).json()
    second = api.get(url(story)).json()
    assert first["checkpoint"] == second["checkpoint"]
    assert Checkpoint.objects.filter(task_id=story.pk).count() == signed


def test_events_after_the_last_checkpoint_are_signed_on_demand(
    story: Task, api: AgentClient
) -> None:
    # given a checkpoint, then two more events
    checkpoint_audit_job()
    append(story, n=100)
    append(story, n=101)
    # when the bundle is exported, then a new checkpoint signs all nine
    bundle = api.get(url(story)).json()
    assert bundle["checkpoint"]["head_seq"] == 9
    assert verdict(bundle, public_pem()) == "intact"


@pytest.mark.django_db(transaction=True)
def test_a_chain_cut_below_its_checkpoint_is_exported_unsigned_over(
    story: Task, api: AgentClient
) -> None:
    """A cut tail is evidence: the export never signs over it."""
    checkpoint_audit_job()
    # given someone with the database's superuser who cut the chain's last event
    # (a connection of its own: the tests' connection is the app role's)
    with connect_as("admin") as raw, raw.transaction():
        raw.execute("SET LOCAL session_replication_role = replica")
        raw.execute(
            "DELETE FROM audit_event WHERE task_id = %s AND chain_seq = 7", [story.pk]
        )
    bundle = api.get(url(story)).json()
    assert bundle["coverage"]["complete"] is False
    assert bundle["checkpoint"]["head_seq"] == 7
    assert len(bundle["chain"]["events"]) == 6
    assert verdict(bundle, public_pem()) == tool.DELETED


def test_events_are_exported_in_chain_format_v2_with_their_payloads_beside(
    story: Task, api: AgentClient
) -> None:
    """The hash covers the payload's digest; the payload rides beside the content
    (a large integer as it is: the digest hashes it as a string) and may go."""
    bundle = api.get(url(story)).json()
    first = bundle["chain"]["events"][0]
    assert first["content"]["v"] == chain.FORMAT_VERSION == 2
    assert "payload" not in first["content"]
    assert first["payload"]["big"] == 2**60
    assert first["content"]["payload_digest"] == chain.payload_digest(first["payload"])
    assert tool.payload_digest(first["payload"]) == first["content"]["payload_digest"]
    assert bundle["chain"]["anchor"] is None
    assert verdict(bundle, public_pem()) == "intact"
    # retention drops old payloads: the digests still stand for them (the chain's
    # check, as in a version 2 bundle, which the export record does not bind) ...
    dropped = json.loads(json.dumps(bundle))
    drop_payloads(dropped)
    unbound = {**dropped, "version": 2}
    del unbound["export"]
    assert verdict(unbound, public_pem()) == "intact"
    # ... but in a version 3 bundle, dropped after the export, it is an edit
    assert verdict(dropped, public_pem()) == tool.ALTERED


def test_a_chain_retention_purged_is_exported_from_its_anchor(
    make_task: Callable[..., Task], api: AgentClient, settings
) -> None:
    """The offline verifier checks everything after the anchor, then refuses to
    vouch for the anchor itself (verify_audit proves it by the tombstone)."""
    # Check deferred foreign keys at once, as committed transactions would, so no
    # trigger event waits on the partition retention alters (the test's one
    # transaction stands for many).
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    task = make_task(state=TaskState.SUCCEEDED)
    RetentionPolicy.objects.create(tenant=task.tenant, event_months=1, payload_days=7)
    today = dt.datetime.now(dt.UTC).replace(day=1, hour=12)
    old = (today - dt.timedelta(days=100)).replace(day=5)
    append_at(task.tenant, task.pk, old, 1)
    append_at(task.tenant, task.pk, old + dt.timedelta(hours=1), 2)
    append(task, n=3)
    append(task, n=4)
    report = retention.unscoped_retention_run()
    assert report.purged_events == {str(task.tenant_id): 2}, report.as_json()

    bundle = api.get(url(task)).json()

    events = bundle["chain"]["events"]
    anchor = bundle["chain"]["anchor"]
    assert anchor is not None and anchor["seq"] == 2
    assert events[0]["seq"] == 3 and events[0]["prev_hash"] == anchor["hash"]
    assert bundle["coverage"]["complete"] is True
    assert bundle["coverage"]["purged_events"] == 2
    assert bundle["checkpoint"]["head_seq"] == events[-1]["seq"]
    assert verdict(bundle, public_pem()) == tool.UNPROVEN_ANCHOR
    # without the anchor the cut is a deletion
    bundle["chain"]["anchor"] = None
    assert verdict(bundle, public_pem()) == tool.DELETED


@pytest.mark.parametrize("name", list(TAMPERS))
def test_the_verifier_names_each_kind_of_tampering(
    story: Task, api: AgentClient, name: str
) -> None:
    bundle = api.get(url(story)).json()
    assert verdict(bundle, public_pem()) == "intact"
    assert verdict(tampered(bundle, name), public_pem()) == TAMPERS[name][1]


def test_a_valid_checkpoint_of_an_older_head_does_not_cover(
    story: Task, api: AgentClient
) -> None:
    # given a checkpoint signed at seven events, and a bundle exported at eight
    checkpoint_audit_job()
    older = checkpoint_json(Checkpoint.objects.get(task_id=story.pk))
    append(story, n=100)
    bundle = api.get(url(story)).json()
    # when the older (genuine) checkpoint replaces the covering one
    bundle["checkpoint"] = older
    assert verdict(bundle, public_pem()) == tool.NOT_COVERED


def test_another_tasks_genuine_checkpoint_does_not_cover(
    story: Task, make_task: Callable[..., Task], api: AgentClient
) -> None:
    other = make_task()
    append(other)
    checkpoint_audit_job()
    bundle = api.get(url(story)).json()
    bundle["checkpoint"] = checkpoint_json(Checkpoint.objects.get(task_id=other.pk))
    assert verdict(bundle, public_pem()) == tool.NOT_COVERED


def test_the_verifier_exits_1_with_the_kind_and_2_without_a_usable_key(
    story: Task, api: AgentClient, tmp_path: Path
) -> None:
    bundle = api.get(url(story)).json()
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(tampered(bundle, "delete an event")))
    key = tmp_path / "key.json"  # the public-key endpoint's answer, saved
    key.write_text(json.dumps(api.get("/api/v1/audit/public-key").json()))
    done = run_verifier(broken, key)
    assert done.returncode == 1
    assert done.stdout.startswith("FAILED deleted at #4")
    not_json = tmp_path / "not.json"
    not_json.write_text("{")
    assert run_verifier(not_json, key).stdout.startswith("FAILED malformed")
    done = run_verifier(broken, tmp_path / "missing.pem")
    assert done.returncode == 2 and "unusable key" in done.stderr


# --- Who may export ------------------------------------------------------------------


def test_another_tenants_agent_gets_404(story: Task, other_api: AgentClient) -> None:
    response = other_api.get(url(story))
    assert response.status_code == 404
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "NOT_FOUND"
    assert not exports(story.tenant) and not exports(other_api.tenant)


@pytest.mark.parametrize(
    ("role", "status"),
    [(Role.REVIEWER, 200), (Role.ADMIN, 200), (Role.SUPPORT, 403), (None, 404)],
)
def test_people_of_the_tenant_by_role(
    story: Task, role: Role | None, status: int
) -> None:
    response = person(story.tenant, f"p-{role}", role).get(url(story))
    assert response.status_code == status, response.content
    if status == 200:
        assert verdict(response.json(), public_pem()) == "intact"
        (recorded,) = exports(story.tenant)
        assert recorded.actor_type == "user"
    else:
        assert response["Content-Type"] == "application/problem+json"
        assert response.json()["code"] == (
            "PERMISSION_DENIED" if status == 403 else "NOT_FOUND"
        )
        assert not exports(story.tenant)


@pytest.mark.parametrize("role", [Role.REVIEWER, Role.ADMIN])
def test_a_member_of_another_tenant_gets_404(
    story: Task, other_tenant: Tenant, role: Role
) -> None:
    response = person(other_tenant, f"eve-{role}", role).get(url(story))
    assert response.status_code == 404
    assert response.json()["code"] == "NOT_FOUND"


def test_nobody_signed_in_gets_401(story: Task) -> None:
    response = APIClient().get(url(story))
    assert response.status_code == 401
    assert response["Content-Type"] == "application/problem+json"


def test_an_unknown_task_is_404(api: AgentClient) -> None:
    assert api.get(url(uuid.uuid4())).status_code == 404


def test_the_schema_documents_the_endpoint(client) -> None:
    document = client.get("/api/schema/", {"format": "json"}).json()
    spec = document["paths"]["/api/v1/tasks/{task_id}/evidence"]["get"]
    assert spec["operationId"] == "tasks_evidence"
    assert {"200", "401", "403", "404", "503"} <= set(spec["responses"])
    bundle = spec["responses"]["200"]["content"]["application/json"]["schema"]
    assert bundle["$ref"].endswith("/EvidenceBundle")


def test_production_without_a_key_answers_503_when_a_checkpoint_is_needed(
    story: Task, api: AgentClient, settings
) -> None:
    settings.PRODUCTION = True
    settings.PORTAL_AUDIT_SIGNING_KEY = ""
    settings.PORTAL_AUDIT_SIGNING_KEY_FILE = ""
    response = api.get(url(story))
    assert response.status_code == 503
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "AUDIT_SIGNING_KEY_MISSING"
    assert not exports(story.tenant)


def test_the_bundle_names_its_actors_and_binds_the_names(
    story: Task, api: AgentClient
) -> None:
    # Given the story's events by a component, exported by an agent
    bundle = api.get(url(story)).json()

    # Then every actor the bundle names has its name as the pages show it
    actors = {(a["actor_type"], a["actor_id"]): a["name"] for a in bundle["actors"]}
    assert actors[("system", "evidence-test")] == "evidence-test"
    agents = [key for key in actors if key[0] == "agent"]
    assert agents and all(actors[key] for key in agents), actors
    assert verdict(bundle, public_pem()) == "intact"
    # and the names are bound by the export record: an edited name is caught
    forged = json.loads(json.dumps(bundle))
    forged["actors"][0]["name"] = "someone else"
    assert verdict(forged, public_pem()) != "intact"
