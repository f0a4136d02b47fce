"""The agents' latency on the primary, with and without a reviewer's export on the
replica, in one run (issue 26 §3; docs/scale-out.md, "Reviewers on a replica").

    .venv/bin/python bench/replica_export.py [--events 1000000] [--clients 8]
        [--duration 30] [--slice 2] [--rounds 2] [--workers 2] [--no-docs]
        [--json reports/bench-replica-export.json]

Starts a PostgreSQL 15 primary and a streaming hot standby of its own (initdb and
pg_basebackup in a temporary folder, free ports on 127.0.0.1; never the machine's
server), synchronous as production's Patroni runs them (``synchronous_standby_names``
``*``: a commit waits for the standby's flush), ``hot_standby_feedback`` on the
standby (a long export is not cancelled by a replay conflict). It migrates the
portal's database there, loads ``--events`` events for one tenant with
``manage.py load_scale_data --tenants 1``, and starts gunicorn with
``PORTAL_REPLICA_DATABASE_URL`` naming both nodes with ``prefer-standby``, as
docs/scale-out.md tells operators to.

``--clients`` processes (``bench/api_client.py``'s) then reserve operations over
REST (``api``) and with the same statements through raw psycopg on the primary
(``raw``, the baseline), alternating in slices of ``--slice`` seconds. Each round has
two phases, their order swapped every round:

- ``with``: the tenant's reviewer exports all its events as JSON Lines through the
  portal's export page (``/admin/audit/event/export/jsonl/``), export after export,
  and pairs of slices (one of each flavour) run while an export is streaming: as
  many as ``--duration`` makes (or as the phase before ran); then no new export
  starts, and pairs go on until the one in flight has ended (the last pair may
  outlast it);
- ``without``: no export; as many pairs as the ``with`` phase before it ran, or as
  ``--duration`` makes when it comes first (then the ``with`` phase may run more,
  waiting for an export to finish).

Every export must hold every event of the tenant that the load made (the
``audit.exported`` events of earlier exports come on top), and the standby must
have read at least the exported rows of ``audit_event`` while the primary read
fewer (``pg_stat_user_tables``, read on each node; the agents' own event appends
read a row or so each there).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import itertools
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

sys.path[0] = str(Path(__file__).resolve().parent.parent)

import psycopg  # noqa: E402

from bench import report  # noqa: E402
from bench.admin_pages import log_in  # noqa: E402
from bench.api_client import ApiClientResult, ApiRunSpec  # noqa: E402
from bench.api_coordinator import (  # noqa: E402
    Clients,
    free_port,
    make_agent,
    prepare,
    running_server,
    server_environment,
    warm_server,
)
from bench.service_layer import recreate_database, server_facts  # noqa: E402

REPO: Final = Path(__file__).resolve().parent.parent
PG_BIN: Final = Path("/usr/lib/postgresql/15/bin")
DBNAME: Final = "portal_replica_bench"
DOCS: Final = REPO / "docs" / "scale-out.md"
SECTION: Final = "replica-export"
JSON_REPORT: Final = REPO / "reports" / "bench-replica-export.json"
WORKLOAD: Final = "reservation"
FLAVOURS: Final = ("raw", "api")
PHASES: Final = ("without", "with")
# load_scale_data's reviewer of its first tenant (config/scale_data/tenants.py).
TENANT: Final = "scale-t01"
REVIEWER: Final = "reviewer-t01"
HEADER: Final = (
    "| Agents on the primary, {clients} clients | p50 / p99 ms without export"
    " | with export | ops/s without / with | p99 with / without |\n"
    "|---|---:|---:|---:|---:|"
)
EXPORT_PATH: Final = "/admin/audit/event/export/jsonl/"
START_TIMEOUT_S: Final = 60.0
# The nodes' settings: test data on a shared machine (the HA tier's too).
NODE_SETTINGS: Final = (
    "listen_addresses=127.0.0.1",
    "fsync=off",
    "shared_buffers=128MB",
    "max_connections=100",
    "wal_level=replica",
    "max_wal_senders=4",
    "wal_keep_size=512MB",
    "hot_standby=on",
    "hot_standby_feedback=on",
)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/replica_export.py",
        description="Agents' p50/p99 on the primary with and without an export on "
        "the replica, same run.",
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument(
        "--duration",
        type=float,
        default=30.0,
        help="seconds of slices per phase and round (a 'with' phase also goes on "
        "until one export has finished)",
    )
    parser.add_argument("--slice", type=float, default=2.0, help="seconds per slice")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=10, help="untimed ops/client")
    parser.add_argument("--workers", type=int, help="gunicorn worker processes")
    parser.add_argument("--no-docs", action="store_true")
    parser.add_argument("--json", type=Path, default=JSON_REPORT)
    args = parser.parse_args(argv)
    if (
        min(args.events, args.clients, args.rounds) < 1
        or min(args.duration, args.slice) <= 0
    ):
        parser.error("sizes and times must be positive")
    return args


def say(message: str) -> None:
    print(f"bench-replica-export: {message}", flush=True)


# --- The two nodes -------------------------------------------------------------------


def _account() -> tuple[int, int] | None:
    """PostgreSQL refuses to run as root: then it runs as ``postgres``."""
    if os.geteuid() != 0:
        return None
    entry = pwd.getpwnam("postgres")
    return entry.pw_uid, entry.pw_gid


def _as_server(command: list[str], *, log: Path) -> subprocess.CompletedProcess[str]:
    account = _account()
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=False,
        user=account[0] if account else None,
        group=account[1] if account else None,
        env={k: v for k, v in os.environ.items() if not k.startswith("PG")},
        timeout=3600,
    )


@dataclass
class Node:
    name: str
    folder: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def data(self) -> Path:
        return self.folder / self.name

    @property
    def log(self) -> Path:
        return self.folder / f"{self.name}.log"

    def url(self, *, user: str = "postgres", dbname: str = "postgres") -> str:
        return f"postgres://{user}@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        from launcher.embedded_db import die_with_parent

        account = _account()
        options = [arg for item in NODE_SETTINGS for arg in ("-c", item)]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [str(PG_BIN / "postgres"), "-D", str(self.data), "-p", str(self.port),
                 "-k", str(self.folder), *options],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                user=account[0] if account else None,
                group=account[1] if account else None,
                preexec_fn=die_with_parent(signal.SIGTERM),
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited:\n{self.log.read_text()[-3000:]}"
                )
            try:
                with psycopg.connect(self.url(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT)  # PostgreSQL's fast shutdown
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _run(command: list[str], *, what: str, log: Path) -> None:
    done = _as_server(command, log=log)
    if done.returncode != 0:
        raise RuntimeError(f"{what} exited {done.returncode}:\n{done.stderr[-3000:]}")


@contextlib.contextmanager
def nodes() -> Iterator[tuple[Node, Node]]:
    """A primary, started; a standby not yet cloned (``clone`` makes it)."""
    folder = Path(tempfile.mkdtemp(prefix="replica-export-pg-"))
    account = _account()
    if account:
        os.chown(folder, *account)
    primary, standby = Node("primary", folder), Node("standby", folder)
    try:
        _run(
            [str(PG_BIN / "initdb"), "-D", str(primary.data), "-U", "postgres",
             "-A", "trust", "-E", "UTF8", "--no-sync"],
            what="initdb", log=primary.log,
        )  # fmt: skip
        primary.start()
        yield primary, standby
    finally:
        standby.stop()
        primary.stop()
        shutil.rmtree(folder, ignore_errors=True)


def clone(primary: Node, standby: Node) -> None:
    """pg_basebackup the primary into a streaming standby, start it, and make it
    the synchronous standby; returns once it streams in sync."""
    _run(
        [str(PG_BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port),
         "-U", "postgres", "-D", str(standby.data), "-R", "-X", "stream",
         "--checkpoint=fast", "--no-sync"],
        what="pg_basebackup", log=standby.log,
    )  # fmt: skip
    standby.start()
    with psycopg.connect(primary.url(), autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
        admin.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + START_TIMEOUT_S
        while admin.execute(
            "SELECT count(*) FROM pg_stat_replication"
            " WHERE state = 'streaming' AND sync_state = 'sync'"
        ).fetchone() != (1,):
            if time.monotonic() > deadline:
                raise RuntimeError("the standby did not stream in sync")
            time.sleep(0.2)


# --- Data ----------------------------------------------------------------------------


def load_events(app_url: str, owner_url: str, *, events: int, var_dir: Path) -> str:
    """``load_scale_data`` for one tenant; returns what it printed last."""
    done = subprocess.run(
        [sys.executable, "manage.py", "load_scale_data", "--tenants", "1",
         "--events", str(events), "--tasks", str(max(1, events // 10)),
         "--outbox", "1000"],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=7200,
        env={**os.environ, "DATABASE_URL": app_url, "DATABASE_OWNER_URL": owner_url,
             "DJANGO_SETTINGS_MODULE": "config.settings", "PORTAL_NO_BOOTSTRAP": "1",
             "PORTAL_DEV_MODE": "1", "PORTAL_VAR_DIR": str(var_dir)},
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"load_scale_data failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def tenant_events(admin_url: str) -> tuple[str, int]:
    """The tenant's id and its events other than exports' records (as owner)."""
    with psycopg.connect(admin_url, autocommit=True) as db:
        row = db.execute(
            "SELECT t.id::text, (SELECT count(*) FROM audit_event AS e"
            " WHERE e.tenant_id = t.id AND e.code <> 'audit.exported')"
            " FROM portal_tenant AS t WHERE t.slug = %s",
            [TENANT],
        ).fetchone()
    assert row is not None, f"no tenant {TENANT}"
    return str(row[0]), int(row[1])


def event_rows_read(url: str) -> int:
    """Rows of ``audit_event`` (all partitions) read on this node so far."""
    with psycopg.connect(url, dbname=DBNAME, autocommit=True) as db:
        row = db.execute(
            "SELECT coalesce(sum(coalesce(seq_tup_read, 0)"
            " + coalesce(idx_tup_fetch, 0)), 0)::bigint FROM pg_stat_user_tables"
            " WHERE relname LIKE 'audit_event%%'"
        ).fetchone()
    assert row is not None
    return int(row[0])


# --- The export ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Export:
    rows: int
    seconds: float
    status: int


class ExportLoop(threading.Thread):
    """The reviewer's exports, one after the other, each read to its end; after
    ``enough`` is set, the one in flight is the last. ``streaming`` is set once the
    first one answers."""

    def __init__(self, base_url: str) -> None:
        super().__init__(name="replica-export", daemon=True)
        from config.scale_data.rows import PASSWORD  # after django.setup()

        self.session = log_in(base_url, REVIEWER, PASSWORD)
        self.url = base_url + EXPORT_PATH
        self.enough = threading.Event()
        self.streaming = threading.Event()
        self.done: list[Export] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while True:
                began = time.perf_counter()
                with self.session.get(self.url, stream=True, timeout=3600) as answer:
                    self.streaming.set()
                    rows = sum(
                        chunk.count(b"\n")
                        for chunk in answer.iter_content(chunk_size=1 << 16)
                    )
                self.done.append(
                    Export(
                        rows=rows,
                        seconds=time.perf_counter() - began,
                        status=answer.status_code,
                    )
                )
                # Checked after an export, never before the next: a flag set
                # during one ends the loop with it, not after another one.
                if self.enough.is_set():
                    return
        except BaseException as exc:  # noqa: BLE001 (reported by the coordinator)
            self.error = exc
        finally:
            self.streaming.set()


# --- The run -------------------------------------------------------------------------


@dataclass(kw_only=True)
class PhaseResults:
    results: dict[str, list[list[ApiClientResult]]] = field(
        default_factory=lambda: {flavour: [] for flavour in FLAVOURS}
    )
    seconds: float = 0.0

    def pair(
        self, clients: Clients, specs: dict[str, ApiRunSpec], number: Iterator[int]
    ) -> str:
        """One slice of each flavour; rotate so neither always goes first.
        ``number`` numbers the slices of the whole run (the clients' keys use it)."""
        index = next(number)
        order = FLAVOURS[index % 2 :] + FLAVOURS[: index % 2]
        shown = []
        for flavour in order:
            spec = dataclasses.replace(specs[flavour], round=index, warmup=3)
            results, _ = clients.run(spec, lambda: lambda: 0.0)
            self.results[flavour].append(results)
            self.seconds += spec.duration_s
            rate = sum(
                r.result.ops / r.result.elapsed_s for r in results if r.result.elapsed_s
            )
            errors = sum(r.errors for r in results)
            shown.append(
                f"{flavour} {rate:.0f}/s" + f" ({errors} errors)" * bool(errors)
            )
        return ", ".join(shown)

    def figures(self, clients: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for flavour, rounds in self.results.items():
            summary = report.summarise(
                workload=WORKLOAD,
                flavour=flavour,
                clients=clients,
                rounds=[[r.result for r in round_] for round_ in rounds],
            )
            out[flavour] = {
                "ops": summary.ops,
                "ops_per_s": round(summary.ops_per_s, 1),
                "p50_ms": round(summary.p50_ms, 2),
                "p99_ms": round(summary.p99_ms, 2),
                "errors": sum(r.errors for round_ in rounds for r in round_),
                "slices": len(rounds),
            }
        return out


def run_phases(
    clients: Clients,
    specs: dict[str, ApiRunSpec],
    *,
    base_url: str,
    args: argparse.Namespace,
    expected_rows: int,
    nodes_: tuple[Node, Node],
) -> dict[str, Any]:
    phases = {phase: PhaseResults() for phase in PHASES}
    exports: list[Export] = []
    standby = nodes_[1]
    read_before = {n.name: event_rows_read(n.url()) for n in nodes_}
    slices = itertools.count()
    planned = max(1, round(args.duration / (2 * args.slice)))
    for number in range(args.rounds):
        order = PHASES if number % 2 == 0 else PHASES[::-1]
        pairs = 0
        for phase in order:
            if phase == "with":
                loop = ExportLoop(base_url)
                loop.start()
                loop.streaming.wait(600)
                count = 0
                # As many pairs as the phase before, then on until the export in
                # flight ends: every pair starts while one streams (the last may
                # outlast it by a pair).
                while loop.error is None and loop.is_alive():
                    line = phases[phase].pair(clients, specs, slices)
                    count += 1
                    say(f"round {number + 1} with export, pair {count}: {line}")
                    if count >= (pairs or planned):
                        loop.enough.set()
                loop.join()
                if loop.error is not None:
                    raise RuntimeError(f"the export failed: {loop.error!r}")
                exports += loop.done
                say(
                    f"round {number + 1}: {len(loop.done)} exports: "
                    + ", ".join(
                        f"{e.rows:,} rows in {e.seconds:.1f} s" for e in loop.done
                    )
                )
                pairs = pairs or count
            else:
                count = pairs or planned
                for index in range(count):
                    line = phases[phase].pair(clients, specs, slices)
                    say(f"round {number + 1} without, pair {index + 1}: {line}")
                pairs = count
    # Statistics reach the views within a few seconds of a backend going idle.
    deadline = time.monotonic() + 30
    while True:
        read = {n.name: event_rows_read(n.url()) - read_before[n.name] for n in nodes_}
        if (
            read[standby.name] >= sum(e.rows for e in exports)
            or time.monotonic() > deadline
        ):
            break
        time.sleep(1)
    with psycopg.connect(standby.url(), autocommit=True) as db:
        in_recovery = db.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
    return {
        "phases": {p: phases[p].figures(args.clients) for p in PHASES},
        "exports": [dataclasses.asdict(e) for e in exports],
        "expected_rows": expected_rows,
        "standby_in_recovery": in_recovery,
        "event_rows_read": read,
    }


def checks(result: dict[str, Any]) -> list[str]:
    """What must hold for the figures to mean anything."""
    failed = []
    exports = result["exports"]
    if not exports:
        failed.append("no export finished")
    for number, export in enumerate(exports):
        # Each earlier export added one audit.exported event (once replayed).
        expected = result["expected_rows"]
        if export["status"] != 200 or not (
            expected <= export["rows"] <= expected + number
        ):
            failed.append(f"export {number + 1}: {export}, expected {expected} rows")
    read = result["event_rows_read"]
    total = sum(e["rows"] for e in exports)
    if not result["standby_in_recovery"]:
        failed.append("the standby is not in recovery")
    if read["standby"] < total:
        failed.append(f"the standby read {read['standby']} event rows, exports {total}")
    # The agents' own event appends read a row or so each on the primary; the
    # exports, had they run there, would have read every exported row on top.
    if exports and read["primary"] >= total:
        failed.append(f"the primary read {read['primary']} event rows: exports there?")
    for phase, flavours in result["phases"].items():
        for flavour, figures in flavours.items():
            if figures["errors"] or not figures["ops"]:
                failed.append(f"{phase} {flavour}: {figures}")
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    started = time.monotonic()
    with (
        nodes() as (primary, standby),
        tempfile.TemporaryDirectory(prefix="bench-replica-export-") as scratch,
    ):
        var_dir = Path(scratch) / "var"
        admin_url = primary.url(dbname=DBNAME)
        say(f"primary on port {primary.port}: migrating {DBNAME}")
        app_url = recreate_database(admin_url)
        from portal import db_roles

        owner_url = db_roles.url_as(admin_url, user=db_roles.OWNER_ROLE)
        say(f"loading {args.events:,} events for one tenant (load_scale_data)")
        loaded_at = time.monotonic()
        loaded = load_events(app_url, owner_url, events=args.events, var_dir=var_dir)
        load_s = time.monotonic() - loaded_at
        say(f"{loaded} ({load_s:.0f} s)")
        with psycopg.connect(admin_url, autocommit=True) as db:
            db.execute("VACUUM (ANALYZE) audit_event")
        tenant_id, expected_rows = tenant_events(admin_url)
        say(f"cloning the standby (pg_basebackup) on port {standby.port}")
        clone(primary, standby)
        app_user = psycopg.conninfo.conninfo_to_dict(app_url).get("user", "postgres")
        replica_url = (
            f"postgres://{app_user}@127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
            f"/{DBNAME}?target_session_attrs=prefer-standby"
        )
        env = server_environment(app_url, var_dir) | {
            "PORTAL_REPLICA_DATABASE_URL": replica_url,
            "PORTAL_RELAY_NUDGE": "0",
        }
        # This process and the clients set up and run the raw baseline as the
        # administrator, as bench/api.py does; the server runs as the app role.
        os.environ["DATABASE_URL"] = admin_url
        os.environ.update(
            {
                k: env[k]
                for k in (
                    "DJANGO_SETTINGS_MODULE",
                    "PORTAL_AGENT_RATE_LIMIT",
                    "PORTAL_VAR_DIR",
                    "PORTAL_DEV_MODE",
                )
            }
        )
        import django

        django.setup()
        from django.db import connection

        from bench.api_client import quiet_http_logs
        from bench.workloads import connect_raw

        quiet_http_logs()
        raw = connect_raw(admin_url)
        postgres_version, postgres_settings = server_facts(raw)
        tag = uuid.uuid4().hex[:8]
        check = make_agent(f"bench-replica-{tag}-check")
        prepare_args = argparse.Namespace(
            warmup=args.warmup, rounds=1, duration=args.slice
        )
        clients: Clients | None = None
        try:
            with running_server(
                workers=args.workers,
                threads=None,
                env=env,
                log_path=Path(scratch) / "gunicorn.log",
            ) as server:
                warm_server(
                    server, api_key=check.api_key, workers=len(server.worker_pids())
                )
                workers = server.worker_model(None)
                specs = {
                    flavour: prepare(
                        raw, tag=tag, workload=WORKLOAD, flavour=flavour,
                        clients=args.clients, base_url=server.base_url,
                        args=prepare_args,
                    )
                    for flavour in FLAVOURS
                }  # fmt: skip
                connection.close()
                say(f"gunicorn ({workers}); starting {args.clients} client processes")
                clients = Clients(args.clients, [args.clients], admin_url)
                load_before = os.getloadavg()
                result = run_phases(
                    clients, specs, base_url=server.base_url, args=args,
                    expected_rows=expected_rows, nodes_=(primary, standby),
                )  # fmt: skip
                load_after = os.getloadavg()
                server_log = server.problems()
        finally:
            if clients is not None:
                clients.stop()
            raw.close()
    failed = checks(result)
    if server_log:
        failed.append(f"the server logged errors:\n{server_log}")
    result["meta"] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join([".venv/bin/python", "bench/replica_export.py", *argv]),
        "events": args.events,
        "tenant_id": tenant_id,
        "load_s": round(load_s, 1),
        "clients": args.clients,
        "slice_s": args.slice,
        "duration_s": args.duration,
        "rounds": args.rounds,
        "workers": workers,
        "nproc": len(os.sched_getaffinity(0)),
        "load_average_1m": [round(load_before[0], 1), round(load_after[0], 1)],
        "postgres_version": postgres_version,
        "postgres_settings": postgres_settings,
        "wall_s": round(time.monotonic() - started, 1),
    }
    result["failed_checks"] = failed
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown_section(result), flush=True)
    for problem in failed:
        say(f"CHECK FAILED: {problem}")
    if not args.no_docs and not failed:
        report.replace_section(DOCS, markdown_section(result), SECTION)
        say(f"updated {DOCS.relative_to(REPO)}")
    return 1 if failed else 0


