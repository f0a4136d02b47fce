"""Coordinator of ``bench/api.py``: database, gunicorn, client processes, report.

For every workload and client count it prepares a fresh tenant per flavour (an agent
with a grant and an API key, leased tasks), hands the slices to the first N client
processes, alternating the HTTP API with raw psycopg, and checks the outcome in the
database. Figures go to ``docs/performance.md`` (between the ``bench:api`` markers)
and ``reports/bench-api.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import importlib.metadata
import json
import math
import multiprocessing
import os
import platform
import re
import runpy
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import IO, Any, Final

import httpx
import psycopg

from . import report
from .api_client import FLAVOURS, WORKLOADS, ApiClientResult, ApiRunSpec, client_main
from .api_report import SECTION, ApiFigures, markdown_section, progress_line, tables
from .service_layer import recreate_database, server_facts, tidy, verify
from .worker import BARRIER_TIMEOUT_S

REPO: Final = Path(__file__).resolve().parent.parent
DEFAULT_DATABASE_URL: Final = "postgres://postgres@127.0.0.1:5432/portal_api_bench"
DOCS: Final = REPO / "docs" / "performance.md"
JSON_REPORT: Final = REPO / "reports" / "bench-api.json"
# High enough that the per-agent throttle never answers 429 (it still runs).
RATE_LIMIT: Final = "100000000/min"
REFILL_BATCH: Final = 300
# Untimed requests before every slice after the first.
REWARMUP: Final = 3
# Generous throughput guesses, total and per client, that size the transition pools;
# a client that runs out anyway refills untimed (reported as "refills").
POOL_RATE: Final = {"raw": (2000, 250), "api": (400, 50), "close": (400, 50)}
SERVER_START_TIMEOUT_S: Final = 60.0
SERVER_STOP_TIMEOUT_S: Final = 20.0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/api.py",
        description="The HTTP API under gunicorn against raw psycopg, same run.",
    )
    parser.add_argument(
        "--duration", type=float, default=5.0, help="seconds per flavour and count"
    )
    parser.add_argument(
        "--clients", default="1,4,16", help="comma-separated client counts"
    )
    parser.add_argument(
        "--workers",
        type=int,
        help="gunicorn worker processes (default: gunicorn.conf.py's, as `up` runs)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="threads per worker process (default: gunicorn.conf.py's)",
    )
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="subset of " + str(WORKLOADS)
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="split each flavour's duration into this many slices, alternated with"
        " the other flavour's (background load then hits both alike)",
    )
    parser.add_argument("--warmup", type=int, default=10, help="untimed ops/client")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_API_DATABASE_URL", DEFAULT_DATABASE_URL),
        help="database to DROP, create and migrate (its name must contain 'bench')",
    )
    parser.add_argument(
        "--no-docs", action="store_true", help="do not update docs/performance.md"
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=JSON_REPORT,
        help=f"where to write the figures (default {JSON_REPORT.relative_to(REPO)})",
    )
    args = parser.parse_args(argv)
    args.client_counts = sorted({int(c) for c in args.clients.split(",") if c})
    args.workload_list = [w for w in args.workloads.split(",") if w]
    unknown = set(args.workload_list) - set(WORKLOADS)
    if unknown or not args.client_counts or min(args.client_counts) < 1:
        parser.error(f"bad --workloads {sorted(unknown)} or --clients")
    if (
        args.rounds < 1
        or args.duration <= 0
        or min(args.workers or 1, args.threads or 1) < 1
    ):
        parser.error("--rounds, --workers, --threads and --duration must be positive")
    return args


def say(message: str) -> None:
    print(message, flush=True)


# --- The server ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def server_environment(database_url: str, var_dir: Path) -> dict[str, str]:
    """The server's environment: this database, no debug, no throttling, plain HTTP.

    ``var_dir`` holds the filesystem broker the commit's relay nudge writes to, so
    the nudges of a benchmark reach no real worker and are deleted afterwards.
    """
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in {"DJANGO_DEBUG", "CELERY_BROKER_URL", "REDIS_URL"}
    }
    env.update(
        DATABASE_URL=database_url,
        DJANGO_SETTINGS_MODULE="config.settings",
        DJANGO_ALLOWED_HOSTS="127.0.0.1",
        DJANGO_SECURE_SSL_REDIRECT="0",  # matters only with DJANGO_SECRET_KEY set
        PORTAL_AGENT_RATE_LIMIT=RATE_LIMIT,
        PORTAL_VAR_DIR=str(var_dir),
        PORTAL_DEV_MODE="1",  # the development setup, on purpose
    )
    for folder in ("queue", "control", "processed"):
        (var_dir / "broker" / folder).mkdir(parents=True, exist_ok=True)
    return env


class Server:
    """Gunicorn on a free local port, as a child in its own process group.

    With the repository's ``gunicorn.conf.py``, as ``manage.py up`` and the
    deploy unit run it (its worker class, threads, keep-alive); ``workers`` and
    ``threads`` override the file's only when given.
    """

    def __init__(
        self,
        *,
        workers: int | None,
        threads: int | None,
        env: dict[str, str],
        log_path: Path,
    ) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.command = [
            str(Path(sys.executable).parent / "gunicorn"), "config.wsgi:application",
            "-b", f"127.0.0.1:{self.port}", "--config", "gunicorn.conf.py",
            *(["--workers", str(workers)] if workers else []),
            *(["--threads", str(threads)] if threads else []),
            # INFO: gunicorn names its worker class and each worker it boots.
            "--log-level", "info", "--no-control-socket",
        ]  # fmt: skip
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def shown_command(self) -> str:
        return shlex.join([".venv/bin/gunicorn", *self.command[1:]]).replace(
            str(self.port), "<port>"
        )

    def start(self) -> None:
        from launcher.embedded_db import die_with_parent

        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            self.command,
            cwd=REPO,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent(signal.SIGTERM),
            # Own group: a stuck shutdown can be ended for master and workers at once.
            process_group=0,
        )

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def problems(self, limit: int = 20) -> str:
        """The server log's error lines (not its warnings), if any."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        marks = (" ERROR ", " CRITICAL ", "[ERROR]", "[CRITICAL]", "Traceback")
        return "\n".join(
            [line for line in lines if any(m in line for m in marks)][:limit]
        )

    def wait_ready(self) -> None:
        """Return once the server answers HTTP (any status)."""
        assert self.process is not None
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"gunicorn exited with {self.process.returncode}:\n"
                    + self.log_tail()
                )
            try:
                httpx.get(f"{self.base_url}/api/v1/contracts", timeout=2.0)
            except httpx.TransportError:
                time.sleep(0.2)
            else:
                return
        raise RuntimeError(
            f"gunicorn did not answer within {SERVER_START_TIMEOUT_S:.0f} s:\n"
            + self.log_tail()
        )

    def worker_model(self, threads: int | None) -> str:
        """What the live server runs: its worker class (gunicorn's own log line),
        its worker processes (counted live) and threads per process (``threads``,
        else ``gunicorn.conf.py``'s), e.g. ``ProblemThreadWorker, 2 processes x 4
        threads``."""
        found = re.search(r"Using worker: (\S+)", self.log_path.read_text("utf-8"))
        kind = found.group(1).rsplit(".", 1)[-1] if found else "unknown worker"
        if threads is None:
            config = runpy.run_path(str(REPO / "gunicorn.conf.py"))
            threads = int(config.get("threads", 1))
        return f"{kind}, {len(self.worker_pids())} processes x {threads} threads"

    def worker_pids(self) -> list[int]:
        import psutil

        if self.process is None:
            return []
        try:
            return [child.pid for child in psutil.Process(self.process.pid).children()]
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        """SIGTERM (graceful), then SIGKILL to the group if it takes too long."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(SERVER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None


@contextlib.contextmanager
def running_server(
    *, workers: int | None, threads: int | None, env: dict[str, str], log_path: Path
) -> Iterator[Server]:
    server = Server(workers=workers, threads=threads, env=env, log_path=log_path)
    try:
        server.start()
        server.wait_ready()
        yield server
    finally:
        server.stop()


def warm_server(server: Server, *, api_key: str, workers: int) -> str:
    """Concurrent requests until every worker has connected and imported its views.

    Returns the ``Connection`` header the server answers a keep-alive client with.
    """

    def hit(_: int) -> str:
        with httpx.Client(base_url=server.base_url, timeout=30.0) as client:
            for _ in range(10):
                response = client.get(
                    "/api/v1/contracts", headers={"Authorization": f"Bearer {api_key}"}
                )
                response.raise_for_status()
            return response.headers.get("Connection", "keep-alive")

    with ThreadPoolExecutor(max_workers=2 * workers) as pool:
        return ", ".join(sorted(set(pool.map(hit, range(2 * workers)))))


# --- Setup ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchAgent:
    tenant_id: uuid.UUID
    agent_id: uuid.UUID
    api_key: str = dataclasses.field(repr=False)


def make_agent(slug: str) -> BenchAgent:
    """A tenant and its agent, with the reservation's grant and an API key."""
    from portal import services as portal_services

    from .workloads import RESERVATION_ACTION

    tenant = portal_services.tenant_create(slug=slug, name=slug)
    agent = portal_services.agent_create(tenant=tenant, name="bench-agent")
    portal_services.agent_grant(agent=agent, action=RESERVATION_ACTION, target="*")
    issued = portal_services.agent_key_issue(agent=agent)
    return BenchAgent(tenant_id=tenant.pk, agent_id=agent.pk, api_key=issued.secret)


