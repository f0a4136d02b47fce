"""The client against a real portal over HTTP: every endpoint, typed errors, retries."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import httpx
import pytest
from django.db import connection

from portal import idempotency
from portal_client import (
    IDEMPOTENCY_HEADER,
    REPLAY_HEADER,
    IdempotencyKeyMismatch,
    IdempotencyKeyReused,
    IllegalTransition,
    LeaseExpired,
    LeaseHeld,
    NotFound,
    PortalClient,
    PortalError,
    PortalUnavailable,
    StaleState,
    Task,
    Unauthenticated,
    ValidationFailed,
)
from tasks.models import Operation as OperationRow
from tasks.models import Task as TaskRow

from .conftest import AgentIdentity, FaultyTransport


def register(api: PortalClient, n: int, **overrides: str) -> Task:
    task, _ = api.register_task(
        client_task_id=overrides.get("client_task_id", f"issue-{n}"),
        workflow_key="customer-issue",
        workflow_version="1",
        object_type="customer_issue",
        object_id=str(n),
        object_version=overrides.get("object_version", "1"),
    )
    return task


def ticket_input(n: int) -> dict[str, str]:
    return {"queue": "support_queue_a", "summary": f"issue {n}", "customer": f"C{n}"}


def test_every_endpoint_answers_through_the_client(
    api: PortalClient, identity: AgentIdentity
) -> None:
    # Given: a recorded object version and three registered tasks.
    recorded = api.record_object_version("customer_issue", "1", version="7")
    assert (recorded.object_type, recorded.object_id, recorded.version) == (
        "customer_issue",
        "1",
        "7",
    )
    assert api.get_object_version("customer_issue", "1") == recorded
    first, created = api.register_task(
        client_task_id="issue-1",
        workflow_key="customer-issue",
        workflow_version="1",
        object_type="customer_issue",
        object_id="1",
        object_version="7",
    )
    assert created and first.state == "pending" and first.state_version == 1
    again, created_again = api.register_task(
        client_task_id="issue-1",
        workflow_key="customer-issue",
        workflow_version="1",
        object_type="customer_issue",
        object_id="1",
        object_version="7",
    )
    assert (again.id, created_again) == (first.id, False)
    second, third = register(api, 2), register(api, 3)
    assert api.get_task(first.id) == first

    # Listing follows the cursor across pages and applies filters.
    page = api.list_tasks_page(page_size=2)
    assert [t.id for t in page.items] == [first.id, second.id]
    assert page.next_cursor is not None and page.previous_cursor is None
    all_ids = [t.id for t in api.list_tasks(page_size=2)]
    assert all_ids == [first.id, second.id, third.id]
    assert [t.id for t in api.list_tasks(object_id="2")] == [second.id]
    assert [t.id for t in api.list_tasks(state="running")] == []

    # Claim, renew, reserve (new, then the same again), start, report, finish.
    claimed = api.claim_next(owner="worker-1", ttl_s=60)
    assert claimed is not None and claimed.id == first.id
    assert claimed.state == "running" and claimed.lease.owner == "worker-1"
    token = claimed.lease.token
    renewed = api.renew_lease(claimed.id, lease_token=token, ttl_s=120)
    assert renewed.lease.token == token
    assert renewed.lease.expires_at and claimed.lease.expires_at
    assert renewed.lease.expires_at > claimed.lease.expires_at
    operation, created = api.reserve_operation(
        claimed.id,
        lease_token=token,
        idempotency_key="ticket-for-issue-1",
        action="create_ticket",
        target="ticket-desk",
        input=ticket_input(1),
    )
    assert created and operation.state == "reserved" and operation.task_id == first.id
    same, created_again = api.reserve_operation(
        claimed.id,
        lease_token=token,
        idempotency_key="ticket-for-issue-1",
        action="create_ticket",
        target="ticket-desk",
        input=ticket_input(1),
    )
    assert (same.id, created_again) == (operation.id, False)
    assert api.get_operation(operation.id) == operation
    started = api.start_operation(operation.id, lease_token=token)
    assert (started.state, started.attempts) == ("executing", 1)
    verified = api.report_outcome(
        operation.id,
        lease_token=token,
        outcome="verified",
        provider_reference="TCK-1",
        result={"ticket_id": "TCK-1"},
    )
    assert (verified.state, verified.provider_reference) == ("verified", "TCK-1")
    done = api.transition(
        claimed.id,
        to="succeeded",
        expected_state_version=claimed.state_version,
        lease_token=token,
        step="ticket_created",
        payload={"ticket": "TCK-1"},
    )
    assert done.state == "succeeded" and done.lease.owner is None

    # Acquire and release a lease on a pending task: it stays pending.
    leased = api.acquire_lease(second.id, owner="worker-2", ttl_s=60)
    assert leased.lease.owner == "worker-2" and leased.state == "pending"
    released = api.release_lease(second.id, lease_token=leased.lease.token)
    assert released.lease.owner is None and released.state == "pending"

    # Events, across pages, in both orders.
    codes = [e.code for e in api.list_events(first.id, page_size=2)]
    assert codes == [
        "task.registered",
        "task.claimed",
        "operation.reserved",
        "operation.executing",
        "operation.verified",
        "task.transitioned",
    ]
    newest = [e.code for e in api.list_events(first.id, order="newest", page_size=4)]
    assert newest == list(reversed(codes))

    # Nothing pending after two more claims: claim-next answers None (204).
    assert api.claim_next(owner="worker-3") is not None
    assert api.claim_next(owner="worker-3") is not None
    assert api.claim_next(owner="worker-3") is None


def test_errors_are_typed_and_carry_the_code(
    portal_url: str,
    make_client: Callable[..., PortalClient],
    identity: AgentIdentity,
) -> None:
    transport = FaultyTransport()
    api = make_client(transport=transport)
    task = register(api, 1)
    claimed = api.claim_next(owner="worker-1", ttl_s=60)
    assert claimed is not None
    token = claimed.lease.token
    api.reserve_operation(
        task.id,
        lease_token=token,
        idempotency_key="ticket-for-issue-1",
        action="create_ticket",
        target="ticket-desk",
        input=ticket_input(1),
    )
    sent_before = len(transport.requests)

    with pytest.raises(StaleState) as stale:
        api.transition(
            task.id,
            to="succeeded",
            expected_state_version=claimed.state_version - 1,
            lease_token=token,
        )
    assert (stale.value.status, stale.value.code) == (409, "STALE_STATE")
    assert stale.value.body["state_version"] == claimed.state_version

    with pytest.raises(LeaseExpired) as expired:
        api.renew_lease(task.id, lease_token=token + 1)
    assert (expired.value.status, expired.value.code) == (409, "LEASE_EXPIRED")

    with pytest.raises(IdempotencyKeyReused) as reused:
        api.reserve_operation(
            task.id,
            lease_token=token,
            idempotency_key="ticket-for-issue-1",
            action="create_ticket",
            target="ticket-desk",
            input=ticket_input(2),
        )
    assert (reused.value.status, reused.value.code) == (422, "IDEMPOTENCY_KEY_REUSED")

    with pytest.raises(NotFound) as missing:
        api.get_task(str(uuid.uuid4()))
    assert (missing.value.status, missing.value.code) == (404, "NOT_FOUND")

    with pytest.raises(LeaseHeld) as held:
        api.acquire_lease(task.id, owner="worker-2")
    assert held.value.code == "LEASE_HELD"

    with pytest.raises(IllegalTransition) as illegal:
        api.transition(
            task.id,
            to="human_claimed",
            expected_state_version=claimed.state_version,
            lease_token=token,
        )
    assert (illegal.value.status, illegal.value.code) == (409, "ILLEGAL_TRANSITION")

    with pytest.raises(ValidationFailed) as invalid:
        api.claim_next(owner="worker-1", ttl_s=0)
    assert invalid.value.code == "VALIDATION_FAILED"
    assert "ttl_s" in invalid.value.body["errors"]

    # None of these refusals was retried: one request each.
    assert len(transport.requests) == sent_before + 7

    # The same Idempotency-Key with another body is refused, not run.
    register(api, 3)
    used_key = transport.requests[-1].headers[IDEMPOTENCY_HEADER]
    with pytest.raises(IdempotencyKeyMismatch) as mismatch:
        api.register_task(
            client_task_id="issue-4",
            workflow_key="customer-issue",
            workflow_version="1",
            object_type="customer_issue",
            object_id="4",
            object_version="1",
            request_key=used_key,
        )
    assert (mismatch.value.status, mismatch.value.code) == (
        422,
        "IDEMPOTENCY_KEY_MISMATCH",
    )
    assert not TaskRow.objects.filter(client_task_id="issue-4").exists()

    stranger = PortalClient(portal_url, "agp_nope.not-a-key")
    with stranger, pytest.raises(Unauthenticated) as unauthenticated:
        stranger.get_task(task.id)
    assert (unauthenticated.value.status, unauthenticated.value.code) == (
        401,
        "UNAUTHENTICATED",
    )
    assert isinstance(unauthenticated.value, PortalError)


def test_a_lost_answer_is_retried_under_the_same_key_and_replayed(
    make_client: Callable[..., PortalClient], identity: AgentIdentity
) -> None:
    # Given: a connection that drops the answer to the first registration, after
    # the portal has processed it.
    transport = FaultyTransport(drop_answer=lambda r: r.url.path.endswith("/tasks"))
    api = make_client(transport=transport)

    # When: the client registers the task.
    task, created = api.register_task(
        client_task_id="issue-1",
        workflow_key="customer-issue",
        workflow_version="1",
        object_type="customer_issue",
        object_id="1",
        object_version="1",
    )

    # Then: the retry used the same key and got the first answer replayed; one task.
    first, retry = transport.requests
    assert first.headers[IDEMPOTENCY_HEADER] == retry.headers[IDEMPOTENCY_HEADER]
    assert first.content == retry.content
    dropped, replayed = transport.responses
    assert dropped is None and replayed is not None
    assert replayed.headers[REPLAY_HEADER] == "true"
    assert created  # the replay carries the first answer's 201
    assert TaskRow.objects.filter(tenant=identity.tenant).count() == 1

    # The same for a reservation: one operation, the retry replayed.
    claimed = api.claim_next(owner="worker-1", ttl_s=60)
    assert claimed is not None
    transport.drop_answer = lambda r: r.url.path.endswith("/operations")
    operation, created = api.reserve_operation(
        task.id,
        lease_token=claimed.lease.token,
        idempotency_key="ticket-for-issue-1",
        action="create_ticket",
        target="ticket-desk",
        input=ticket_input(1),
    )
    assert created and operation.state == "reserved"
    assert transport.responses[-2] is None
    assert transport.responses[-1] is not None
    assert transport.responses[-1].headers[REPLAY_HEADER] == "true"
    keys = {r.headers[IDEMPOTENCY_HEADER] for r in transport.requests[-2:]}
    assert len(keys) == 1
    assert OperationRow.objects.filter(tenant=identity.tenant).count() == 1


def test_a_lost_claim_answer_replays_the_claim_instead_of_claiming_again(
    make_client: Callable[..., PortalClient], identity: AgentIdentity
) -> None:
    transport = FaultyTransport(drop_answer=lambda r: r.url.path.endswith("claim-next"))
    api = make_client(transport=transport)
    first, second = register(api, 1), register(api, 2)

    claimed = api.claim_next(owner="worker-1", ttl_s=60)

    assert claimed is not None and claimed.id == first.id
    assert transport.responses[-1] is not None
    assert transport.responses[-1].headers[REPLAY_HEADER] == "true"
    assert TaskRow.objects.get(pk=second.id).state == "pending"  # not stranded


def test_a_request_in_flight_is_retried_under_the_same_key_until_it_runs(
    make_client: Callable[..., PortalClient], identity: AgentIdentity
) -> None:
    # Given: a first delivery of the same request that the portal still sees as
    # running (its key is locked for a moment), as after a timeout mid-request.
    def first_delivery_running(request: httpx.Request) -> None:
        key = request.headers[IDEMPOTENCY_HEADER]
        idempotency.idempotent_request_begin(
            agent=identity.agent,
            key=key,
            fingerprint=idempotency.request_fingerprint(
                method=request.method,
                path=request.url.raw_path.decode(),
                body=request.content,
            ),
        )
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE portal_idempotentrequest SET locked_until = app_now() + interval '0.6 second' WHERE key = %s",
                [idempotency.stored_key(key)],
            )

    transport = FaultyTransport(before_send=first_delivery_running)
    api = make_client(transport=transport, max_retries=10, max_backoff_s=0.3)

    # When: the client registers the task.
    _, created = api.register_task(
        client_task_id="issue-1",
        workflow_key="customer-issue",
        workflow_version="1",
        object_type="customer_issue",
        object_id="1",
        object_version="1",
    )

    # Then: 409 REQUEST_IN_FLIGHT until the lock passed, then it ran, once.
    statuses = [r.status_code for r in transport.responses if r is not None]
    assert statuses[0] == 409 and statuses[-1] == 201 and created
    assert set(statuses[:-1]) == {409}
    first = transport.responses[0]
    assert first is not None and first.json()["code"] == "REQUEST_IN_FLIGHT"
    assert len({r.headers[IDEMPOTENCY_HEADER] for r in transport.requests}) == 1
    assert TaskRow.objects.filter(tenant=identity.tenant).count() == 1


def test_rate_limited_is_retried_after_retry_after_capped(
    make_client: Callable[..., PortalClient], identity: AgentIdentity
) -> None:
    # Given: a first answer 429 with a Retry-After longer than the client's cap.
    def too_many(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            429,
            headers={"Retry-After": "30"},
            json={"status": 429, "code": "RATE_LIMITED", "detail": "slow down"},
            request=request,
        )

    transport = FaultyTransport(fake_answer=too_many)
    api = make_client(transport=transport, max_backoff_s=0.3)

    started = time.monotonic()
    task = register(api, 1)

    # Then: it waited the cap (not 30 s), resent under the same key, and it ran once.
    assert 0.3 <= time.monotonic() - started < 5
    assert len(transport.requests) == 2
    assert len({r.headers[IDEMPOTENCY_HEADER] for r in transport.requests}) == 1
    assert TaskRow.objects.filter(pk=task.id).count() == 1


def test_transport_errors_are_retried_then_raised_as_portal_unavailable() -> None:
    attempts: list[httpx.Request] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        attempts.append(request)
        raise httpx.ConnectError("connection refused", request=request)

    api = PortalClient(
        "http://127.0.0.1:9",
        "agp_x.y",
        max_retries=2,
        backoff_s=0.01,
        transport=httpx.MockTransport(refuse),
    )
    with api, pytest.raises(PortalUnavailable) as unavailable:
        api.claim_next(owner="worker-1")

    assert (unavailable.value.status, unavailable.value.code) == (0, "UNAVAILABLE")
    assert len(attempts) == 3
    assert len({r.headers[IDEMPOTENCY_HEADER] for r in attempts}) == 1


def test_a_self_reported_outcome_on_a_governed_target_is_a_typed_refusal(
    api: PortalClient, identity: AgentIdentity
) -> None:
    """On a target with a connector only the gateway records outcomes: the client
    raises GatewayGoverned (409) and the operation stays reserved."""
    from portal_client import GatewayGoverned
    from tasks import services as task_services

    task_services.connector_save(
        tenant=identity.tenant,
        target="ticket-desk",
        values={"base_url": "https://desk-9.example/"},
    )
    task = register(api, 7)
    claimed = api.claim_next(owner="worker-1", ttl_s=60)
    assert claimed is not None
    operation, _ = api.reserve_operation(
        task.id,
        lease_token=claimed.lease.token,
        idempotency_key="ticket-for-issue-7",
        action="create_ticket",
        target="ticket-desk",
        input=ticket_input(7),
    )
    with pytest.raises(GatewayGoverned) as refused:
        api.start_operation(operation.id, lease_token=claimed.lease.token)
    assert (refused.value.status, refused.value.code) == (409, "GATEWAY_GOVERNED")
    assert OperationRow.objects.get(pk=operation.id).state == "reserved"
