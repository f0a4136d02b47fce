"""One client of ``bench/api.py``: a separate process, HTTP client and psycopg.

The coordinator starts the largest number of clients once (spawn) and sends each run
to the first ``clients`` of them, as ``bench/worker.py`` does. A client prepares its
runner (tasks, warm-up), waits on the run's barrier with the others and the
coordinator, then loops for the run's duration, timing every request. A request that
is not answered 2xx is counted as an error, not timed; an exhausted task pool is
refilled untimed (the clock pauses and the deadline moves).

The *api* flavour posts to the running server through one keep-alive
``httpx.Client`` per process, as agents hold their connections; the *close* flavour
sends the same requests with ``Connection: close``, a new TCP connection each (a
second row; gunicorn's sync workers close every connection anyway, so the two
differ only under a server that keeps them); the *raw* flavour is
``bench/workloads.py``'s raw psycopg runner for the same workload (the services'
own statements, same parameters, one transaction).
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from typing import TYPE_CHECKING, Any, Final, Protocol

from .spec import ClientResult, RunSpec
from .worker import BARRIER_TIMEOUT_S

if TYPE_CHECKING:
    import httpx

    from .workloads import WorkerContext

WORKLOADS: Final = ("reservation", "transition")
# Raw first, so the API run of a pair is never the one on the colder cache.
FLAVOURS: Final = ("raw", "api", "close")
HTTP_FLAVOURS: Final = ("api", "close")
HTTP_TIMEOUT_S: Final = 30.0
# How many distinct failures a client reports (with their counts).
FAILURE_SAMPLES: Final = 5


@dataclass(frozen=True, kw_only=True)
class ApiRunSpec(RunSpec):
    """A ``RunSpec`` with what the API flavour needs: where, and whose key."""

    base_url: str
    api_key: str = field(repr=False)


@dataclass(frozen=True, kw_only=True)
class ApiClientResult:
    result: ClientResult  # ops and latencies count 2xx answers only
    errors: int
    failures: dict[str, int]  # "409 STALE_STATE" -> count


class ApiRunner(Protocol):
    def op(self) -> bool | None: ...

    def refill(self) -> None: ...


@dataclass(kw_only=True)
class ClientContext:
    """What a client process keeps across runs."""

    worker: WorkerContext
    http: httpx.Client
    failures: Counter[str] = field(default_factory=Counter)

    def answered(self, response: httpx.Response) -> bool:
        """True for a 2xx answer; otherwise record why and return False."""
        if response.is_success:
            return True
        try:
            code = response.json().get("code", "")
        except ValueError:
            code = ""
        self.failures[f"{response.status_code} {code}".strip()] += 1
        return False

    def post(
        self, path: str, *, key: str, lease_token: int, body: Any, close: bool = False
    ) -> bool:
        """POST ``body``; ``close`` asks for ``Connection: close`` (a new TCP
        connection for the next request)."""
        headers = {"Authorization": f"Bearer {key}", "Lease-Token": str(lease_token)}
        if close:
            headers["Connection"] = "close"
        try:
            response = self.http.post(path, json=body, headers=headers)
        except Exception as exc:  # a transport error is one failed request  # noqa: BLE001
            self.failures[type(exc).__name__] += 1
            return False
        return self.answered(response)


def _api_runners() -> dict[tuple[str, str], Callable[[ApiRunSpec, Any], ApiRunner]]:
    """The runners; built after ``django.setup()``, which ``workloads`` needs."""
    from . import workloads
    from .workloads import RESERVATION_ACTION, RESERVATION_INPUT, RESERVATION_TARGET

    class TransitionApi(workloads._LeasedPool):
        """POST /tasks/{id}/transitions: one of the client's leased tasks each."""

        def __init__(self, spec: ApiRunSpec, ctx: ClientContext) -> None:
            super().__init__(spec, ctx.worker)
            self.client = ctx
            self.key = spec.api_key
            self.close = spec.flavour == "close"

        def op(self) -> bool:
            return self.client.post(
                f"/api/v1/tasks/{self.next_task()}/transitions",
                key=self.key,
                lease_token=1,
                body={"to": "succeeded", "expected_state_version": 1},
                close=self.close,
            )

    class ReservationApi(workloads._Reservation):
        """POST /tasks/{id}/operations: a new key on the client's leased task."""

        def __init__(self, spec: ApiRunSpec, ctx: ClientContext) -> None:
            super().__init__(spec, ctx.worker)
            self.client = ctx
            self.key = spec.api_key
            self.close = spec.flavour == "close"

        def op(self) -> bool:
            return self.client.post(
                f"/api/v1/tasks/{self.task_id}/operations",
                key=self.key,
                lease_token=1,
                body={
                    "idempotency_key": self.next_key(),
                    "action": RESERVATION_ACTION,
                    "target": RESERVATION_TARGET,
                    "input": RESERVATION_INPUT,
                },
                close=self.close,
            )

    def raw(workload: str) -> Callable[[ApiRunSpec, Any], ApiRunner]:
        runner = workloads.RUNNERS[workload, "raw"]
        return lambda spec, ctx: runner(spec, ctx.worker)

    return {
        ("transition", "api"): TransitionApi,
        ("transition", "close"): TransitionApi,
        ("transition", "raw"): raw("transition"),
        ("reservation", "api"): ReservationApi,
        ("reservation", "close"): ReservationApi,
        ("reservation", "raw"): raw("reservation"),
    }