def markdown_section(result: dict[str, Any]) -> str:
    meta = result["meta"]
    rows = []
    for flavour, label in (
        ("api", "REST reserve (`api`)"),
        ("raw", "raw SQL reserve (`raw`)"),
    ):
        without = result["phases"]["without"][flavour]
        with_ = result["phases"]["with"][flavour]
        rows.append(
            f"| {label} | {without['p50_ms']:.2f} / {without['p99_ms']:.2f}"
            f" | {with_['p50_ms']:.2f} / {with_['p99_ms']:.2f}"
            f" | {without['ops_per_s']:,.0f} / {with_['ops_per_s']:,.0f}"
            f" | {with_['p99_ms'] / without['p99_ms']:.2f}× |"  # noqa: RUF001
        )
    exports = result["exports"]
    shown = ", ".join(f"{e['rows']:,} rows in {e['seconds']:.1f} s" for e in exports)
    read = result["event_rows_read"]
    return f"""\
Generated by `bench/replica_export.py` on {meta["date"]} ({meta["nproc"]} CPUs,
load average {meta["load_average_1m"][0]} before, {meta["load_average_1m"][1]} after;
{meta["workers"]}); do not edit between the markers, run the command again:

```
{meta["command"]}
```

{meta["events"]:,} events loaded for one tenant in {meta["load_s"]:.0f} s;
{meta["clients"]} agents, slices of {meta["slice_s"]:g} s, {meta["rounds"]} rounds.

{HEADER.format(clients=meta["clients"])}
{chr(10).join(rows)}

Exports on the standby in the "with" phase: {shown}. Rows of `audit_event`
read during the run: standby {read["standby"]:,}, primary {read["primary"]:,}.
"""


if __name__ == "__main__":
    sys.exit(main())
