"""The failover tests' run: agents under load, a fault on the primary, then what
must hold on the promoted node (issue 26 §1-2). ``tests/ha/test_failover.py`` kills
the primary's postmaster; ``tests/ha/test_network_cut.py`` stops its machine's
network. ``run_under_load`` is the one run both use.

Agents (separate processes, ``tests/ha/agent.py``) take governed actions through a
real gunicorn against the real ticket desk while the fault hits the primary.
Patroni promotes the synchronous standby; the portal's multi-host URL
(``target_session_attrs=read-write``) finds it by itself. Then, on the promoted
node: every action the API acknowledged is there with its task, events and outbox
rows; the desk made at most one ticket per key (its own count); ``verify_audit``
passes; the roles, row-level security and definer functions behave as they did on
the old primary; and the old primary rejoins as a replica (``pg_rewind``).

A real Celery worker and beat (``ha_jobs``), started before the fault on the same
multi-host URL, run the outbox relay as deployed: beat's ``relay-outbox`` every 5 s
(the web does not nudge it here). After the failover, with neither restarted: every
``audit_outbox`` row on the promoted node ends ``sent`` and every row's key (the
message id) is on the test's queue, duplicates counted, none lost; the relay and
beat's other jobs ran on the new primary (``portal_jobrun``, their own record of
each run); and a job queued after the failover ran there.

Sizes: ``PORTAL_HA_AGENTS`` agent processes (CI 2; the hand run 8). The fault
comes once each agent has had an action verified and ``PORTAL_HA_WARMUP_S`` more
seconds (CI 1) have passed; the load goes on ``PORTAL_HA_DURATION_S`` seconds
after the promotion (CI 5). The figures print with ``-s``; docs/scale-out.md has the
hand runs'.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from celery import Celery

from portal import db_roles
from tests.support import ha

from .conftest import DBNAME, HAJobs, HAPortal

REPO = Path(__file__).resolve().parents[2]
AGENTS = int(os.environ.get("PORTAL_HA_AGENTS", "2"))
WARMUP_S = float(os.environ.get("PORTAL_HA_WARMUP_S", "1"))
DURATION_S = float(os.environ.get("PORTAL_HA_DURATION_S", "5"))
# Agent processes start slowly on a loaded machine.
AGENTS_START_TIMEOUT_S = 120.0
# Patroni's TTL is 10 s; after a kill, promotion comes well inside it.
FAILOVER_BUDGET_S = 30.0
# Rows a relay run had claimed when the primary was lost stay leased on the promoted node
# until the lease lapses (PORTAL_OUTBOX_CLAIM_LEASE_S, 30 s), then beat's next run
# (5 s) publishes them again; a run that met the dead primary retries after backoff.
RELAY_SETTLE_S = 90.0
# A job the test queues after the failover: not in beat's schedule, so its record in
# portal_jobrun can come only from this sending.
QUEUED_JOB = "audit.jobs.checkpoint_tenant_job"
RELAY_JOB = "audit.jobs.relay_outbox_job"


def _send_job(jobs: HAJobs, amqp_url: str, name: str, **kwargs: Any) -> None:
    """Queue job ``name`` on the worker's queue, as the web sends one."""
    sender = Celery(set_as_current=False, broker=amqp_url)
    # The queue the worker declared is a quorum queue (config/settings.py).
    sender.conf.task_default_queue_type = "quorum"
    sender.conf.task_create_missing_queue_type = "quorum"
    try:
        sender.send_task(name, kwargs=kwargs, queue=jobs.queue)
    finally:
        sender.close()


def _outbox(conninfo: str) -> list[tuple[str, str, float | None, float]]:
    """Every outbox row of every tenant: (key, state, sent_at, created_at)."""
    with psycopg.connect(conninfo, autocommit=True) as admin:
        return [
            (key, state, sent.timestamp() if sent else None, created.timestamp())
            for key, state, sent, created in admin.execute(
                "SELECT key, state, sent_at, created_at FROM audit_outbox"
            )
        ]


def _job_runs(conninfo: str) -> dict[str, tuple[float, str]]:
    """portal_jobrun: each job's last run, name -> (finished_at, outcome)."""
    with psycopg.connect(conninfo, autocommit=True) as admin:
        rows: list[tuple[str, dt.datetime, str]] = admin.execute(
            "SELECT name, finished_at, outcome FROM portal_jobrun"
        ).fetchall()
    return {name: (finished.timestamp(), outcome) for name, finished, outcome in rows}


def _run_agents(
    portal: HAPortal, folder: Path, *, stop: Path, prefix: str
) -> list[subprocess.Popen[bytes]]:
    """``AGENTS`` agent processes named ``<prefix><n>``: each run's keys are its
    own (the tier's runs share one database, the desk forgets between them)."""
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
                f"{prefix}{index}",
                "--stop",
                str(stop),
                "--out",
                str(folder / f"agent{index}.jsonl"),
            ],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        for index in range(AGENTS)
    ]