def _label(sql: str, known: dict[str, str]) -> str:
    """A short name for a captured statement: the bench's own, else verb + table."""
    if sql in known:
        return known[sql]
    verb = sql.split(None, 1)[0].upper()
    tables = re.findall(r'(?:FROM|INTO|UPDATE|JOIN)\s+"?(\w+)"?', sql, re.IGNORECASE)
    return f"{verb} {tables[0]}" if tables else verb


def api_statements(raw: psycopg.Connection[Any], agent: BenchAgent) -> dict[str, Any]:
    """The SQL one steady-state API request of each workload executes, in-process.

    Also proves the endpoints answer as the clients expect before anything starts.
    """
    from django.test import Client

    from portal.models import Tenant

    from . import workloads

    tenant = Tenant.objects.get(pk=agent.tenant_id)
    grant_sql, _ = workloads.grant_check(tenant=tenant, agent_id=str(agent.agent_id))
    known = {
        grant_sql: "grant check",
        workloads.RESERVE: "reserve",
        workloads.TRANSITION: "transition",
        workloads.EVENT_AND_OUTBOX: "event + outbox",
    }
    tasks = workloads.insert_tasks(
        raw, tenant_id=agent.tenant_id, count=3, owner="bench-check"
    )
    client = Client(
        HTTP_HOST="127.0.0.1",
        headers={"Authorization": f"Bearer {agent.api_key}", "Lease-Token": "1"},
    )
    requests: dict[str, list[tuple[str, dict[str, Any], int]]] = {
        "reservation": [
            (
                f"/api/v1/tasks/{tasks[2]}/operations",
                {
                    "idempotency_key": f"check-{number}",
                    "action": workloads.RESERVATION_ACTION,
                    "target": workloads.RESERVATION_TARGET,
                    "input": workloads.RESERVATION_INPUT,
                },
                201,
            )
            for number in range(2)
        ],
        "transition": [
            (
                f"/api/v1/tasks/{task_id}/transitions",
                {"to": "succeeded", "expected_state_version": 1},
                200,
            )
            for task_id in tasks[:2]
        ],
    }
    captured: dict[str, list[tuple[str, Any]]] = {}
    for workload, calls in requests.items():
        for path, body, status in calls:  # the last one counts
            with workloads.captured_statements() as captured[workload]:
                response = client.post(path, data=body, content_type="application/json")
            if response.status_code != status:
                raise RuntimeError(
                    f"{path}: {response.status_code} {response.content[:300]!r},"
                    f" expected {status}"
                )
    return {
        workload: [_label(sql, known) for sql, _ in seen]
        for workload, seen in captured.items()
    }


