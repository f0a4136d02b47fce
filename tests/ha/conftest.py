"""The HA tier: the portal on a Patroni cluster of its own (tests/support/ha.py).

``ha_portal`` starts etcd and two PostgreSQL nodes under Patroni (synchronous
replication), the first (the leader) on a machine of its own where this one can
make one (a network namespace reached over a veth pair, tests/support/netns.py;
``tests/ha/test_network_cut.py`` stops its network), makes the portal's database
there the way ``up`` does (roles, then ``migrate`` as the owner), seeds the demo tenant against the session's ticket desk,
and runs a real gunicorn whose ``DATABASE_URL`` names both nodes with
``target_session_attrs=read-write`` and whose reviewers' pages read on the standby
(``PORTAL_REPLICA_DATABASE_URL``, ``prefer-standby``). One cluster serves the whole
tier (package scope). The machine's PostgreSQL on 5432 is not used.

``ha_jobs`` (per test) adds a real Celery worker and beat on the same multi-host
URL, as the deployment runs them (deploy/portal-worker.service, portal-beat.service):
their jobs on a queue of the test's own and the outbox relay's events on an exchange
of its own, on the machine's RabbitMQ, with a quorum queue bound to that exchange to
take every event (tests/support/broker.py, ``EventQueue``).
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tasks import outbound
from tests.http.conftest import Server, start, stop
from tests.support import broker, ha, netns
from tests.support.broker import EventQueue
from tests.support.celery_worker import (
    RunningWorker,
    celery_beat_running,
    celery_worker_running,
)
from ticketdesk.harness import TicketDesk

MISSING = ha.missing_tools()
# Why the first node cannot have a network of its own here (None: it can).
NETNS_MISSING = netns.missing()
if MISSING and not os.environ.get("CI"):
    pytest.skip(
        "the HA tier needs " + ", ".join(MISSING) + " (.ci/run installs Debian's "
        "patroni and etcd-server)",
        allow_module_level=True,
    )

amqp_url = broker.amqp_url  # the shared fixture (tests/support/broker.py)

ISSUED_KEY = re.compile(r"issued a new API key for '[^']+': (agp_\S+)")
DBNAME = "portal_ha"


@pytest.fixture(scope="module", autouse=True)
def ha_tools_installed() -> None:
    """Under CI a missing tool fails each test here instead of skipping it."""
    if MISSING:
        pytest.fail(
            "missing for the HA tier: " + ", ".join(MISSING) + "; .ci/run installs "
            "them (apt-get install patroni etcd-server)"
        )


def replica_url(app_url: str) -> str:
    """The app role's multi-host URL, finding a standby instead of the primary."""
    return app_url.replace(
        "target_session_attrs=read-write", "target_session_attrs=prefer-standby"
    )


@dataclass
class HAPortal:
    cluster: ha.Cluster
    app_url: str
    api_key: str
    desk: TicketDesk
    web: Server


# One cluster for the whole tier (the failover, then the replica's reviewers):
# starting one costs more than either test's own work.
@pytest.fixture(scope="package")
def ha_portal(
    ticketdesk_server: TicketDesk, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HAPortal]:
    with ha.running_cluster(nodes=2, isolated=NETNS_MISSING is None) as cluster:
        app_url = ha.bootstrap_portal(cluster, dbname=DBNAME)
        allowed = outbound.host_port(ticketdesk_server.url)
        with ThreadPoolExecutor(max_workers=1) as background:
            # The seed runs while gunicorn starts.
            seeding = background.submit(
                ha.manage,
                cluster,
                "seed_demo",
                "--ticketdesk-url",
                ticketdesk_server.url,
                "--ticketdesk-keys",
                str(ticketdesk_server.keys_path),
                database_url=app_url,
                env={"PORTAL_OUTBOUND_ALLOWED_HOSTS": allowed},
            )
            log_path: Path = tmp_path_factory.mktemp("ha-gunicorn") / "server.log"
            web = start(
                debug=False,
                log_path=log_path,
                workers=int(os.environ.get("PORTAL_HA_WEB_WORKERS", "2")),
                env_extra={
                    "DATABASE_URL": app_url,
                    "PORTAL_OUTBOUND_ALLOWED_HOSTS": allowed,
                    "PORTAL_VAR_DIR": str(cluster.var_dir),
                    # Commits do not nudge the relay: beat's relay-outbox (every
                    # 5 s) is its one trigger, so rows sent after a failover
                    # prove that beat and the worker carry on (``ha_jobs``).
                    "PORTAL_RELAY_NUDGE": "0",
                    # The reviewers' pages read on a standby (portal/replica.py);
                    # libpq picks whichever node is one, the primary if none is.
                    "PORTAL_REPLICA_DATABASE_URL": replica_url(app_url),
                },
            )
            try:
                seeded = seeding.result()
            except BaseException:
                stop(web)
                raise
        found = ISSUED_KEY.search(seeded)
        assert found, seeded
        # Commits are on two nodes from here on.
        cluster.wait_for_sync_standby(cluster.nodes[1].name)
        try:
            yield HAPortal(
                cluster=cluster,
                app_url=app_url,
                api_key=found[1],
                desk=ticketdesk_server,
                web=web,
            )
        finally:
            stop(web)


@dataclass
class HAJobs:
    """A Celery worker and beat on the cluster, and what they publish."""

    queue: str
    exchange: str
    events: EventQueue
    worker: RunningWorker
    beat: RunningWorker


@pytest.fixture
def ha_jobs(
    ha_portal: HAPortal, amqp_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HAJobs]:
    """A worker (prefork, two processes, as the unit runs it) and beat, both given
    the multi-host ``DATABASE_URL`` (``target_session_attrs=read-write``); every
    event the relay publishes lands in ``events``, declared before either starts.
    The queue, its exchange and the job queue are deleted afterwards."""
    suffix = uuid.uuid4().hex[:10]
    queue = f"portal.jobs.ha-{suffix}"
    exchange = f"portal.events.ha-{suffix}"
    events = EventQueue(url=amqp_url, exchange=exchange).declare()
    env = ha.portal_env(
        ha_portal.cluster,
        database_url=ha_portal.app_url,
        CELERY_BROKER_URL=amqp_url,
        PORTAL_CELERY_QUEUE=queue,
        PORTAL_EVENTS_BROKER_URL=amqp_url,
        PORTAL_EVENTS_EXCHANGE=exchange,
        PORTAL_OUTBOUND_ALLOWED_HOSTS=outbound.host_port(ha_portal.desk.url),
    )
    schedule = tmp_path_factory.mktemp("ha-beat") / "celerybeat-schedule"
    try:
        with (
            celery_worker_running(
                queue=queue,
                env=env,
                pool=("--pool", "prefork", "--concurrency", "2"),
                name="ha-worker",
            ) as worker,
            celery_beat_running(queue=queue, env=env, schedule=schedule) as beat,
        ):
            yield HAJobs(
                queue=queue, exchange=exchange, events=events, worker=worker, beat=beat
            )
    finally:
        events.delete()
        broker.delete_exchange(amqp_url, exchange)
        broker.delete_queue(amqp_url, queue)
