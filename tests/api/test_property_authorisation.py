"""S05 (BOPLA): no field the server owns can be written, none it should not show is read.

Write side: every write operation of the served schema that takes a JSON body gets
a valid body plus a Hypothesis-drawn set of server-owned members (those its own
schema does not declare as inputs) and unknown members. Each such request is a 400
``VALIDATION_FAILED`` problem, and the tenant's rows in every table the operation
could write are the same afterwards; the same body without the extras then
succeeds, so the refusal was the extras'. An operation added to the schema without
a setup here fails ``test_every_write_operation_has_a_setup``.

Read side: every read operation, called by the agent, by a member of each role, and
by another tenant's agent and administrator, answers only the member paths listed
for it in ``response_fields.json`` (problems: its ``problem`` entry) and no
secret-shaped value (``audit.redaction.findings``, detect-secrets' plugins).

Sizing: ``PORTAL_S05_EXAMPLES`` payloads in all, shared out over the operations
(500 in CI; the nightly run sets 5000).
"""

from __future__ import annotations

import json
import os
import pathlib
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from audit import redaction
from audit.models import Event, Outbox
from portal import services as portal_services
from portal.models import Agent, Role, Tenant
from tasks import takeover
from tasks.models import (
    Approval,
    ApprovalDecision,
    Contract,
    Escalation,
    ObjectVersion,
    Operation,
    Task,
)
from tests.api.test_approvals import publish, with_amount
from tests.gateway.conftest import World, make_world, minutes_ago
from tests.support.contracts import SPEC
from ticketdesk.harness import TicketDesk

from .conftest import REGISTRATION, AgentClient, register_and_claim

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = int(os.environ.get("PORTAL_S05_EXAMPLES", "500"))
HOUR = 3600  # leases outlast the nightly's examples (the default lapsed under load)
ALLOW_LIST = pathlib.Path(__file__).with_name("response_fields.json")

# Members the server sets and no request may: drawn from for every operation, less
# the ones that operation's schema declares as its own inputs.
SERVER_OWNED = (
    "tenant_id",
    "tenant",
    "agent_id",
    "agent",
    "id",
    "task_id",
    "operation_id",
    "state",
    "state_version",
    "lease",
    "owner",
    "token",
    "lease_token",
    "expires_at",
    "reason_code",
    "input_hash",
    "attempts",
    "provider_reference",
    "result",
    "outcome",
    "created_at",
    "updated_at",
    "contract_version",
    "version",
    "trace_id",
    "approved_by",
    "decided_by",
    "published",
    "status",
)

# The tables an operation can write; compared for the tenant before and after.
WRITTEN = (
    Task,
    Operation,
    Event,
    Outbox,
    Approval,
    ApprovalDecision,
    Contract,
    ObjectVersion,
    Escalation,
)


# --- The world: a gateway world, an in-process agent, people ------------------------


@dataclass
class Scene:
    world: World
    api: AgentClient
    tenant: Tenant

    def person(self, role: Role, tenant: Tenant | None = None) -> APIClient:
        tenant = tenant or self.tenant
        user = User.objects.create_user(
            f"{role}-{User.objects.count()}", password="pw-for-tests-only-1"
        )
        portal_services.membership_grant(tenant=tenant, user=user, role=role)
        client = APIClient()
        client.force_login(user)
        return client


@pytest.fixture
def scene(
    transactional_db: None,
    live_server: Any,
    desk: TicketDesk,
    tenant: Tenant,
    make_agent: Callable[..., Agent],
    api: AgentClient,
) -> Iterator[Scene]:
    for world in make_world(
        tenant=tenant, make_agent=make_agent, desk=desk, base_url=live_server.url
    ):
        yield Scene(world=world, api=api, tenant=tenant)


@dataclass
class Answer:
    status: int
    content_type: str
    body: Any
    text: str