@dataclass(frozen=True, kw_only=True)
class _Loop:
    latencies_ns: list[int]
    elapsed_s: float
    cpu_s: float
    refills: int
    errors: int


def _timed_loop(
    runner: ApiRunner, duration_s: float, pool_empty: type[Exception]
) -> _Loop:
    """``bench/worker.py``'s loop, except that failures are counted, not timed."""
    latencies: list[int] = []
    append = latencies.append
    clock = time.perf_counter_ns
    cpu = time.process_time_ns
    cpu_start = cpu()
    start = clock()
    deadline = start + int(duration_s * 1e9)
    paused = cpu_paused = refills = errors = 0
    while True:
        began = clock()
        if began >= deadline:
            break
        try:
            ok = runner.op()
        except pool_empty:
            cpu_began = cpu()
            runner.refill()
            refills += 1
            cpu_paused += cpu() - cpu_began
            pause = clock() - began
            deadline += pause
            paused += pause
            continue
        if ok is False:
            errors += 1
        else:
            append(clock() - began)
    return _Loop(
        latencies_ns=latencies,
        elapsed_s=(clock() - start - paused) / 1e9,
        cpu_s=(cpu() - cpu_start - cpu_paused) / 1e9,
        refills=refills,
        errors=errors,
    )


def quiet_http_logs() -> None:
    """No INFO line per request: Django's logging config sends INFO to stderr."""
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)


def client_main(
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
    import httpx

    quiet_http_logs()
    from django.db import connection

    from . import workloads

    runners = _api_runners()
    ctx: ClientContext | None = None
    raw = workloads.connect_raw(database_url)
    worker = workloads.WorkerContext(index=index, raw=raw, database_url=database_url)
    pipe.send(("ready", index))
    while (spec := pipe.recv()) is not None:
        assert isinstance(spec, ApiRunSpec)
        barrier = barriers[spec.clients]
        try:
            if ctx is None:
                ctx = ClientContext(
                    worker=worker,
                    http=httpx.Client(base_url=spec.base_url, timeout=HTTP_TIMEOUT_S),
                )
            ctx.failures.clear()
            runner = runners[spec.workload, spec.flavour](spec, ctx)
            # Django only looked the tenant up (and the grant statement): let go.
            connection.close()
            warmed = 0
            while warmed < spec.warmup:
                try:
                    if runner.op() is False:
                        raise RuntimeError(f"warm-up request failed: {ctx.failures}")
                    warmed += 1
                except workloads.PoolEmpty:
                    runner.refill()
            barrier.wait(BARRIER_TIMEOUT_S)
            loop = _timed_loop(runner, spec.duration_s, workloads.PoolEmpty)
        except BaseException:  # noqa: BLE001
            barrier.abort()
            pipe.send(("error", f"client {index}:\n{traceback.format_exc()}"))
            break
        pipe.send(
            (
                "ok",
                ApiClientResult(
                    result=ClientResult(
                        index=index,
                        ops=len(loop.latencies_ns),
                        warmup_ops=warmed,
                        elapsed_s=loop.elapsed_s,
                        cpu_s=loop.cpu_s,
                        server_cpu_s=0.0,  # measured by the coordinator, per run
                        refills=loop.refills,
                        latencies_ns=loop.latencies_ns,
                    ),
                    errors=loop.errors,
                    failures=dict(ctx.failures.most_common(FAILURE_SAMPLES)),
                ),
            )
        )
    if ctx is not None:
        ctx.http.close()
    worker.close()
    connection.close()
