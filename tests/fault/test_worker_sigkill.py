"""R12 WORKER-SIGKILL: random SIGKILLs of pool children and worker main processes,
and SIGSTOP pauses of whole worker nodes.

Each operation is queued through the gateway (every check commits), its
``run_operation_job`` goes to real prefork workers (``acks_late``,
``reject_on_worker_lost``, prefetch 1), and every U(0.2, 1.0) s until every
operation has settled a nemesis strikes a ready node: it SIGKILLs a pool child or
the worker main process, or (a share of the strikes) pauses the node's process group
with SIGSTOP for U(4, 8) s, past the 3 s execution deadline, then SIGCONTs it. While a
node is paused the settle job settles its calls in flight by the desk's receipt; when
it resumes, its record of the call is refused (``StaleState``). The redeliveries,
half-done runs and late resumptions this causes must be harmless: the ticket desk
counts exactly one ticket per key, every operation ends ``verified``, and each
operation's events replay to its final state.

Sizes (docs/chaos.md): ``PORTAL_CHAOS_OPS`` (300 in CI; 1,000 by hand), ``PORTAL_CHAOS_WORKERS``
(4), ``PORTAL_CHAOS_SEED`` (random, reported), ``PORTAL_CHAOS_MAIN_SHARE`` (the share
of kills aimed at a main process, 0.3), ``PORTAL_CHAOS_PAUSE_SHARE`` (the share of
strikes that pause a node instead of killing, 0.1; 0 turns pauses off),
``PORTAL_CHAOS_RATE`` (submissions per
second; 0, the default, submits as fast as the test process can),
``PORTAL_CHAOS_DRAIN_S`` (how long the operations may take to settle, counted from
the first submission).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from .conftest import EXECUTION_DEADLINE_S, World
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
PAUSE_SHARE = env_float("PORTAL_CHAOS_PAUSE_SHARE", 0.1)
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
    nemesis = Nemesis(
        run.pool,
        random.Random(SEED),
        main_share=MAIN_SHARE,
        pause_share=PAUSE_SHARE,
        # Past the execution deadline: the settle job acts while the node sleeps.
        pause_for=(EXECUTION_DEADLINE_S + 1.0, EXECUTION_DEADLINE_S + 5.0),
    )
    with running(nemesis):
        run.submit()
        run.settle()
    run.clock.mark("nemesis_stopped")
    verdict, figures = run.verdict()
    figures = {
        "test": request.node.name,
        "seed": SEED,
        "main_share": MAIN_SHARE,
        "pause_share": PAUSE_SHARE,
        "submit_rate": RATE or "as fast as possible",
        **nemesis_figures(nemesis, run.clock),
        **figures,
    }
    write_report(request.node.name, figures)
    assert figures["kills_total"] > 0, "the nemesis never struck"
    if PAUSE_SHARE > 0:
        assert figures["pauses"] > 0, "the nemesis never paused a node"
    assert verdict.problems() == {}