def prepare(
    raw: psycopg.Connection[Any],
    *,
    tag: str,
    workload: str,
    flavour: str,
    clients: int,
    base_url: str,
    args: argparse.Namespace,
) -> ApiRunSpec:
    """A fresh tenant, agent and key with the tasks all slices need; the run's spec."""
    from .workloads import insert_tasks, owner_of

    agent = make_agent(f"bench-api-{tag}-{workload}-{clients}-{flavour}")
    warmup = args.warmup + REWARMUP * (args.rounds - 1)
    if workload == "transition":
        total, per_client = POOL_RATE[flavour]
        rate = max(total / clients, per_client)
        count = warmup + math.ceil(rate * args.duration)
    else:
        count = 1
    for index in range(clients):
        insert_tasks(raw, tenant_id=agent.tenant_id, count=count, owner=owner_of(index))
    return ApiRunSpec(
        run_id=f"{tag}-{workload}-{clients}-{flavour}",
        round=0,
        workload=workload,
        flavour=flavour,
        clients=clients,
        duration_s=args.duration / args.rounds,
        warmup=args.warmup,
        tenant_id=str(agent.tenant_id),
        agent_id=str(agent.agent_id),
        refill_batch=REFILL_BATCH,
        base_url=base_url,
        api_key=agent.api_key,
    )


