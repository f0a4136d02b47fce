"""Stop the primary's machine's network under load: nothing acknowledged is lost,
nothing done twice, and the isolated primary acknowledged nothing (issue 26 §2, the
second run).

The tier's first node (its Patroni and PostgreSQL) runs in a network namespace of
its own, reached over a veth pair (tests/support/netns.py; ``tests/ha/conftest.py``); etcd and
the second node listen on this side's end. The test makes that node the leader
(a switchover, if the SIGKILL run left the other one leading), runs the agents and
then sets the namespace's end of the pair down: its machine's network stops. Nothing
tells the others: what they send it is dropped without an answer.

Expected, and checked:

- the leader key lapses (TTL 10 s), Patroni promotes the synchronous standby, and
  every check of the SIGKILL run holds on it (``tests/ha/failover.py``: every
  acknowledged action there with its events and outbox rows, no ticket twice by the
  desk's own count, the relay delivers every outbox row, ``verify_audit`` passes);
- requests on the web's open connections to the isolated primary do not hang: the
  URL's libpq keepalives and ``tcp_user_timeout`` (``ha.LINK_OPTIONS``) give them up
  after seconds and the request answers ``503 DATABASE_UNAVAILABLE``; no agent's
  call waits anywhere near its own 30 s timeout;
- the isolated primary demotes itself (it cannot renew its leader key): Patroni says
  so in its log and its PostgreSQL comes back read-only, seen over its Unix socket
  while its network is still down;
- under synchronous replication it acknowledged nothing alone: whatever it committed
  locally while waiting for the standby (read there while isolated) differs from
  the promoted node's, and no agent was told it happened;
- once the link is up again it rejoins as a replica (``pg_rewind``) and those local
  commits are gone from it.

The figures print with ``-s``; docs/scale-out.md has them.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support import ha, netns

from .conftest import DBNAME, NETNS_MISSING, HAJobs, HAPortal
from .failover import AGENTS, DURATION_S, run_under_load

pytestmark = pytest.mark.slow

# The promoted node is found once the leader key lapses (TTL 10 s); a new
# connection then still tries the silent first host of the URL before the second
# (connect_timeout 5 s, or the kernel's "no route to host" sooner).
CUT_BUDGET_S = 45.0
# A request that met the cut gives its connection up after tcp_user_timeout and the
# keepalives (about 5 s), a new connection waits at most connect_timeout (5 s) on
# each host: well under the agents' own 30 s, and this says "did not hang".
HANG_BUDGET_S = 20.0
# The isolated primary's shutdown waits for its WAL sender, whose standby is gone:
# it ends after wal_sender_timeout (20 s in the test cluster, 60 s deployed).
DEMOTED_TIMEOUT_S = 150.0
DEMOTING = "demoting self because DCS is not accessible"
OPERATIONS = (
    "SELECT idempotency_key, id::text, state FROM tasks_operation WHERE tenant_id = %s"
)


def _operations(conninfo: str, tenant_id: str) -> dict[str, tuple[str, str]]:
    with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as admin:
        return {
            key: (op_id, state)
            for key, op_id, state in admin.execute(OPERATIONS, [tenant_id])
        }


def _tenant_id(node: ha.Node) -> str:
    with psycopg.connect(node.conninfo(dbname=DBNAME), autocommit=True) as admin:
        row = admin.execute("SELECT id::text FROM portal_tenant WHERE slug = 'demo'")
        found = row.fetchone()
    assert found is not None
    return str(found[0])


@dataclass
class Isolation:
    """What the isolated node did, watched over its Unix socket from the cut on."""

    node: ha.Node
    cut_at: float = 0.0
    demote_logged_at: float | None = None
    shutting_down_at: float | None = None
    read_only_at: float | None = None
    # Its operations while isolated and read-only: key -> (id, state).
    operations: dict[str, tuple[str, str]] = field(default_factory=dict)
    restored_at: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)

    def watch(self) -> None:
        """Poll until its PostgreSQL answers read-only (or ``done``)."""
        log_seen = len(self.node.log())
        while not self.done.is_set():
            now = time.time()
            if self.demote_logged_at is None and DEMOTING in self.node.log()[log_seen:]:
                self.demote_logged_at = now
            try:
                with psycopg.connect(
                    self.node.conninfo(dbname=DBNAME, socket=True),
                    autocommit=True,
                    connect_timeout=2,
                ) as conn:
                    row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
                    if row == (True,):
                        self.read_only_at = now
                        return
            except psycopg.OperationalError as error:
                if "shutting down" in str(error) and self.shutting_down_at is None:
                    self.shutting_down_at = now
                self.errors[-1:] = [str(error)[:300]]
            time.sleep(0.2)


def _make_leader(cluster: ha.Cluster, name: str) -> None:
    """``name`` leads, the other node its synchronous standby."""
    other = next(node.name for node in cluster.nodes if node.name != name)
    leader = cluster.wait_for_leader()
    if leader != name:
        cluster.wait_for_sync_standby(name)
        cluster.patronictl(
            "switchover", "--leader", leader, "--candidate", name, "--force"
        )
        cluster.wait_for(f"{name} to lead", lambda: cluster.leader() == name)
    cluster.wait_for_sync_standby(other)


@pytest.mark.timeout(600)
def test_cutting_the_primarys_network_under_load_loses_nothing_and_it_acknowledged_nothing(
    ha_portal: HAPortal, ha_jobs: HAJobs, amqp_url: str, tmp_path: Path
) -> None:
    # (the tier's cluster is isolated exactly when a namespace can be made here)
    netns.require()
    assert NETNS_MISSING is None
    cluster = ha_portal.cluster
    assert cluster.link is not None
    isolated = next(node for node in cluster.nodes if node.netns is not None)
    # Given the node on a machine of its own leads, the other its synchronous standby
    _make_leader(cluster, isolated.name)
    tenant_id = _tenant_id(isolated)
    isolation = Isolation(node=isolated)
    watcher = threading.Thread(target=isolation.watch, daemon=True)

    def cut(cluster: ha.Cluster, leader: str) -> None:
        assert leader == isolated.name
        isolation.cut_at = time.time()
        cluster.cut(leader)
        watcher.start()

    def read_then_restore(old: str, new: str) -> None:
        # Then, still cut off, the isolated primary demoted itself
        watcher.join(timeout=DEMOTED_TIMEOUT_S)
        isolation.done.set()
        assert isolation.read_only_at is not None, (
            f"{old} not read-only {DEMOTED_TIMEOUT_S:.0f} s after the cut: "
            f"{isolation.errors}\n{isolated.log()[-4000:]}"
        )
        assert isolation.demote_logged_at is not None, isolated.log()[-4000:]
        assert cluster.cut_nodes == {old}
        isolation.operations = _operations(
            isolated.conninfo(dbname=DBNAME, socket=True), tenant_id
        )
        # When its link is up again
        cluster.restore(old)
        isolation.restored_at = time.time()

    # When its network stops mid-load (and comes back once the load is over)
    run = run_under_load(
        ha_portal,
        ha_jobs,
        amqp_url,
        tmp_path,
        fault="cut",
        inject=cut,
        after_load=read_then_restore,
        budget_s=CUT_BUDGET_S,
    )

    # Then no request hung on the web's connections to the isolated primary
    records, cut_at = run.records, run.fault_at
    waits = [r["answered"] - r["sent"] for r in records]
    hung = [r for r in records if r["answered"] - r["sent"] >= HANG_BUDGET_S]
    assert not hung, hung[:5]
    met_cut = [r for r in records if r["sent"] < cut_at < r["answered"]]
    during = [r for r in records if cut_at <= r["sent"] < run.promoted_at]

    def seen(rows: list[dict[str, Any]]) -> dict[str, int]:
        return dict(Counter(str(r["status"] or r.get("error")) for r in rows))

    # And what it committed alone, waiting for its standby, nobody was told of
    new_node = cluster.node(run.new)
    on_new = _operations(new_node.conninfo(dbname=DBNAME), tenant_id)
    alone = {
        key: value
        for key, value in isolation.operations.items()
        if on_new.get(key) != value
    }
    told = {(r["key"], r["operation_id"]) for r in run.acked}
    assert not [
        key
        for key, (op_id, state) in alone.items()
        if state == "verified" and (key, op_id) in told
    ], (alone, told)
    # And after its rejoin (pg_rewind) it has the promoted node's, not its own
    old_conninfo = isolated.conninfo(dbname=DBNAME)
    cluster.wait_for(
        f"{run.old} to replay the promoted node's operations",
        lambda: all(
            _operations(old_conninfo, tenant_id).get(key) == on_new.get(key)
            for key in alone
        ),
        timeout=60,
    )
    # What the agents saw of those keys
    saw_alone = seen([r for r in records if r["key"] in alone])

    def since_cut(moment: float | None) -> str:
        return "-" if moment is None else f"{moment - isolation.cut_at:.1f} s"

    print(
        f"\nHA network cut: {AGENTS} agents, {DURATION_S:.0f} s after the promotion; "
        f"promoted {run.new} {run.promoted_at - cut_at:.1f} s after the cut; first "
        f"write {run.first_write_s:.1f} s after it; {len(run.acked)} acknowledged; "
        f"requests in flight at the cut {seen(met_cut)}, sent before the promotion "
        f"{seen(during)}, longest answer {max(waits):.1f} s; isolated primary: "
        f"Patroni demoting {since_cut(isolation.demote_logged_at)}, shutting down "
        f"{since_cut(isolation.shutting_down_at)}, read-only "
        f"{since_cut(isolation.read_only_at)} after the cut; committed alone "
        f"{len(alone)} ({sorted(alone.values(), key=str)[:5]}), of which the agents "
        f"saw {saw_alone}; link restored {since_cut(isolation.restored_at)}, a "
        f"replica again {since_cut(run.rejoined_at)} after the cut"
    )