def _records(folder: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in sorted(folder.glob("agent*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line]
    return rows


def _probe(conninfo: str, *, tenant_id: str, member: int) -> dict[str, Any]:
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
        # A definer function (the discovery role's) reads past row-level security:
        # a signed-in person's tenants, with no scope set. (Not the due-outbox one:
        # the relay running here leaves no row due.)
        tenants = app.execute(
            "SELECT * FROM portal_person_tenants(%s)", [member]
        ).fetchall()
        seen["definer_sees_tenant"] = any(str(r[0]) == tenant_id for r in tenants)
        # The partitions of the trail.
        seen["event_partitions"] = len(
            app.execute("SELECT * FROM audit_event_partitions()").fetchall()
        )
    return seen


@dataclass
class Run:
    """What one run under load saw (``time.time()`` moments)."""

    old: str
    new: str
    tenant_id: str
    records: list[dict[str, Any]]
    acked: list[dict[str, Any]]
    fault_at: float
    promoted_at: float
    first_write_s: float
    rejoined_at: float


def run_under_load(
    ha_portal: HAPortal,
    ha_jobs: HAJobs,
    amqp_url: str,
    folder: Path,
    *,
    fault: str,
    inject: Callable[[ha.Cluster, str], None],
    after_load: Callable[[str, str], None] | None = None,
    budget_s: float = FAILOVER_BUDGET_S,
) -> Run:
    """Agents under load, ``inject(cluster, leader)`` on the primary (``fault``
    names it in the report), and every check above; ``after_load(old, new)`` runs
    once the agents stopped, before the relay's and the rejoin's checks (a cut
    link is restored there). The first write after the fault must come within
    ``budget_s``."""
    cluster, desk = ha_portal.cluster, ha_portal.desk
    desk.reset()
    old = cluster.leader()
    assert old is not None
    old_node = cluster.node(old)
    admin_old = old_node.conninfo(dbname=DBNAME)
    with psycopg.connect(admin_old) as admin:
        row = admin.execute(
            "SELECT t.id, m.user_id FROM portal_tenant t "
            "JOIN portal_membership m ON m.tenant_id = t.id "
            "WHERE t.slug = 'demo' LIMIT 1"
        ).fetchone()
    assert row is not None
    tenant_id, member = str(row[0]), int(row[1])

    # Given agents taking actions through the API
    started = time.time()
    stop = folder / "stop"
    agents = _run_agents(ha_portal, folder, stop=stop, prefix=fault)
    # The checkpoint signer signs on the primary (again after the failover), while
    # the agents start.
    ha.manage(cluster, "checkpoint_audit", database_url=ha_portal.app_url)

    def each_agent_verified() -> bool:
        names = {
            r["key"].split("-")[1]
            for r in _records(folder)
            if r.get("outcome") == "verified"
        }
        return len(names) == AGENTS

    cluster.wait_for(
        "every agent's first action",
        each_agent_verified,
        timeout=AGENTS_START_TIMEOUT_S,
    )
    # The relay (beat's job on the worker) is at work before the fault: at CI's load
    # its first pass can come after the agents' first actions.
    cluster.wait_for(
        "the relay's first sent outbox row",
        lambda: any(
            sent is not None and created >= started
            for _, _, sent, created in _outbox(old_node.conninfo(dbname=DBNAME))
        ),
        timeout=AGENTS_START_TIMEOUT_S,
    )
    time.sleep(WARMUP_S)
    before = _records(folder)
    probe_before = _probe(
        old_node.conninfo(user=db_roles.APP_ROLE, dbname=DBNAME),
        tenant_id=tenant_id,
        member=member,
    )
    # When the fault hits the primary
    fault_at = time.time()
    inject(cluster, old)
    new = cluster.wait_for_leader(other_than=old)
    promoted_at = time.time()
    time.sleep(DURATION_S)

    # The load goes on until an action sent after the fault is acknowledged (the
    # agents may spend all of DURATION_S on keys the fault left in doubt), at most
    # until budget_s after the fault: the check below says if none was.
    def wrote_after_fault() -> bool:
        return any(
            r["status"] == 200
            and r.get("outcome") == "verified"
            and r["sent"] > fault_at
            for r in _records(folder)
        )

    with contextlib.suppress(RuntimeError):
        cluster.wait_for(
            "an action acknowledged after the fault",
            wrote_after_fault,
            timeout=max(0.0, fault_at + budget_s - time.time()),
        )
    stop.touch()
    for agent in agents:
        agent.wait(timeout=120)
    records = _records(folder)
    # A job queued once the load is over, on the promoted node's watch
    queued_at = time.time()
    _send_job(ha_jobs, amqp_url, QUEUED_JOB, tenant_id=tenant_id)
    if after_load is not None:
        after_load(old, new)

    # Then the load ran before the fault and the API answered cleanly throughout
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
    after_fault = [r for r in acked if r["sent"] > fault_at]
    assert after_fault, f"no write succeeded after the fault: {statuses}"
    first_write_s = min(r["answered"] for r in after_fault) - fault_at
    assert first_write_s < budget_s

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

    # And the relay, run by the worker and beat started before the fault, delivered
    # every outbox row: each ends sent on the promoted node (a row leased by a run
    # the fault cut short waits out its lease), and each key is on the queue
    new_conninfo = new_node.conninfo(dbname=DBNAME)
    cluster.wait_for(
        "every outbox row sent",
        lambda: all(state == "sent" for _, state, _, _ in _outbox(new_conninfo)),
        timeout=RELAY_SETTLE_S,
    )
    settled_at = time.time()
    # This run's rows: an earlier run of the tier sent its own to its own exchange
    # (rows one left unsent, this relay sends too: known, not required).
    outbox_rows = [row for row in _outbox(new_conninfo) if row[3] >= started]
    received = ha_jobs.events.drain(expected=len(outbox_rows), timeout=60)
    seen = Counter(message.message_id for message in received)
    keys = {key for key, _, _, _ in outbox_rows}
    # Read after the drain: a row written meanwhile (beat's jobs write too) may
    # have been published already.
    known = {key for key, _, _, _ in _outbox(new_conninfo)}
    assert not keys - set(seen), sorted(keys - set(seen))[:5]  # none lost
    assert not set(seen) - known, sorted(set(seen) - known)[:5]  # none unexpected
    relay_duplicates = sum(n - 1 for n in seen.values())
    # It ran before the fault, and after it on rows written only after it
    sent_times = [sent for _, _, sent, _ in outbox_rows if sent is not None]
    assert any(sent < fault_at for sent in sent_times)
    written_after = [row for row in outbox_rows if row[3] > fault_at]
    assert written_after, "no outbox row was written after the fault"
    first_relayed_s = min(sent for sent in sent_times if sent > fault_at) - fault_at

    # And the worker and beat carried on without a restart: beat's relay job ran on
    # the promoted node, and so did the job queued after the failover
    def ran_after(name: str, moment: float) -> bool:
        run = _job_runs(new_conninfo).get(name)
        return run is not None and run[0] > moment and run[1] == "success"

    cluster.wait_for(
        f"{RELAY_JOB} to run after the promotion",
        lambda: ran_after(RELAY_JOB, promoted_at),
        timeout=30,
    )
    cluster.wait_for(
        f"{QUEUED_JOB}, queued after the failover, to run",
        lambda: ran_after(QUEUED_JOB, queued_at),
        timeout=60,
    )
    assert ha_jobs.worker.process.poll() is None, ha_jobs.worker.output()[-3000:]
    assert ha_jobs.beat.process.poll() is None, ha_jobs.beat.output()[-3000:]

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
        new_node.conninfo(user=db_roles.APP_ROLE, dbname=DBNAME),
        tenant_id=tenant_id,
        member=member,
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

    cluster.wait_for(f"{old} to rejoin", rejoined, timeout=90)
    rejoined_at = time.time()
    listing = cluster.patronictl("list")
    assert old in listing
    with psycopg.connect(old_node.conninfo(dbname=DBNAME), autocommit=True) as replica:
        assert replica.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)

    gave_up = sum(1 for r in records if r.get("error") == "gave_up")
    print(
        f"\nHA failover ({fault}): {AGENTS} agents, {DURATION_S:.0f} s, fault at "
        f"{fault_at - started:.1f} s; promoted {new} after "
        f"{promoted_at - fault_at:.1f} s; first write {first_write_s:.1f} s after "
        f"the fault; {len(acked)} actions acknowledged ({len(after_fault)} sent after "
        f"the fault), {gave_up} left in doubt, 0 lost, 0 duplicates; responses "
        f"{dict(statuses)}; old primary a replica again "
        f"{rejoined_at - fault_at:.1f} s after the fault; relay (worker and beat "
        f"started before the fault): first row relayed {first_relayed_s:.1f} s after "
        f"the fault, all {len(outbox_rows)} outbox rows sent "
        f"{settled_at - fault_at:.1f} s after it ({len(written_after)} written "
        f"after it), {len(received)} messages received, {relay_duplicates} "
        f"duplicates, 0 lost"
    )
    return Run(
        old=old,
        new=new,
        tenant_id=tenant_id,
        records=records,
        acked=acked,
        fault_at=fault_at,
        promoted_at=promoted_at,
        first_write_s=first_write_s,
        rejoined_at=rejoined_at,
    )
