"""A real task's evidence bundle, end to end: agent → gateway → ticket desk → stale
field → a person takes over and edits it → verified; the bundle comes over HTTP from
the live server and the standalone verifier, in its own process, accepts it and
names every kind of tampering."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from portal import services as portal_services
from portal.models import Role
from tasks import takeover
from tasks.models import Operation, OperationState, Task, TaskState
from tests.support.evidence import TAMPERS, run_verifier, tampered, verdict

from .conftest import World, minutes_ago
from .test_takeover_resolutions import fresh

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_taken_over_task_exports_a_bundle_that_verifies_and_tampering_fails(
    world: World, tmp_path: Path
) -> None:
    # given a task whose first execute was refused (stale e-mail) and escalated
    started = world.start_task()
    refused = world.execute(
        started, world.fields(email={"observed_at": minutes_ago(10)})
    )
    assert refused.json()["code"] == "FIELD_STALE"
    task = Task.objects.get(pk=started["task"]["id"])
    # and a support person who claims it and gives a fresh value: one ticket, verified
    sam = User.objects.create_user("sam", password="pw-for-tests-only-1")
    portal_services.membership_grant(tenant=world.tenant, user=sam, role=Role.SUPPORT)
    takeover.task_human_claim(task=task, user=sam)
    outcome = takeover.task_human_edit(
        task=task,
        user=sam,
        operation_id=started["operation"]["id"],
        fields=[
            fresh("email", "ana@example.com", "crm"),
            fresh("plan", "pro", "billing"),
        ],
        note="checked the CRM by phone",
    )
    assert outcome.result.outcome == "verified" and world.tickets() == 1
    operation = Operation.objects.get(pk=started["operation"]["id"])
    assert operation.state == OperationState.VERIFIED
    assert Task.objects.get(pk=task.pk).state == TaskState.PENDING

    # when the agent exports the evidence over HTTP, and the public key is fetched
    response = world.http.get(f"/api/v1/tasks/{task.pk}/evidence")
    assert response.status_code == 200, response.text
    bundle_file = tmp_path / "bundle.json"
    bundle_file.write_bytes(response.content)
    key_file = tmp_path / "public-key.json"
    key_file.write_bytes(world.http.get("/api/v1/audit/public-key").content)
    public_pem = json.loads(key_file.read_text())["public_key_pem"]

    # then the standalone verifier, in its own process, finds it intact
    done = run_verifier(bundle_file, key_file)
    assert done.returncode == 0, done.stdout + done.stderr
    bundle = response.json()
    events = bundle["chain"]["events"]
    assert done.stdout.startswith(f"intact: task {task.pk}")
    assert f"{len(events)} events" in done.stdout
    # and the bundle tells the story: the receipt, the escalation, the person's steps
    (receipt,) = bundle["receipts"]
    assert receipt["provider_reference"] == operation.provider_reference
    assert "operation.verified" in {ref["code"] for ref in receipt["events"]}
    (escalation,) = bundle["escalations"]
    assert escalation["reason_code"] == "FIELD_STALE"
    decisions = {(d["code"], d["by"]["actor_id"]) for d in bundle["takeover_decisions"]}
    assert ("task.human_claimed", str(sam.pk)) in decisions
    assert ("operation.fields_edited", str(sam.pk)) in decisions
    (exported_operation,) = bundle["operations"]
    assert exported_operation["credentials"], "the gateway's credential is listed"
    sealed = world.connector.sealed_private_key
    assert "sealed_private_key" not in response.text and sealed not in response.text

    # and every kind of tampering with this real bundle is caught with its kind
    seen = {name: verdict(tampered(bundle, name), public_pem) for name in TAMPERS}
    assert seen == {name: kind for name, (_, kind) in TAMPERS.items()}
    # also by the tool in its own process: exit 1 and the kind
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(tampered(bundle, "truncate the tail")))
    done = run_verifier(broken, key_file)
    assert done.returncode == 1
    assert done.stdout.startswith("FAILED deleted")
