"""Kill the primary under load: nothing acknowledged is lost, nothing done twice
(issue 26 §1-2).

Agents (separate processes, ``tests/ha/agent.py``) take governed actions through a
real gunicorn against the real ticket desk while the test SIGKILLs the primary's
postmaster. Patroni promotes the synchronous standby; the portal's multi-host URL
(``target_session_attrs=read-write``) finds it by itself. Then, on the promoted
node: every action the API acknowledged is there with its task, events and outbox
rows; the desk made at most one ticket per key (its own count); ``verify_audit``
passes; the roles, row-level security and definer functions behave as they did on
the old primary; and the old primary rejoins as a replica (``pg_rewind``).

Sizes: ``PORTAL_HA_AGENTS`` agent processes (CI 2; the hand run 8). The kill
comes once each agent has had an action verified and ``PORTAL_HA_WARMUP_S`` more
seconds (CI 1) have passed; the load goes on ``PORTAL_HA_DURATION_S`` seconds
after the promotion (CI 5). The figures print with ``-s``; docs/scale-out.md has the hand run's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import psycopg
import pytest

from portal import db_roles
from tests.support import ha

from .conftest import DBNAME, HAPortal

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
AGENTS = int(os.environ.get("PORTAL_HA_AGENTS", "2"))
WARMUP_S = float(os.environ.get("PORTAL_HA_WARMUP_S", "1"))
DURATION_S = float(os.environ.get("PORTAL_HA_DURATION_S", "5"))
# Agent processes start slowly on a loaded machine.
AGENTS_START_TIMEOUT_S = 120.0
# Patroni's TTL is 10 s; promotion comes well inside it once the leader is gone.
FAILOVER_BUDGET_S = 30.0


def _run_agents(
    portal: HAPortal, folder: Path, *, stop: Path
) -> list[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.ha.agent",
                "--base-url",
                portal.web.base_url,
                "--api-key",
                portal.api_key,
                "--name",
                f"a{index}",
                "--stop",
                str(stop),
                "--out",
                str(folder / f"a{index}.jsonl"),
            ],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        for index in range(AGENTS)
    ]


def _records(folder: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in sorted(folder.glob("a*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line]
    return rows


def _probe(conninfo: str, *, tenant_id: str) -> dict[str, Any]:
    """What the app role may and may not do on one node (roles, RLS, definers)."""
    seen: dict[str, Any] = {}
    with psycopg.connect(conninfo, autocommit=True) as app:
        row = app.execute(
            "SELECT current_user, pg_is_in_recovery(), "
            "(SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user)"
        ).fetchone()
        assert row is not None
        seen["user"], seen["in_recovery"], seen["privileged"] = row
        # Row-level security: no scope, no rows; the tenant's scope, its rows.
        seen["tasks_unscoped"] = app.execute(
            "SELECT count(*) FROM tasks_task"
        ).fetchone()
        with app.transaction():
            app.execute("SELECT set_config('portal.tenant_ids', %s, true)", [tenant_id])
            (scoped,) = app.execute("SELECT count(*) FROM tasks_task").fetchone() or (
                0,
            )
        seen["tasks_scoped_nonzero"] = scoped > 0
        # The trail is append-only for the app role.
        try:
            with app.transaction():
                app.execute("UPDATE audit_event SET reason_code = NULL WHERE false")
            seen["event_update"] = "allowed"
        except psycopg.errors.InsufficientPrivilege:
            seen["event_update"] = "refused"
        # A definer function (the discovery role's): tenant ids across tenants.
        due = app.execute("SELECT * FROM audit_tenants_with_due_outbox()").fetchall()
        seen["definer_sees_tenant"] = any(str(r[0]) == tenant_id for r in due)
        # The partitions of the trail.
        seen["event_partitions"] = len(
            app.execute("SELECT * FROM audit_event_partitions()").fetchall()
        )
    return seen


def test_killing_the_primary_under_load_loses_no_acknowledged_action(
    ha_portal: HAPortal, tmp_path: Path
) -> None:
    cluster, desk = ha_portal.cluster, ha_portal.desk
    desk.reset()
    old = cluster.leader()
    assert old is not None
    old_node = cluster.node(old)
    admin_old = old_node.conninfo(dbname=DBNAME)
    with psycopg.connect(admin_old) as admin:
        row = admin.execute(
            "SELECT id FROM portal_tenant WHERE slug = 'demo'"
        ).fetchone()
    assert row is not None
    tenant_id = str(row[0])

    # Given agents taking actions through the API
    started = time.time()
    stop = tmp_path / "stop"
    agents = _run_agents(ha_portal, tmp_path, stop=stop)
    # The checkpoint signer signs on the primary (again after the failover), while
    # the agents start.
    ha.manage(cluster, "checkpoint_audit", database_url=ha_portal.app_url)

    def each_agent_verified() -> bool:
        names = {
            r["key"].split("-")[1]
            for r in _records(tmp_path)
            if r.get("outcome") == "verified"
        }
        return len(names) == AGENTS

    cluster.wait_for(
        "every agent's first action",
        each_agent_verified,
        timeout=AGENTS_START_TIMEOUT_S,
    )
    time.sleep(WARMUP_S)
    before = _records(tmp_path)
    probe_before = _probe(
        old_node.conninfo(user=db_roles.APP_ROLE, dbname=DBNAME), tenant_id=tenant_id
    )
    # When the primary's postmaster is SIGKILLed
    killed_at = time.time()
    cluster.kill_postmaster(old)
    new = cluster.wait_for_leader(other_than=old)
    promoted_at = time.time()
    time.sleep(DURATION_S)
    stop.touch()
    for agent in agents:
        agent.wait(timeout=120)
    records = _records(tmp_path)

    # Then the load ran before the kill and the API answered cleanly throughout
    assert any(r.get("outcome") == "verified" for r in before), before[-5:]
    settled = [r for r in records if r["status"] == 200]
    assert all(r["outcome"] == "verified" for r in settled), [
        r for r in settled if r["outcome"] != "verified"
    ][:3]
    statuses = Counter(str(r["status"] or r.get("error")) for r in records)
    for r in records:
        status = r["status"]
        assert status in (None, 200, 202, 409, 503), r  # never a 500
        if status == 503:
            assert r["content_type"] == "application/problem+json", r
            assert r["code"] == "DATABASE_UNAVAILABLE", r
            assert int(r["retry_after"]) >= 1, r
    assert "Traceback" not in ha_portal.web.log(), ha_portal.web.log()[-5000:]

    # And writes resumed on the promoted node within seconds
    acked = [r for r in records if r["status"] == 200 and r["outcome"] == "verified"]
    after_kill = [r for r in acked if r["sent"] > killed_at]
    assert after_kill, f"no write succeeded after the kill: {statuses}"
    first_write_s = min(r["answered"] for r in after_kill) - killed_at
    assert first_write_s < FAILOVER_BUDGET_S

    # And every acknowledged action is on the promoted node, with its trail
    new_node = cluster.node(new)
    by_key = {r["key"]: r for r in acked}
    with psycopg.connect(new_node.conninfo(dbname=DBNAME)) as admin:
        assert admin.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
        operations = {
            key: (str(op_id), state, ref, str(task_id))
            for key, op_id, state, ref, task_id in admin.execute(
                "SELECT idempotency_key, id, state, provider_reference, task_id "
                "FROM tasks_operation WHERE tenant_id = %s",
                [tenant_id],
            )
        }
        task_states: dict[str, str] = dict(
            admin.execute(
                "SELECT id::text, state FROM tasks_task WHERE tenant_id = %s",
                [tenant_id],
            ).fetchall()
        )
        events: dict[str, set[str]] = defaultdict(set)
        for task_id, code in admin.execute(
            "SELECT task_id::text, code FROM audit_event WHERE tenant_id = %s",
            [tenant_id],
        ):
            events[task_id].add(code)
        outbox = Counter(
            task_id
            for (task_id,) in admin.execute(
                "SELECT task_id::text FROM audit_outbox WHERE tenant_id = %s",
                [tenant_id],
            )
        )
    lost = []
    for key, answer in by_key.items():
        stored = operations.get(key)
        if (
            stored is None
            or stored[0] != answer["operation_id"]
            or stored[1] != "verified"
            or stored[2] != answer["provider_reference"]
            or task_states.get(stored[3]) != "succeeded"
            or not events.get(stored[3])
            or not outbox.get(stored[3])
        ):
            lost.append((key, answer, stored))
    assert not lost, lost[:5]

    # And the desk made no ticket twice (its own count), and each receipt is its own
    effects = desk.effects()
    tickets = [t for t in desk.tickets() if t["tenant"] == tenant_id]
    made = Counter(t["idempotency_key"] for t in tickets)
    duplicates = {key: n for key, n in made.items() if n > 1}
    duplicates |= {k: n for k, n in effects["by_idempotency_key"].items() if n > 1}
    assert duplicates == {}
    ticket_of = {t["idempotency_key"]: t["ticket_id"] for t in tickets}
    assert all(ticket_of.get(k) == r["provider_reference"] for k, r in by_key.items())

    # And the signer signs on the new primary, and the trail verifies there
    ha.manage(cluster, "checkpoint_audit", database_url=ha_portal.app_url)
    ha.manage(cluster, "verify_audit", database_url=ha_portal.app_url)

    # And the app role meets the same rules there as on the old primary
    probe_after = _probe(
        new_node.conninfo(user=db_roles.APP_ROLE, dbname=DBNAME), tenant_id=tenant_id
    )
    assert probe_before == probe_after
    assert probe_after["user"] == db_roles.APP_ROLE
    assert probe_after["in_recovery"] is False
    assert probe_after["privileged"] is False
    assert probe_after["tasks_unscoped"] == (0,)
    assert probe_after["tasks_scoped_nonzero"] is True
    assert probe_after["event_update"] == "refused"
    assert probe_after["definer_sees_tenant"] is True

    # And the old primary rejoins as a replica of the new one
    def rejoined() -> bool:
        for member in cluster.members():
            if member["name"] == old:
                return member["role"] in ("replica", "sync_standby") and member[
                    "state"
                ] in ("running", "streaming")
        return False

    cluster.wait_for(f"{old} to rejoin", rejoined, timeout=60)
    rejoined_at = time.time()
    listing = cluster.patronictl("list")
    assert old in listing
    with psycopg.connect(old_node.conninfo(dbname=DBNAME), autocommit=True) as replica:
        assert replica.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)

    gave_up = sum(1 for r in records if r.get("error") == "gave_up")
    print(
        f"\nHA failover: {AGENTS} agents, {DURATION_S:.0f} s, kill at "
        f"{killed_at - started:.1f} s; promoted {new} after "
        f"{promoted_at - killed_at:.1f} s; first write {first_write_s:.1f} s after "
        f"the kill; {len(acked)} actions acknowledged ({len(after_kill)} sent after "
        f"the kill), {gave_up} left in doubt, 0 lost, 0 duplicates; responses "
        f"{dict(statuses)}; old primary a replica again "
        f"{rejoined_at - killed_at:.1f} s after the kill"
    )