# --- Clients -------------------------------------------------------------------------


class Clients:
    """The client processes, started once, with one barrier per client count."""

    def __init__(self, count: int, client_counts: Sequence[int], url: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.barriers: dict[int, Barrier] = {
            c: context.Barrier(c + 1) for c in client_counts
        }
        self.pipes: list[Connection] = []
        self.processes: list[SpawnProcess] = []
        for index in range(count):
            ours, theirs = context.Pipe()
            process = context.Process(
                target=client_main,
                args=(index, theirs, self.barriers, url),
                name=f"bench-api-client-{index}",
                daemon=True,
            )
            process.start()
            theirs.close()
            self.pipes.append(ours)
            self.processes.append(process)
        for pipe in self.pipes:
            self._expect(pipe, "ready", timeout=180)

    @staticmethod
    def _expect(pipe: Connection, kind: str, timeout: float) -> Any:
        if not pipe.poll(timeout):
            raise RuntimeError(f"a client sent nothing for {timeout} s")
        got, payload = pipe.recv()
        if got != kind:
            raise RuntimeError(f"client failed:\n{payload}")
        return payload

    def run(
        self,
        spec: ApiRunSpec,
        cpu_meter: Callable[[], Callable[[], tuple[float, float]]],
    ) -> tuple[list[ApiClientResult], tuple[float, float]]:
        """The clients' results and the server CPU seconds (web, database) of the
        timed part.

        ``cpu_meter()`` is called as the clients are released and returns the
        function that reads the CPU used since, once they have all answered.
        """
        pipes = self.pipes[: spec.clients]
        for pipe in pipes:
            pipe.send(spec)
        try:
            self.barriers[spec.clients].wait(BARRIER_TIMEOUT_S)
        except threading.BrokenBarrierError:
            for pipe in pipes:  # the client that broke it says why
                if pipe.poll(5):
                    kind, payload = pipe.recv()
                    if kind == "error":
                        raise RuntimeError(payload) from None
            raise
        used = cpu_meter()
        deadline = spec.duration_s * 4 + 60
        results = [self._expect(pipe, "ok", timeout=deadline) for pipe in pipes]
        return results, used()

    def stop(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.terminate()


# --- Runs ----------------------------------------------------------------------------


def server_cpu_meter(
    raw: psycopg.Connection[Any], server: Server
) -> Callable[[], Callable[[], tuple[float, float]]]:
    """CPU of the gunicorn workers and of this database's PostgreSQL backends.

    The meter's reading is ``(web, database)`` seconds. ``process_cpu_s`` counts
    only processes named ``postgres``, so the workers are read apart (until
    2026-12-05 this meter called it for them too, and read 0 for the web: the
    "server" CPU of earlier runs is the database backends' alone).
    """
    import psutil

    from .workloads import process_cpu_s

    def web_cpu_s(pid: int) -> float:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            return 0.0
        return float(times.user + times.system)

    def start() -> Callable[[], tuple[float, float]]:
        rows = raw.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND backend_type = 'client backend'"
        ).fetchall()
        backends = {row[0]: process_cpu_s(row[0]) for row in rows}
        workers = {pid: web_cpu_s(pid) for pid in server.worker_pids()}

        def used() -> tuple[float, float]:
            # A process that ended meanwhile reads 0: count it as having used none.
            web = sum(max(0.0, web_cpu_s(pid) - s) for pid, s in workers.items())
            database = sum(
                max(0.0, process_cpu_s(pid) - s) for pid, s in backends.items()
            )
            return web, database

        return used

    return start


def measure(
    clients: Clients,
    raw: psycopg.Connection[Any],
    server: Server,
    *,
    tag: str,
    workload: str,
    count: int,
    args: argparse.Namespace,
    failed_checks: list[str],
) -> list[ApiFigures]:
    """Both flavours of one workload at one client count, in alternating slices."""
    specs = {
        flavour: prepare(
            raw,
            tag=tag,
            workload=workload,
            flavour=flavour,
            clients=count,
            base_url=server.base_url,
            args=args,
        )
        for flavour in FLAVOURS
    }
    tidy(raw)
    meter = server_cpu_meter(raw, server)
    rounds: dict[str, list[list[ApiClientResult]]] = {f: [] for f in FLAVOURS}
    server_cpu = dict.fromkeys(FLAVOURS, 0.0)
    web_cpu = dict.fromkeys(FLAVOURS, 0.0)
    for number in range(args.rounds):
        # Rotate the order, so neither flavour always runs first.
        shift = number % len(FLAVOURS)
        order = FLAVOURS[shift:] + FLAVOURS[:shift]
        shown = []
        for flavour in order:
            spec = dataclasses.replace(
                specs[flavour],
                round=number,
                warmup=args.warmup if number == 0 else REWARMUP,
            )
            results, (web_s, database_s) = clients.run(spec, meter)
            rounds[flavour].append(results)
            server_cpu[flavour] += web_s + database_s
            web_cpu[flavour] += web_s
            rate = sum(
                r.result.ops / r.result.elapsed_s
                for r in results
                if r.result.elapsed_s > 0
            )
            errors = sum(r.errors for r in results)
            shown.append(
                f"{flavour} {rate:.0f}/s" + (f" ({errors} errors)" * bool(errors))
            )
        say(
            f"    {workload} clients={count} slice {number + 1}/{args.rounds}: "
            + ", ".join(shown)
        )
    figures = []
    for flavour in FLAVOURS:
        results = [r for round_ in rounds[flavour] for r in round_]
        try:
            verify(raw, specs[flavour], [r.result for r in results])
        except AssertionError as exc:
            failed_checks.append(str(exc))
            say(f"  CHECK FAILED: {exc}")
        summary = report.summarise(
            workload=workload,
            flavour=flavour,
            clients=count,
            rounds=[[r.result for r in round_] for round_ in rounds[flavour]],
        )
        failures: Counter[str] = Counter()
        for result in results:
            failures.update(result.failures)
        figures.append(
            ApiFigures(
                summary=dataclasses.replace(
                    summary,
                    server_cpu_us_per_op=(
                        server_cpu[flavour] / summary.ops * 1e6 if summary.ops else 0.0
                    ),
                ),
                errors=sum(r.errors for r in results),
                failures=dict(failures.most_common()),
                web_cpu_us_per_op=(
                    web_cpu[flavour] / summary.ops * 1e6 if summary.ops else 0.0
                ),
            )
        )
    for item in figures:
        say(progress_line(item))
    return figures


def _command(argv: Sequence[str]) -> str:
    shown = [re.sub(r"(//[^:/@]+:)[^@]*@", r"\1***@", arg) for arg in argv]
    return shlex.join([".venv/bin/python", "bench/api.py", *shown])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    started = time.monotonic()
    say(f"bench-api: recreating and migrating {args.database_url.rsplit('/', 1)[-1]}")
    recreate_database(args.database_url, seed=True)
    with tempfile.TemporaryDirectory(prefix="bench-api-") as scratch:
        env = server_environment(args.database_url, Path(scratch) / "var")
        # The coordinator's own requests (in-process) see the server's settings.
        os.environ.update(
            {k: env[k] for k in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
            | {
                k: env[k]
                for k in (
                    "PORTAL_AGENT_RATE_LIMIT",
                    "PORTAL_VAR_DIR",
                    "PORTAL_DEV_MODE",
                )
            }
        )
        os.environ.pop("DJANGO_DEBUG", None)
        import django

        django.setup()
        from django.db import connection

        from .api_client import quiet_http_logs

        quiet_http_logs()

        from .workloads import STATEMENTS, connect_raw

        tag = uuid.uuid4().hex[:8]
        raw = connect_raw(args.database_url)
        postgres_version, postgres_settings = server_facts(raw)
        check = make_agent(f"bench-api-{tag}-check")
        statements = api_statements(raw, check)
        for workload, labels in statements.items():
            say(f"bench-api: {workload}: {len(labels)} statements: {'; '.join(labels)}")
        connection.close()

        figures: list[ApiFigures] = []
        failed_checks: list[str] = []
        clients: Clients | None = None
        try:
            with running_server(
                workers=args.workers,
                threads=args.threads,
                env=env,
                log_path=Path(scratch) / "gunicorn.log",
            ) as server:
                say(f"bench-api: {server.shown_command()} answers on {server.base_url}")
                connection_header = warm_server(
                    server, api_key=check.api_key, workers=len(server.worker_pids())
                )
                worker_model = server.worker_model(args.threads)
                say(f"bench-api: the server runs {worker_model}")
                say(f"bench-api: the server answers Connection: {connection_header}")
                count = max(args.client_counts)
                say(f"bench-api: starting {count} client processes")
                clients = Clients(count, args.client_counts, args.database_url)
                load_before = os.getloadavg()
                for workload in args.workload_list:
                    say(f"bench-api: {workload}")
                    for n in args.client_counts:
                        figures += measure(
                            clients,
                            raw,
                            server,
                            tag=tag,
                            workload=workload,
                            count=n,
                            args=args,
                            failed_checks=failed_checks,
                        )
                load_after = os.getloadavg()
                server_command = server.shown_command()
                server_log = server.problems()
        finally:
            if clients is not None:
                clients.stop()
            raw.close()
    if server_log:
        say(f"bench-api: the server logged errors:\n{server_log}")

    import django as django_module

    meta: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": _command(argv),
        "server_command": server_command,
        "workers": worker_model,
        "connection_header": connection_header,
        "rate_limit": RATE_LIMIT,
        "nproc": len(os.sched_getaffinity(0)),
        "platform": f"{platform.system()} {platform.machine()}",
        "postgres_version": postgres_version,
        "postgres_settings": postgres_settings,
        "python_version": platform.python_version(),
        "django_version": django_module.get_version(),
        "psycopg_version": psycopg.__version__,
        "gunicorn_version": importlib.metadata.version("gunicorn"),
        "httpx_version": httpx.__version__,
        "duration_s": args.duration,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "rewarmup": REWARMUP,
        "load_average_1m": [round(load_before[0], 1), round(load_after[0], 1)],
        "clients": args.client_counts,
        "api_statements": statements,
        "raw_statements": {w: len(s) for w, s in STATEMENTS.items() if w in statements},
        "failed_checks": failed_checks,
        "wall_s": round(time.monotonic() - started, 1),
    }
    say("")
    say(tables(figures))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps({"meta": meta, "runs": [f.as_json() for f in figures]}, indent=2)
        + "\n"
    )
    say(f"\nbench-api: wrote {args.json}")
    if not args.no_docs:
        report.replace_section(
            DOCS, markdown_section(meta, figures, failed_checks), SECTION
        )
        say(f"bench-api: updated {DOCS.relative_to(REPO)}")
    say(f"bench-api: done in {meta['wall_s']} s")
    return 1 if failed_checks else 0
