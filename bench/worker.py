"""One benchmark client: a separate process with its own database connections.

The coordinator starts the largest number of clients once (spawn) and sends each run
to the first ``clients`` of them. A client prepares (pool, warm-up), waits on the
run's barrier with the others and the coordinator, then loops for the run's duration,
timing every operation. Refilling an exhausted pool is not timed: it pauses the
client's clock and moves its deadline.
"""

from __future__ import annotations

import os
import time
import traceback
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from typing import TYPE_CHECKING

from .spec import ClientResult, RunSpec, runner_flavour

if TYPE_CHECKING:
    from .workloads import Runner

BARRIER_TIMEOUT_S = 120.0


def _timed_loop(
    runner: Runner, duration_s: float, pool_empty: type[Exception]
) -> tuple[list[int], float, float, int]:
    """(latencies in ns, running seconds, client CPU seconds, refills)."""
    latencies: list[int] = []
    append = latencies.append
    clock = time.perf_counter_ns
    cpu = time.process_time_ns
    cpu_start = cpu()
    start = clock()
    deadline = start + int(duration_s * 1e9)
    paused = cpu_paused = refills = 0
    while True:
        began = clock()
        if began >= deadline:
            break
        try:
            runner.op()
        except pool_empty:
            cpu_began = cpu()
            runner.refill()
            refills += 1
            cpu_paused += cpu() - cpu_began
            pause = clock() - began
            deadline += pause
            paused += pause
            continue
        append(clock() - began)
    elapsed = (clock() - start - paused) / 1e9
    return latencies, elapsed, (cpu() - cpu_start - cpu_paused) / 1e9, refills


def worker_main(
    index: int,
    pipe: Connection,
    barriers: dict[int, Barrier],
    database_url: str,
) -> None:
    """Serve runs from the coordinator until it sends ``None``."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ.setdefault("PORTAL_DEV_MODE", "1")  # benchmarks run the dev setup
    os.environ["DATABASE_URL"] = database_url
    import django

    django.setup()
    from django.db import connection

    from portal import scope

    from . import peer_runners, workloads

    ctx = workloads.WorkerContext(
        index=index, raw=workloads.connect_raw(database_url), database_url=database_url
    )
    what_ifs = workloads.WhatIfSwitch()
    runners = {**workloads.RUNNERS, **peer_runners.RUNNERS}
    connection.ensure_connection()
    pipe.send(("ready", index))
    while (spec := pipe.recv()) is not None:
        assert isinstance(spec, RunSpec)
        barrier = barriers[spec.clients]
        try:
            # As an API request does: the services work in the tenant's scope,
            # one set_config per transaction (docs/database-roles.md).
            with scope.tenant_scope([spec.tenant_id]):
                ctx.enter_tenant(spec.tenant_id)
                what_ifs.apply(spec.flavour)
                flavour = runner_flavour(spec.flavour)
                runner = runners[spec.workload, flavour](spec, ctx)
                warmed = 0
                while warmed < spec.warmup:
                    try:
                        runner.op()
                        warmed += 1
                    except workloads.PoolEmpty:
                        runner.refill()
                server_before = ctx.server_cpu_s()
                barrier.wait(BARRIER_TIMEOUT_S)
                latencies, elapsed, cpu_s, refills = _timed_loop(
                    runner, spec.duration_s, workloads.PoolEmpty
                )
                server_cpu_s = ctx.server_cpu_s() - server_before
        except BaseException:  # noqa: BLE001
            barrier.abort()
            pipe.send(("error", f"client {index}:\n{traceback.format_exc()}"))
            break
        pipe.send(
            (
                "ok",
                ClientResult(
                    index=index,
                    ops=len(latencies),
                    warmup_ops=warmed,
                    elapsed_s=elapsed,
                    cpu_s=cpu_s,
                    server_cpu_s=server_cpu_s,
                    refills=refills,
                    latencies_ns=latencies,
                ),
            )
        )
    peer_runners.close()
    ctx.close()
    connection.close()