def answer_of(response: Any) -> Answer:
    if isinstance(response, httpx.Response):
        content_type, text = response.headers.get("content-type", ""), response.text
    else:
        content_type = response.get("Content-Type", "")
        text = response.content.decode()
    return Answer(
        response.status_code, content_type, json.loads(text) if text else None, text
    )


@dataclass
class Call:
    """One write request, ready to send with any body."""

    send: Callable[[dict[str, Any]], Answer]
    body: dict[str, Any]


def by_world(scene: Scene, method: str, path: str, **headers: str) -> Callable:
    return lambda body: answer_of(
        scene.world.http.request(method, path, json=body, headers=headers)
    )


def by_agent(scene: Scene, method: str, path: str, **headers: str) -> Callable:
    client = scene.api
    send = client.put if method == "PUT" else client.post
    return lambda body: answer_of(send(path, body, **headers))


def by_person(client: APIClient, path: str) -> Callable:
    return lambda body: answer_of(client.post(path, body, format="json"))


def lease_of(task: dict[str, Any]) -> dict[str, str]:
    return {"Lease-Token": str(task["lease"]["token"])}


def stale_task(scene: Scene, n: int) -> tuple[dict[str, Any], Task]:
    """A task escalated to a person: its execute read a ten-minute-old e-mail."""
    world = scene.world
    started = world.start_task(n)
    refused = world.execute(
        started, world.fields(email={"observed_at": minutes_ago(10)})
    )
    assert refused.json()["code"] == "FIELD_STALE", refused.text
    return started, Task.objects.get(pk=started["task"]["id"])


def waiting_approval(scene: Scene, n: int) -> Approval:
    world = scene.world
    publish(world)
    started = world.start_task(n)
    waiting = world.execute(started, with_amount(world, 700))
    assert waiting.json()["code"] == "APPROVAL_REQUIRED", waiting.text
    return Approval.objects.get(operation_id=started["operation"]["id"])


def finance(scene: Scene) -> APIClient:
    from routing.models import Group
    from routing.services import group_member_add

    user = User.objects.create_user(
        f"fin-{User.objects.count()}", password="pw-for-tests-only-1"
    )
    portal_services.membership_grant(tenant=scene.tenant, user=user, role=Role.SUPPORT)
    group, _ = Group.objects.get_or_create(tenant=scene.tenant, name="finance")
    group_member_add(tenant=scene.tenant, group=group, user=user)
    client = APIClient()
    client.force_login(user)
    return client


# --- One valid request per write operation -----------------------------------------


def tasks_register(scene: Scene) -> Call:
    body = {**REGISTRATION, "client_task_id": "s05-register"}
    return Call(by_agent(scene, "POST", "/api/v1/tasks"), body)


def tasks_claim_next(scene: Scene) -> Call:
    scene.api.post("/api/v1/tasks", {**REGISTRATION, "client_task_id": "s05-next"})
    return Call(by_agent(scene, "POST", "/api/v1/tasks/claim-next"), {"owner": "w"})


def tasks_lease_acquire(scene: Scene) -> Call:
    task = scene.api.post("/api/v1/tasks", REGISTRATION).json()
    path = f"/api/v1/tasks/{task['id']}/lease"
    return Call(by_agent(scene, "POST", path), {"owner": "w", "ttl_s": 60})


def tasks_lease_renew(scene: Scene) -> Call:
    task = register_and_claim(scene.api, ttl_s=HOUR)
    path = f"/api/v1/tasks/{task['id']}/lease/renew"
    return Call(by_agent(scene, "POST", path, **lease_of(task)), {"ttl_s": 60})


def tasks_transition(scene: Scene) -> Call:
    task = register_and_claim(scene.api, ttl_s=HOUR)
    path = f"/api/v1/tasks/{task['id']}/transitions"
    body = {"to": "waiting", "expected_state_version": task["state_version"]}
    return Call(by_agent(scene, "POST", path, **lease_of(task)), body)


def operations_reserve(scene: Scene) -> Call:
    task = register_and_claim(scene.api, ttl_s=HOUR)
    path = f"/api/v1/tasks/{task['id']}/operations"
    body = {"idempotency_key": "k", "action": "a", "target": "t", "input": {}}
    return Call(by_agent(scene, "POST", path, **lease_of(task)), body)


