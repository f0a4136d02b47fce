"""LeaseKeeper against a real portal: it keeps a short lease alive and notices loss."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from portal_client import LeaseExpired, LeaseKeeper, LeaseLost, PortalClient, Task

from .conftest import AgentIdentity


def claim(api: PortalClient, *, ttl_s: int) -> Task:
    api.register_task(
        client_task_id="issue-1",
        workflow_key="customer-issue",
        workflow_version="1",
        object_type="customer_issue",
        object_id="1",
        object_version="1",
    )
    task = api.claim_next(owner="worker-1", ttl_s=ttl_s)
    assert task is not None
    return task


def lease_seconds_left(task_id: str) -> float:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM lease_expires_at - app_now()) FROM tasks_task WHERE id = %s",
            [task_id],
        )
        (left,) = cursor.fetchone()
    return float(left)


def test_keeper_keeps_a_short_lease_alive_past_its_ttl(
    api: PortalClient, identity: AgentIdentity
) -> None:
    # Given: a task claimed with a 2 s lease.
    task = claim(api, ttl_s=2)

    # When: the work runs 3 s under a keeper renewing every 0.5 s.
    with LeaseKeeper(api, task.id, task.lease.token, 2, 0.5) as keeper:
        ends_at = time.monotonic() + 3
        while time.monotonic() < ends_at:
            keeper.check()
            time.sleep(0.1)

        # Then: the lease is still live, under the same token, and writes succeed.
        assert keeper.renewals >= 5
        assert not keeper.lost.is_set()
        assert lease_seconds_left(task.id) > 0
        done = api.transition(
            task.id,
            to="succeeded",
            expected_state_version=task.state_version,
            lease_token=keeper.token,
        )
    assert done.state == "succeeded"


def test_keeper_notices_a_takeover_and_check_stops_the_work(
    api: PortalClient, identity: AgentIdentity
) -> None:
    # Given: a task under a keeper.
    task = claim(api, ttl_s=60)
    lost: list[LeaseLost] = []
    keeper = LeaseKeeper(
        api, task.id, task.lease.token, 60, 0.2, on_lost=lost.append
    ).start()
    try:
        keeper.check()

        # When: the lease lapses and another worker takes the task over.
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE tasks_task SET lease_expires_at = app_now() - interval '1 second' WHERE id = %s",
                [task.id],
            )
        taken = api.acquire_lease(task.id, owner="worker-2", ttl_s=60)
        assert taken.lease.token == task.lease.token + 1

        # Then: the keeper sees its renewal refused, and check() stops the work.
        assert keeper.lost.wait(timeout=5)
        with pytest.raises(LeaseLost) as caught:
            keeper.check()
        assert caught.value.token == task.lease.token
        assert "LEASE_EXPIRED" in caught.value.reason
    finally:
        keeper.stop()
    # on_lost runs in the keeper's thread just after `lost` is set; stop() joined it.
    assert [error.reason for error in lost] == [caught.value.reason]

    # The portal fences the old token anyway.
    with pytest.raises(LeaseExpired):
        api.transition(
            task.id,
            to="succeeded",
            expected_state_version=task.state_version,
            lease_token=task.lease.token,
        )


def test_keeper_refuses_to_start_on_a_lease_already_gone(
    api: PortalClient, identity: AgentIdentity
) -> None:
    task = claim(api, ttl_s=60)
    api.release_lease(task.id, lease_token=task.lease.token)

    with pytest.raises(LeaseLost):
        LeaseKeeper(api, task.id, task.lease.token, 60).start()
