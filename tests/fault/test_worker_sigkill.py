"""R12 WORKER-SIGKILL: random SIGKILLs of pool children and worker main processes.

Each operation is queued through the gateway (every check commits), its
``run_operation_job`` goes to real prefork workers (``acks_late``,
``reject_on_worker_lost``, prefetch 1), and a nemesis SIGKILLs a pool child or a
worker main process every U(0.2, 1.0) s until every operation has settled. The
redeliveries and half-done runs this causes must be harmless: the ticket desk counts
exactly one ticket per key, every operation ends ``verified``, and each operation's
events replay to its final state.

Sizes (docs/chaos.md): ``PORTAL_CHAOS_OPS`` (300 in CI; 1,000 by hand), ``PORTAL_CHAOS_WORKERS``
(4), ``PORTAL_CHAOS_SEED`` (random, reported), ``PORTAL_CHAOS_MAIN_SHARE`` (the share
of kills aimed at a main process, 0.3), ``PORTAL_CHAOS_RATE`` (submissions per
second; 0, the default, submits as fast as the test process can),
``PORTAL_CHAOS_DRAIN_S`` (how long the operations may take to settle, counted from
the first submission).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from .conftest import World
from .harness import (
    Nemesis,
    WorkerPool,
    env_float,
    env_int,
    running,
    write_report,
)
from .scenario import Run, nemesis_figures

# The CI size: 300 operations take about a minute and a half and still draw dozens of
# kills; the hand size is 1,000 and more (docs/chaos.md, "Sizes and knobs").
OPS = env_int("PORTAL_CHAOS_OPS", 300)
WORKERS = env_int("PORTAL_CHAOS_WORKERS", 4)
SEED = env_int("PORTAL_CHAOS_SEED", random.SystemRandom().randrange(2**32))
MAIN_SHARE = env_float("PORTAL_CHAOS_MAIN_SHARE", 0.3)
DRAIN_S = env_float("PORTAL_CHAOS_DRAIN_S", 120 + OPS * 0.6)
RATE = env_float("PORTAL_CHAOS_RATE", 0.0)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(int(300 + OPS * 0.6 + DRAIN_S)),
]


def test_sigkilled_workers_duplicate_nothing_and_lose_nothing(
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
        rate=RATE,
    )
    run.plan()
    run.start_workers()
    nemesis = Nemesis(run.pool, random.Random(SEED), main_share=MAIN_SHARE)
    with running(nemesis):
        run.submit()
        run.settle()
    run.clock.mark("nemesis_stopped")
    verdict, figures = run.verdict()
    figures = {
        "test": request.node.name,
        "seed": SEED,
        "main_share": MAIN_SHARE,
        "submit_rate": RATE or "as fast as possible",
        **nemesis_figures(nemesis, run.clock),
        **figures,
    }
    write_report(request.node.name, figures)
    assert figures["kills_total"] > 0, "the nemesis never struck"
    assert verdict.problems() == {}
