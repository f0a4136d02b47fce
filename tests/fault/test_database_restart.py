"""R13 DB-CHAOS: PostgreSQL restarts while the workers run.

The machine's cluster is restarted (fast shutdown: every session ends) once, when
half of the operations have been verified. Jobs caught mid-way fail on their
broken connection; the next job reconnects (``CONN_HEALTH_CHECKS``), and the settle
job finishes what the failed ones left ``reserved`` or ``executing``. The same
checks as R12: nothing lost, nothing duplicated, every log agrees with its row.

This is the one test that restarts PostgreSQL; it disturbs every session on the
machine for a second or two. Sizes: ``PORTAL_CHAOS_DB_OPS`` (200),
``PORTAL_CHAOS_DB_WORKERS`` (2), ``PORTAL_CHAOS_DB_RESTARTS`` (1).
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.chaos import restart_database

from .conftest import World
from .harness import (
    Nemesis,
    WorkerPool,
    env_float,
    env_int,
    first_verified_after,
    operation_states,
    retrying,
    running,
    write_report,
)
from .scenario import Run

OPS = env_int("PORTAL_CHAOS_DB_OPS", 200)
WORKERS = env_int("PORTAL_CHAOS_DB_WORKERS", 2)
RESTARTS = env_int("PORTAL_CHAOS_DB_RESTARTS", 1)
DRAIN_S = env_float("PORTAL_CHAOS_DRAIN_S", 120 + OPS * 0.3)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(int(300 + OPS * 0.6 + DRAIN_S)),
]


def test_workers_survive_a_database_restart_with_nothing_lost_or_duplicated(
    world: World,
    make_workers: Callable[[int], WorkerPool],
    chaos_queue: str,
    amqp_url: str,
    request: pytest.FixtureRequest,
):
    run = Run(
        world=world,
        pool=make_workers(WORKERS),
        queue=chaos_queue,
        amqp_url=amqp_url,
        ops=OPS,
        drain_s=DRAIN_S,
    )
    run.plan()
    run.start_workers()
    restarts: list[dict[str, Any]] = []
    # Restart when 1/(R+1), 2/(R+1), ... of the operations have been verified.
    thresholds = [OPS * (i + 1) // (RESTARTS + 1) for i in range(RESTARTS)]

    def maybe_restart() -> None:
        if not thresholds:
            return
        verified = operation_states(world.tenant.pk)["verified"]
        if verified < thresholds[0]:
            return
        thresholds.pop(0)
        began = time.monotonic()
        how = restart_database()
        restarts.append(
            {
                "how": how,
                "at_s": run.clock.mark(f"restart_{len(restarts) + 1}"),
                "verified_before": verified,
                "restart_took_s": round(time.monotonic() - began, 2),
                "_up_at": time.time(),
            }
        )

    # No kills here; the supervisor only restarts a worker that gives up.
    supervisor = Nemesis(run.pool, random.Random(0), main_share=0, strike=False)
    with running(supervisor):
        run.submit()
        run.settle(between=maybe_restart)
    verdict, figures = run.verdict()
    for item in restarts:
        # Recovery: from the server accepting connections again to the next
        # operation verified (by a worker or the settle job).
        item["recovered_after_s"] = retrying(
            functools.partial(first_verified_after, world.tenant.pk, item.pop("_up_at"))
        )
    figures = {
        "test": request.node.name,
        "restarts": restarts,
        "worker_self_exits": len(supervisor.self_exits),
        **figures,
    }
    write_report(request.node.name, figures)
    assert len(restarts) == RESTARTS, "the run settled before every restart happened"
    assert verdict.problems() == {}