def operations_report_outcome(scene: Scene) -> Call:
    task = register_and_claim(scene.api, ttl_s=HOUR)
    reserved = scene.api.post(
        f"/api/v1/tasks/{task['id']}/operations",
        {"idempotency_key": "k", "action": "a", "target": "t", "input": {}},
        **lease_of(task),
    ).json()
    started = scene.api.post(
        f"/api/v1/operations/{reserved['id']}/start", **lease_of(task)
    )
    assert started.status_code == 200, started.json()
    path = f"/api/v1/operations/{reserved['id']}/outcome"
    body = {"outcome": "verified", "provider_reference": "R-1"}
    return Call(by_agent(scene, "POST", path, **lease_of(task)), body)


def operations_execute(scene: Scene) -> Call:
    world = scene.world
    started = world.start_task(2001)
    path = f"/api/v1/operations/{started['operation']['id']}/execute"
    send = by_world(scene, "POST", path, **{"Lease-Token": str(started["token"])})
    return Call(send, {"field_values": world.fields()})


def object_versions_record(scene: Scene) -> Call:
    path = "/api/v1/object-versions/customer_issue/1042"
    return Call(by_agent(scene, "PUT", path), {"version": "8"})


def actions_take(scene: Scene) -> Call:
    from tests.api.test_actions import body

    scene.api.put("/api/v1/object-versions/customer_issue/2002", {"version": "7"})
    return Call(by_world(scene, "POST", "/api/v1/actions"), body(n=2002, key="s05"))


def approvals_approve_create(scene: Scene) -> Call:
    approval = waiting_approval(scene, 2003)
    path = f"/api/v1/approvals/{approval.pk}/approve"
    return Call(by_person(finance(scene), path), {"reason": "checked"})


def approvals_reject_create(scene: Scene) -> Call:
    approval = waiting_approval(scene, 2004)
    path = f"/api/v1/approvals/{approval.pk}/reject"
    return Call(by_person(finance(scene), path), {"reason": "too much"})


def takeover_edit(scene: Scene) -> Call:
    started, task = stale_task(scene, 2005)
    support = scene.person(Role.SUPPORT)
    takeover.task_human_claim(task=task, user=User.objects.latest("pk"))
    body = {
        "operation_id": started["operation"]["id"],
        "field_values": scene.world.fields(),
        "note": "phoned the customer",
    }
    return Call(by_person(support, f"/api/v1/takeover/tasks/{task.pk}/edit"), body)


def takeover_resolve(scene: Scene) -> Call:
    _, task = stale_task(scene, 2006)
    support = scene.person(Role.SUPPORT)
    takeover.task_human_claim(task=task, user=User.objects.latest("pk"))
    path = f"/api/v1/takeover/tasks/{task.pk}/resolve"
    return Call(by_person(support, path), {"resolution": "hand_back", "note": "ok"})


def tenant_contracts_create(scene: Scene) -> Call:
    admin = scene.person(Role.ADMIN)
    path = f"/api/v1/tenants/{scene.tenant.slug}/contracts"
    return Call(by_person(admin, path), {"key": "s05-contract", "spec": SPEC})


SETUPS: dict[str, Callable[[Scene], Call]] = {
    setup.__name__: setup
    for setup in (
        tasks_register,
        tasks_claim_next,
        tasks_lease_acquire,
        tasks_lease_renew,
        tasks_transition,
        operations_reserve,
        operations_report_outcome,
        operations_execute,
        object_versions_record,
        actions_take,
        approvals_approve_create,
        approvals_reject_create,
        takeover_edit,
        takeover_resolve,
        tenant_contracts_create,
    )
}


# --- The served schema ---------------------------------------------------------------


def served_schema(scene: Scene) -> dict[str, Any]:
    document = scene.world.http.get("/api/schema/?format=json").json()
    assert isinstance(document, dict)
    return document


def operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if isinstance(operation, dict) and "operationId" in operation:
                yield method.upper(), path, operation


def json_body(operation: dict[str, Any]) -> dict[str, Any] | None:
    content = operation.get("requestBody", {}).get("content", {})
    schema = content.get("application/json", {}).get("schema")
    return schema if isinstance(schema, dict) else None


def declared_members(document: dict[str, Any], schema: dict[str, Any]) -> set[str]:
    """Every member name a body schema declares, through $ref and its variants."""
    if ref := schema.get("$ref"):
        schema = document["components"]["schemas"][ref.rsplit("/", 1)[-1]]
    names = set(schema.get("properties", {}))
    for variants in ("oneOf", "anyOf", "allOf"):
        for variant in schema.get(variants, []):
            names |= declared_members(document, variant)
    return names


def test_every_write_operation_has_a_setup(scene: Scene) -> None:
    written = {
        operation["operationId"]
        for _, _, operation in operations(served_schema(scene))
        if json_body(operation) is not None
    }
    assert written == set(SETUPS)


# --- Write side ----------------------------------------------------------------------


def snapshot(tenant: Tenant) -> dict[str, Any]:
    return {
        model.__name__: list(
            model.objects.filter(tenant=tenant).order_by("pk").values()
        )
        for model in WRITTEN
    }


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.text(max_size=16)
    | st.uuids().map(str),
    lambda inner: (
        st.lists(inner, max_size=2)
        | st.dictionaries(st.text(max_size=6), inner, max_size=2)
    ),
    max_leaves=4,
)
unknown_names = st.text(string.ascii_lowercase + "_", min_size=1, max_size=12)


