"""Where one API request's server CPU goes: the WSGI application, in one process.

    .venv/bin/python bench/profile_request.py [--workload reservation] [--requests 2000]
        [--rounds 5] [--profile] [--top 40] [--sort tottime]
        [--database-url postgres://.../portal_bench_profile_request]

Drops, creates and migrates its own database (the name must contain "bench"), makes
an agent with a key and a grant and leased tasks, as ``bench/api.py`` does, and then
calls ``config.wsgi.application`` (the whole stack gunicorn's worker calls: the
problem guard, OpenTelemetry's Django middleware, every middleware, DRF, the view,
the service) with the environ of a keep-alive ``POST`` like ``bench/api.py``'s
clients send. Prints the process CPU and the wall time per request (best and median
of ``--rounds`` rounds; wall includes waiting on PostgreSQL, the CPU does not), and
with ``--profile`` a cProfile of one more round. What this leaves out of gunicorn's
own per-request CPU: reading the request from the socket, parsing its head, and
writing the answer (``bench/api.py`` measures the whole server).
"""

from __future__ import annotations

import argparse
import atexit
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.service_layer import recreate_database  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/portal_bench_profile_request"
WARMUP = 50


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/profile_request.py", description=__doc__
    )
    parser.add_argument(
        "--workload", choices=("reservation", "transition"), default="reservation"
    )
    parser.add_argument("--requests", type=int, default=1000, help="per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="cProfile one round")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--sort", default="tottime", help="pstats sort key")
    parser.add_argument(
        "--wall",
        action="store_true",
        help="profile wall time (waits on PostgreSQL included) instead of CPU time",
    )
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    if "bench" not in args.database_url.rsplit("/", 1)[-1]:
        parser.error("the database name must contain 'bench'")
    return args


def environ_of(
    *, path: str, body: bytes, api_key: str, lease_token: int
) -> Callable[[], dict[str, Any]]:
    """A fresh WSGI environ for each call, as gunicorn builds it."""
    base = {
        "REQUEST_METHOD": "POST",
        "SCRIPT_NAME": "",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "REMOTE_PORT": "50000",
        "HTTP_HOST": "127.0.0.1:8000",
        "HTTP_ACCEPT": "*/*",
        "HTTP_ACCEPT_ENCODING": "gzip, deflate",
        "HTTP_CONNECTION": "keep-alive",
        "HTTP_USER_AGENT": "python-httpx/0.28.1",
        "HTTP_AUTHORIZATION": f"Bearer {api_key}",
        "HTTP_LEASE_TOKEN": str(lease_token),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }

    def make() -> dict[str, Any]:
        environ = dict(base)
        environ["wsgi.input"] = io.BytesIO(body)
        return environ

    return make


def requests_of(
    workload: str, *, api_key: str, tasks: Iterator[uuid.UUID]
) -> Callable[[int], dict[str, Any]]:
    from bench import workloads

    task_id = next(tasks)

    def reservation(number: int) -> dict[str, Any]:
        body = json.dumps(
            {
                "idempotency_key": f"profile-{number}",
                "action": workloads.RESERVATION_ACTION,
                "target": workloads.RESERVATION_TARGET,
                "input": workloads.RESERVATION_INPUT,
            }
        ).encode()
        path = f"/api/v1/tasks/{task_id}/operations"
        return environ_of(path=path, body=body, api_key=api_key, lease_token=1)()

    def transition(number: int) -> dict[str, Any]:
        body = json.dumps({"to": "succeeded", "expected_state_version": 1}).encode()
        path = f"/api/v1/tasks/{next(tasks)}/transitions"
        return environ_of(path=path, body=body, api_key=api_key, lease_token=1)()

    return reservation if workload == "reservation" else transition


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from bench.api_coordinator import RATE_LIMIT, make_agent

    print(f"profile-request: recreating {args.database_url.rsplit('/', 1)[-1]}")
    recreate_database(args.database_url, seed=True)
    scratch = tempfile.mkdtemp(prefix="profile-request-")
    # The relay nudges of the requests land there (a broker of files): not kept.
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    for folder in ("queue", "control", "processed"):
        (Path(scratch) / "broker" / folder).mkdir(parents=True, exist_ok=True)
    os.environ.update(
        DATABASE_URL=args.database_url,
        DJANGO_SETTINGS_MODULE="config.settings",
        DJANGO_ALLOWED_HOSTS="127.0.0.1",
        PORTAL_AGENT_RATE_LIMIT=RATE_LIMIT,
        PORTAL_VAR_DIR=scratch,
        PORTAL_DEV_MODE="1",
    )
    for name in ("DJANGO_DEBUG", "CELERY_BROKER_URL", "REDIS_URL"):
        os.environ.pop(name, None)
    from config.wsgi import application  # django.setup() and telemetry, as gunicorn

    agent = make_agent(f"profile-{uuid.uuid4().hex[:8]}")
    from bench import workloads  # after django.setup()

    raw = workloads.connect_raw(args.database_url)
    total = WARMUP + args.requests * (args.rounds + int(args.profile))
    count = total if args.workload == "transition" else 1
    tasks = iter(
        workloads.insert_tasks(
            raw, tenant_id=agent.tenant_id, count=count, owner="bench-profile"
        )
    )
    make = requests_of(args.workload, api_key=agent.api_key, tasks=tasks)
    statuses: dict[str, int] = {}

    def start_response(status: str, headers: Any, exc_info: Any = None) -> Any:
        statuses[status] = statuses.get(status, 0) + 1
        return lambda data: None

    def call(number: int) -> None:
        result = application(make(number), start_response)
        try:
            for _ in result:
                pass
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()

    number = 0
    for _ in range(WARMUP):
        call(number)
        number += 1
    cpu_us: list[float] = []
    wall_us: list[float] = []
    for _ in range(args.rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.requests):
            call(number)
            number += 1
        cpu_us.append((time.process_time() - cpu) / args.requests * 1e6)
        wall_us.append((time.perf_counter() - wall) / args.requests * 1e6)
    print(f"profile-request: answers {statuses}")
    load = os.getloadavg()[0]
    print(
        f"profile-request: {args.workload}, {args.requests} requests x {args.rounds}"
        f" rounds, load {load:.1f}: process CPU per request best {min(cpu_us):,.0f} µs,"
        f" median {statistics.median(cpu_us):,.0f} µs; wall best {min(wall_us):,.0f}"
        f" µs, median {statistics.median(wall_us):,.0f} µs"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "workload": args.workload,
                    "requests": args.requests,
                    "cpu_us": cpu_us,
                    "wall_us": wall_us,
                    "load_1m": load,
                    "statuses": statuses,
                },
                indent=2,
            )
        )
    if args.profile:
        # CPU time by default: what the request costs the server, not its waits.
        timer = time.perf_counter if args.wall else time.thread_time
        profiler = cProfile.Profile(timer)
        profiler.enable()
        for _ in range(args.requests):
            call(number)
            number += 1
        profiler.disable()
        stats = pstats.Stats(profiler)
        stats.sort_stats(args.sort).print_stats(args.top)
        stats.sort_stats("cumulative").print_stats(args.top)
    raw.close()
    bad = {s: n for s, n in statuses.items() if not s.startswith("2")}
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
