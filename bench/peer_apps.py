"""The peers' applications for bench/peers.py: Procrastinate's app, DBOS's workflow.

No Django here: the coordinator sets the peers' databases up before Django starts.
The peers themselves come with the ``bench`` extra and are imported on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

PROCRASTINATE_QUEUE: Final = "bench"


def procrastinate_app(conninfo: str, *, application_name: str = "bench") -> Any:
    import procrastinate

    app = procrastinate.App(
        # One connection per client process, as the services have: the clients
        # share the PostgreSQL cluster's connection slots with everything else.
        connector=procrastinate.PsycopgConnector(
            conninfo=conninfo,
            kwargs={"application_name": application_name},
            min_size=1,
            max_size=1,
        )
    )

    @app.task(name="bench_job", queue=PROCRASTINATE_QUEUE)
    def bench_job(n: int) -> int:
        return n

    return app


_DBOS: dict[str, Callable[[int], int]] = {}


def dbos_workflow(
    system_database_url: str, *, application_name: str = "bench"
) -> Callable[[int], int]:
    """Configure and launch DBOS once per process; its one-step workflow."""
    if "workflow" in _DBOS:
        return _DBOS["workflow"]
    from dbos import DBOS

    DBOS(
        config={
            "name": "bench-peers",
            "system_database_url": system_database_url,
            # One executor per client process: with the default one, each launch
            # would "recover" the workflows the other clients are running.
            "executor_id": application_name,
            # Its default pool holds up to 20 connections per process.
            "sys_db_pool_size": 2,
            "db_engine_kwargs": {
                "connect_args": {"application_name": application_name}
            },
        }
    )

    @DBOS.step()
    def bench_step(n: int) -> int:
        return n + 1

    @DBOS.workflow()
    def bench_workflow(n: int) -> int:
        return bench_step(n)

    DBOS.launch()
    _DBOS["workflow"] = bench_workflow
    return bench_workflow