@pytest.mark.parametrize("operation_id", list(SETUPS))
def test_server_owned_and_unknown_members_are_refused_and_change_nothing(
    scene: Scene, operation_id: str
) -> None:
    document = served_schema(scene)
    (schema,) = (
        json_body(operation)
        for _, _, operation in operations(document)
        if operation["operationId"] == operation_id
    )
    assert schema is not None
    inputs = declared_members(document, schema)
    owned = sorted(set(SERVER_OWNED) - inputs)
    call = SETUPS[operation_id](scene)
    before = snapshot(scene.tenant)
    tried = []

    @settings(
        max_examples=-(-EXAMPLES // len(SETUPS)),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(
        st.dictionaries(st.sampled_from(owned), json_values, min_size=1),
        st.dictionaries(
            unknown_names.filter(lambda name: name not in inputs),
            json_values,
            max_size=2,
        ),
    )
    def extras_are_refused(server_owned: dict, unknown: dict) -> None:
        extras = {**server_owned, **unknown}
        answer = call.send({**call.body, **extras})
        tried.append(extras)
        assert answer.status == 400, (extras, answer.text)
        assert answer.content_type.startswith("application/problem+json")
        assert answer.body["code"] == "VALIDATION_FAILED", answer.body
        assert set(answer.body.get("errors", {})) <= set(extras), answer.body
        assert snapshot(scene.tenant) == before, extras

    extras_are_refused()
    accepted = call.send(call.body)
    assert 200 <= accepted.status < 300, accepted.text
    print(f"S05 {operation_id}: {len(tried)} payloads refused, escapes 0")


# --- Read side -----------------------------------------------------------------------

# Members whose values are the caller's own JSON (or a contract's): their keys are
# data, not fields, and are not listed.
FREE_FORM = {
    "payload",
    "input",
    "result",
    "spec",
    "evidence",
    "arguments",
    "fields",
    "errors",
    "context",
    "details",
}


def member_paths(value: Any, prefix: str = "") -> set[str]:
    paths: set[str] = set()
    if isinstance(value, dict):
        for key, inner in value.items():
            path = f"{prefix}{key}"
            paths.add(path)
            if key not in FREE_FORM:
                paths |= member_paths(inner, f"{path}.")
    elif isinstance(value, list):
        for inner in value:
            paths |= member_paths(inner, f"{prefix}[].")
    return paths


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, inner in value.items():
            yield str(key)
            yield from strings(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from strings(inner)


def secret_shaped(value: Any) -> list[str]:
    """Strings detect-secrets' plugins or the portal's own key patterns flag.

    E-mail addresses, card numbers (the test's own data) and high-entropy runs
    (every hash and receipt is one) are not secrets by shape and are left out.
    """
    return [
        text
        for text in strings(value)
        for finding in redaction.findings(text)
        if finding.kind not in ("email", "card", "high_entropy")
    ]


def read_paths(scene: Scene) -> dict[str, str]:
    """A path for each read operation, to rows of every kind the portal shows."""
    world = scene.world
    executed = world.start_task(3001)
    done = world.execute(executed)
    assert done.status_code == 200, done.text
    _, escalated = stale_task(scene, 3002)
    waiting_approval(scene, 3003)
    scene.api.put("/api/v1/object-versions/customer_issue/3001", {"version": "7"})
    task_id = executed["task"]["id"]
    return {
        "approvals_waiting": "/api/v1/approvals",
        "contracts_list": "/api/v1/contracts",
        "contracts_get": "/api/v1/contracts/customer-issue/versions/1",
        "object_versions_get": "/api/v1/object-versions/customer_issue/3001",
        "operations_get": f"/api/v1/operations/{executed['operation']['id']}",
        "takeover_queue": "/api/v1/takeover/queue",
        "tasks_list": "/api/v1/tasks",
        "tasks_get": f"/api/v1/tasks/{task_id}",
        "tasks_events": f"/api/v1/tasks/{task_id}/events",
        "tasks_evidence": f"/api/v1/tasks/{escalated.pk}/evidence",
    }


def reads_as(client: APIClient) -> Callable[[str], Answer]:
    return lambda path: answer_of(client.get(path))


def test_read_operations_show_only_listed_members_and_no_secret(
    scene: Scene, other_tenant: Tenant, make_client: Callable[..., AgentClient]
) -> None:
    document = served_schema(scene)
    reads = {
        operation["operationId"]
        for method, _, operation in operations(document)
        if method == "GET"
    }
    paths = read_paths(scene)
    assert set(paths) == reads
    outsider = make_client(tenant=other_tenant)
    readers: dict[str, Callable[[str], Answer]] = {
        "agent": lambda path: answer_of(scene.world.http.get(path)),
        "other tenant's agent": lambda path: answer_of(outsider.get(path)),
        "other tenant's admin": reads_as(scene.person(Role.ADMIN, other_tenant)),
    }
    for role in Role:
        readers[role.value] = reads_as(scene.person(role))
    allowed = {
        name: set(members)
        for name, members in json.loads(ALLOW_LIST.read_text()).items()
    }
    secrets_issued = {scene.api.secret, outsider.secret}
    ours = {
        str(scene.tenant.pk),
        *(
            str(pk)
            for pk in Task.objects.filter(tenant=scene.tenant).values_list(
                "pk", flat=True
            )
        ),
    }
    unexpected = []
    seen_2xx = set()
    for operation_id, path in sorted(paths.items()):
        for reader, read in readers.items():
            answer = read(path)
            assert answer.status < 500, (operation_id, reader, answer.text)
            entry = operation_id if answer.status < 300 else "problem"
            if answer.status < 300:
                seen_2xx.add(operation_id)
            extra = member_paths(answer.body) - allowed.get(entry, set())
            if extra:
                unexpected.append((operation_id, reader, answer.status, sorted(extra)))
            assert not secret_shaped(answer.body), (operation_id, reader)
            assert not any(secret in answer.text for secret in secrets_issued)
            if reader.startswith("other tenant"):
                # A 404 names the id it was asked for; nothing else of ours.
                leaked = {mine for mine in ours if mine not in path}
                assert not any(mine in answer.text for mine in leaked), (path, reader)
    assert unexpected == []
    assert seen_2xx == reads  # each read answered someone with its real body
