"""The agents' latency on the primary, with and without a reviewer's export on the
replica, in one run (issue 26 §3; docs/scale-out.md, "Reviewers on a replica").

    .venv/bin/python bench/replica_export.py [--events 1000000] [--clients 8]
        [--duration 30] [--slice 2] [--rounds 2] [--workers 2] [--pin]
        [--no-feedback] [--no-docs]
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

On one machine the export's CPU competes with the agents' by construction, which
says nothing about separate database servers. So:

- ``--pin`` puts the primary's postmaster (and so every backend it forks), the
  agents' gunicorn and the agent processes on the first CPU this process may use,
  and the standby's postmaster, a gunicorn of the reviewer's own (one worker: the
  export page's web process) and this process (which reads the export's stream,
  the reviewer's browser) on the second; every thread's ``Cpus_allowed_list`` is
  read back off ``/proc`` at the start and at the end, and a thread elsewhere
  fails the run. Other programs on the machine still run on both CPUs.
- Each phase's resources are counted on their own, whatever else runs: the CPU
  seconds of the primary's postmaster and all its children (``/proc`` utime and
  stime of the live tree, plus the children it has reaped), of its WAL sender, of
  the standby's tree and of each web server; the primary's ``pg_stat_database``
  (transactions, blocks read and hit, rows returned) and the WAL it wrote
  (``pg_current_wal_insert_lsn``); the standby's ``pg_stat_database``. Summed
  over the rounds and divided by the agents' operations, the primary's figures
  say what the export adds to its work.

``--duration`` sets the pairs of a ``without`` phase that comes first; set it near
an export's time so the two phases run about as long.
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
from collections.abc import Callable, Iterator, Sequence
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
    Server,
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
# ``--no-feedback``: the standby does not hold back the primary's vacuum horizon,
# and waits for its queries instead of cancelling them (an export is never cut).
NO_FEEDBACK: Final = ("hot_standby_feedback=off", "max_standby_streaming_delay=-1")


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
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the primary, the agents' web and the agents on one CPU; the standby, "
        "the reviewer's own web and this process (the export's reader) on another",
    )
    parser.add_argument(
        "--no-feedback",
        dest="feedback",
        action="store_false",
        help="the standby without hot_standby_feedback (max_standby_streaming_delay"
        " -1 instead): does the export's snapshot cost the primary its vacuum?",
    )
    parser.add_argument("--no-docs", action="store_true")
    parser.add_argument("--json", type=Path, default=JSON_REPORT)
    args = parser.parse_args(argv)
    if (
        min(args.events, args.clients, args.rounds) < 1
        or min(args.duration, args.slice) <= 0
    ):
        parser.error("sizes and times must be positive")
    if args.pin and len(os.sched_getaffinity(0)) < 2:
        parser.error("--pin needs two CPUs")
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
    settings: tuple[str, ...] = NODE_SETTINGS

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
        options = [arg for item in self.settings for arg in ("-c", item)]
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
def nodes(*, feedback: bool = True) -> Iterator[tuple[Node, Node]]:
    """A primary, started; a standby not yet cloned (``clone`` makes it)."""
    folder = Path(tempfile.mkdtemp(prefix="replica-export-pg-"))
    account = _account()
    if account:
        os.chown(folder, *account)
    primary = Node("primary", folder)
    standby = Node(
        "standby",
        folder,
        settings=NODE_SETTINGS if feedback else NODE_SETTINGS + NO_FEEDBACK,
    )
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


# --- Pinning --------------------------------------------------------------------------


def _tasks(pid: int) -> list[int]:
    """The process's threads (each has its own CPU mask), else none if it is gone."""
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants now, pid first."""
    import psutil

    try:
        return [pid] + [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def pin(pids: Sequence[int], cpu: int) -> None:
    """Every thread of these processes on ``cpu``; what they fork or start later
    inherits the mask (a postmaster's new backends, gunicorn's new threads).
    ``sched_setaffinity`` of a pid sets one thread only: each task is set."""
    for pid in pids:
        for tid in _tasks(pid):
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, {cpu})


def allowed_cpus(pids: Sequence[int]) -> dict[str, int]:
    """``Cpus_allowed_list`` read back off the live threads of these processes, and
    how many threads showed each value: what the kernel enforces, not what was
    asked."""
    seen: dict[str, int] = {}
    for pid in pids:
        for tid in _tasks(pid):
            try:
                status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    value = line.split(":", 1)[1].strip()
                    seen[value] = seen.get(value, 0) + 1
    return seen


@dataclass(kw_only=True)
class Layout:
    """Which processes run where: ``groups`` maps a name to a function listing its
    live pids (a process tree: its root and descendants); ``cpus`` maps a group to
    its CPU (empty: nothing pinned)."""

    groups: dict[str, Callable[[], list[int]]]
    cpus: dict[str, int] = field(default_factory=dict)

    def pin(self) -> None:
        for name, cpu in self.cpus.items():
            pin(self.groups[name](), cpu)

    def read_back(self) -> dict[str, dict[str, int]]:
        return {name: allowed_cpus(live()) for name, live in self.groups.items()}


# --- Accounting ----------------------------------------------------------------------

_STAT_COLUMNS: Final = (
    "xact_commit", "xact_rollback", "blks_read", "blks_hit", "tup_returned",
    "tup_fetched", "tup_inserted", "tup_updated", "temp_bytes",
)  # fmt: skip


def tree_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and every process it ever
    started: its own, its live descendants', and the children it has waited for
    (``cutime``/``cstime``: a postmaster reaps every backend that ends, so a
    connection closed during a phase still counts)."""
    import psutil

    if pid is None:
        return 0.0
    total = 0.0
    for member in _tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            t = psutil.Process(member).cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


def _pid_cpu_s(pid: int | None) -> float:
    import psutil

    if pid is None:
        return 0.0
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return t.user + t.system


@dataclass(frozen=True, kw_only=True)
class Sample:
    """Counters at one instant; ``minus`` gives what a phase used."""

    at: float
    cpu_s: dict[str, float]
    primary: dict[str, int]
    standby: dict[str, int]

    def minus(self, before: Sample) -> dict[str, Any]:
        return {
            "seconds": self.at - before.at,
            "cpu_s": {k: v - before.cpu_s[k] for k, v in self.cpu_s.items()},
            "primary": {k: v - before.primary[k] for k, v in self.primary.items()},
            "standby": {k: v - before.standby[k] for k, v in self.standby.items()},
        }


def _database_stats(url: str, *, wal: bool) -> dict[str, int]:
    columns = ", ".join(f"{c}::bigint" for c in _STAT_COLUMNS)
    with psycopg.connect(url, autocommit=True) as db:
        row = db.execute(
            f"SELECT {columns} FROM pg_stat_database WHERE datname = %s",
            [DBNAME],
        ).fetchone()
        assert row is not None
        stats = dict(zip(_STAT_COLUMNS, map(int, row), strict=True))
        if wal:
            # WAL written cluster-wide (every database, the checkpointer's too):
            # the byte distance the insert position moved, and pg_stat_wal's count.
            found = db.execute(
                "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn,"
                " wal_records, wal_fpi FROM pg_stat_wal"
            ).fetchone()
            assert found is not None
            stats |= {
                "wal_bytes": int(found[0]),
                "wal_records": int(found[1]),
                "wal_fpi": int(found[2]),
            }
    return stats


_TABLE_COLUMNS: Final = (
    "n_tup_upd", "n_tup_hot_upd", "n_dead_tup", "autovacuum_count",
    "autoanalyze_count",
)  # fmt: skip


def _table_stats(url: str) -> dict[str, int]:
    """The benchmark database's tables summed: rows updated (HOT or not), dead row
    versions now (a gauge: its difference is the growth) and autovacuum runs."""
    sums = ", ".join(f"coalesce(sum({c}), 0)::bigint" for c in _TABLE_COLUMNS)
    with psycopg.connect(url, dbname=DBNAME, autocommit=True) as db:
        row = db.execute(f"SELECT {sums} FROM pg_stat_user_tables").fetchone()
    assert row is not None
    return dict(zip(_TABLE_COLUMNS, map(int, row), strict=True))


def walsender_pid(primary: Node) -> int | None:
    with psycopg.connect(primary.url(), autocommit=True) as db:
        row = db.execute("SELECT pid FROM pg_stat_replication LIMIT 1").fetchone()
    return int(row[0]) if row else None


@dataclass(kw_only=True)
class Meter:
    """CPU seconds of each root's process tree (``roots``: name to the root's
    pid), the walsender's alone, and the nodes' statistics of the benchmark's
    database."""

    roots: dict[str, int]
    primary: Node
    standby: Node
    walsender: int | None

    def sample(self) -> Sample:
        cpu = {name: tree_cpu_s(pid) for name, pid in self.roots.items()}
        cpu["walsender"] = _pid_cpu_s(self.walsender)
        return Sample(
            at=time.monotonic(),
            cpu_s=cpu,
            primary=_database_stats(self.primary.url(), wal=True)
            | _table_stats(self.primary.url()),
            standby=_database_stats(self.standby.url(), wal=False),
        )


def add_usage(total: dict[str, Any] | None, part: dict[str, Any]) -> dict[str, Any]:
    if total is None:
        return part
    return {
        key: value + part[key]
        if not isinstance(value, dict)
        else {k: v + part[key][k] for k, v in value.items()}
        for key, value in total.items()
    }


# --- The run -------------------------------------------------------------------------


@dataclass(kw_only=True)
class PhaseResults:
    results: dict[str, list[list[ApiClientResult]]] = field(
        default_factory=lambda: {flavour: [] for flavour in FLAVOURS}
    )
    seconds: float = 0.0
    # The machine's 1-minute load average after each pair.
    loads: list[float] = field(default_factory=list)

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
            results, _ = clients.run(spec, lambda: lambda: (0.0, 0.0))
            self.results[flavour].append(results)
            self.seconds += spec.duration_s
            rate = sum(
                r.result.ops / r.result.elapsed_s for r in results if r.result.elapsed_s
            )
            errors = sum(r.errors for r in results)
            shown.append(
                f"{flavour} {rate:.0f}/s" + f" ({errors} errors)" * bool(errors)
            )
        self.loads.append(os.getloadavg()[0])
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

    def load(self) -> dict[str, float]:
        return {
            "min": round(min(self.loads, default=0.0), 1),
            "mean": round(sum(self.loads) / max(1, len(self.loads)), 1),
            "max": round(max(self.loads, default=0.0), 1),
        }


def arrange(
    args: argparse.Namespace,
    *,
    primary: Node,
    standby: Node,
    server: Server,
    reviewer: Server,
    clients: Clients,
) -> tuple[Layout, Meter]:
    """The process groups, pinned with ``--pin``: the primary's postmaster and
    everything under it, the agents' web and the agents on the first CPU this
    process may use; the standby's, the reviewer's web and this process (which
    reads the export's stream, as the reviewer's browser would) on the second.
    The meter counts the CPU of the database trees and of the web servers."""

    def tree_of(process: Any) -> Callable[[], list[int]]:
        return lambda: _tree(process.pid) if process is not None else []

    def postmaster(node: Node) -> int:
        assert node.process is not None
        return node.process.pid

    groups: dict[str, Callable[[], list[int]]] = {
        "primary": tree_of(primary.process),
        "agents' web": tree_of(server.process),
        "agents": lambda: [p.pid for p in clients.processes if p.pid is not None],
        "standby": tree_of(standby.process),
    }
    if reviewer is not server:
        groups["reviewer's web"] = tree_of(reviewer.process)
    groups["this process"] = lambda: [os.getpid()]
    layout = Layout(groups=groups)
    if args.pin:
        first, second = sorted(os.sched_getaffinity(0))[:2]
        layout.cpus = {
            name: first if name in ("primary", "agents' web", "agents") else second
            for name in groups
        }
        layout.pin()
    roots = {"primary": postmaster(primary), "standby": postmaster(standby)}
    for name, web in (("agents' web", server), ("reviewer's web", reviewer)):
        if web.process is not None and (name == "agents' web" or web is not server):
            roots[name] = web.process.pid
    meter = Meter(
        roots=roots,
        primary=primary,
        standby=standby,
        walsender=walsender_pid(primary),
    )
    return layout, meter


def run_phases(
    clients: Clients,
    specs: dict[str, ApiRunSpec],
    *,
    export_url: str,
    args: argparse.Namespace,
    expected_rows: int,
    nodes_: tuple[Node, Node],
    layout: Layout,
    meter: Meter,
) -> dict[str, Any]:
    """The rounds; ``export_url`` is the reviewer's web (the agents' own, unless
    pinned). Each phase's resource use is the counters' difference across it,
    summed over the rounds."""
    phases = {phase: PhaseResults() for phase in PHASES}
    usage: dict[str, dict[str, Any] | None] = dict.fromkeys(PHASES)
    affinity = {"start": layout.read_back()}
    for name, seen in affinity["start"].items():
        cpu = layout.cpus.get(name)
        say(
            f"{name}: " + (f"pinned to CPU {cpu}, " if cpu is not None else "")
            + f"Cpus_allowed_list (value: threads) {seen}"
        )  # fmt: skip
    exports: list[Export] = []
    standby = nodes_[1]
    read_before = {n.name: event_rows_read(n.url()) for n in nodes_}
    slices = itertools.count()
    planned = max(1, round(args.duration / (2 * args.slice)))
    for number in range(args.rounds):
        order = PHASES if number % 2 == 0 else PHASES[::-1]
        pairs = 0
        for phase in order:
            began = meter.sample()
            if phase == "with":
                loop = ExportLoop(export_url)
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
            ended = meter.sample()
            if phase == "with":
                # A backend reports its counters within a second or so of going
                # idle: the export's last rows reach the standby's statistics a
                # moment after its end, and belong to this phase.
                exported = sum(e.rows for e in loop.done)
                deadline = time.monotonic() + 15
                while (
                    ended.standby["tup_returned"] - began.standby["tup_returned"]
                    < exported
                    and time.monotonic() < deadline
                ):
                    time.sleep(0.5)
                    ended = meter.sample()
            usage[phase] = add_usage(usage[phase], ended.minus(began))
    affinity["end"] = layout.read_back()
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
        "load_1m": {p: phases[p].load() for p in PHASES},
        "exports": [dataclasses.asdict(e) for e in exports],
        "expected_rows": expected_rows,
        "standby_in_recovery": in_recovery,
        "event_rows_read": read,
        "usage": usage,
        "pinned": {name: str(cpu) for name, cpu in layout.cpus.items()},
        "cpus_allowed": affinity,
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
    # Pinned: every thread of every group on its CPU, read back off the live
    # processes at the start and at the end (new backends inherit the mask).
    for moment, seen in result.get("cpus_allowed", {}).items():
        for name, cpu in result.get("pinned", {}).items():
            if set(seen.get(name, {})) != {cpu}:
                failed.append(
                    f"{name} at the {moment}: Cpus_allowed_list {seen.get(name)},"
                    f" expected {cpu}"
                )
    for phase, flavours in result["phases"].items():
        for flavour, figures in flavours.items():
            if figures["errors"] or not figures["ops"]:
                failed.append(f"{phase} {flavour}: {figures}")
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    started = time.monotonic()
    nproc = len(os.sched_getaffinity(0))  # before --pin narrows this process's
    with (
        nodes(feedback=args.feedback) as (primary, standby),
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
            with contextlib.ExitStack() as servers:
                server = servers.enter_context(
                    running_server(
                        workers=args.workers,
                        threads=None,
                        env=env,
                        log_path=Path(scratch) / "gunicorn.log",
                    )
                )
                warm_server(
                    server, api_key=check.api_key, workers=len(server.worker_pids())
                )
                workers = server.worker_model(None)
                # Pinned, the reviewer has a web process of their own (one worker)
                # beside the standby, as a deployment would give reviewers; else
                # they use the agents' web.
                reviewer = (
                    servers.enter_context(
                        running_server(
                            workers=1,
                            threads=None,
                            env=env,
                            log_path=Path(scratch) / "gunicorn-reviewer.log",
                        )
                    )
                    if args.pin
                    else server
                )
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
                layout, meter = arrange(
                    args, primary=primary, standby=standby, server=server,
                    reviewer=reviewer, clients=clients,
                )  # fmt: skip
                load_before = os.getloadavg()
                result = run_phases(
                    clients, specs, export_url=reviewer.base_url, args=args,
                    expected_rows=expected_rows, nodes_=(primary, standby),
                    layout=layout, meter=meter,
                )  # fmt: skip
                load_after = os.getloadavg()
                server_log = "\n".join(
                    filter(None, {server.problems(), reviewer.problems()})
                )
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
        "pin": args.pin,
        "hot_standby_feedback": args.feedback,
        "nproc": nproc,
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


def _ratio(with_: float, without: float) -> str:
    return f"{with_ / without:.2f}×" if without else "n/a"  # noqa: RUF001


def usage_rows(result: dict[str, Any]) -> list[str]:
    """The resources each phase used (both rounds summed), raw and per agent
    operation: what the export adds to the primary, whatever else ran."""
    usage = result["usage"]
    ops = {
        phase: sum(result["phases"][phase][f]["ops"] for f in FLAVOURS)
        for phase in PHASES
    }

    def row(label: str, value: Any, digits: int = 0) -> str:
        without, with_ = value("without"), value("with")
        return (
            f"| {label} | {without:,.{digits}f} | {with_:,.{digits}f}"
            f" | {_ratio(with_, without)} |"
        )

    def per_op(pick: Any, scale: float = 1.0) -> Any:
        return lambda phase: pick(phase) * scale / max(1, ops[phase])

    def cpu(name: str) -> Any:
        return lambda phase: usage[phase]["cpu_s"].get(name, 0.0)

    def primary(key: str) -> Any:
        return lambda phase: usage[phase]["primary"][key]

    def standby(key: str) -> Any:
        return lambda phase: usage[phase]["standby"][key]

    rows = [
        row("Phase time, s", lambda phase: usage[phase]["seconds"]),
        row("Agents' operations (REST + raw)", lambda phase: ops[phase]),
        row("**Primary**: CPU s, postmaster and all its children", cpu("primary"), 1),
        row("Primary: CPU ms per agent operation", per_op(cpu("primary"), 1e3), 2),
        row(
            "Primary: CPU s per second of the phase",
            lambda phase: cpu("primary")(phase) / max(1e-9, usage[phase]["seconds"]),
            3,
        ),
        row("Primary: of which the WAL sender, CPU s", cpu("walsender"), 2),
        row("Primary: transactions committed", primary("xact_commit")),
        row(
            "Primary: transactions per agent operation",
            per_op(primary("xact_commit")),
            2,
        ),
        row("Primary: blocks read outside shared buffers", primary("blks_read")),
        row("Primary: blocks hit in shared buffers", primary("blks_hit")),
        row("Primary: blocks hit per agent operation", per_op(primary("blks_hit")), 1),
        row("Primary: rows returned by scans", primary("tup_returned")),
        row(
            "Primary: rows returned per agent operation",
            per_op(primary("tup_returned")),
            1,
        ),
        *(
            [
                row("Primary: rows updated", primary("n_tup_upd")),
                row(
                    "Primary: of which HOT (no new index entry)",
                    primary("n_tup_hot_upd"),
                ),
                row("Primary: dead row versions, growth", primary("n_dead_tup")),
                row("Primary: autovacuum runs", primary("autovacuum_count")),
            ]
            # Counted since the runs of 2026-12-05 09:00 UTC.
            if "n_tup_upd" in usage["with"]["primary"]
            else []
        ),
        row(
            "Primary: WAL written, bytes per agent operation",
            per_op(primary("wal_bytes")),
        ),
        row("**Standby**: CPU s, postmaster and all its children", cpu("standby"), 1),
        row("Standby: blocks read outside shared buffers", standby("blks_read")),
        row("Standby: rows returned by scans", standby("tup_returned")),
        row("Agents' web: CPU s", cpu("agents' web"), 1),
        # The control: the agents' web never touches the standby or the export
        # (pinned, the reviewer has a web of their own), so a rise in its CPU per
        # operation is the machine's (caches, switches under load), not the export's.
        row(
            "Agents' web: CPU ms per agent operation",
            per_op(cpu("agents' web"), 1e3),
            2,
        ),
    ]
    if "reviewer's web" in usage["with"]["cpu_s"]:
        rows.append(row("Reviewer's web: CPU s", cpu("reviewer's web"), 1))
    return rows


def layout_lines(result: dict[str, Any]) -> str:
    """Where each group ran: the CPU asked and what the kernel reported."""
    pinned = result["pinned"]
    seen = result["cpus_allowed"]

    def shown(found: dict[str, int]) -> str:
        return ", ".join(
            f"`{cpus}` on {n} threads" for cpus, n in sorted(found.items())
        )

    lines = [
        f"- {name}: "
        + (f"pinned to CPU {pinned[name]}; " if name in pinned else "not pinned; ")
        + f"threads' `Cpus_allowed_list` at the start {shown(seen['start'][name])},"
        + f" at the end {shown(seen['end'][name])}"
        for name in seen["start"]
    ]
    return "\n".join(lines)


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
            f" | {_ratio(with_['p99_ms'], without['p99_ms'])} |"
        )
    exports = result["exports"]
    shown = ", ".join(f"{e['rows']:,} rows in {e['seconds']:.1f} s" for e in exports)
    read = result["event_rows_read"]
    loads = result["load_1m"]
    feedback = "on" if meta.get("hot_standby_feedback", True) else "off"
    load_text = "; ".join(
        f"{p} export {loads[p]['min']} to {loads[p]['max']} (mean {loads[p]['mean']})"
        for p in PHASES
    )
    return f"""\
Generated by `bench/replica_export.py` on {meta["date"]} ({meta["nproc"]} CPUs,
load average {meta["load_average_1m"][0]} before, {meta["load_average_1m"][1]} after;
{meta["workers"]}); do not edit between the markers, run the command again:

```
{meta["command"]}
```

{meta["events"]:,} events loaded for one tenant in {meta["load_s"]:.0f} s;
{meta["clients"]} agents, slices of {meta["slice_s"]:g} s, {meta["rounds"]} rounds;
`hot_standby_feedback` {feedback} on the standby.
The machine's 1-minute load average after each pair: {load_text}.

Where the processes ran{" (`--pin`)" if meta.get("pin") else ""}:

{layout_lines(result)}

{HEADER.format(clients=meta["clients"])}
{chr(10).join(rows)}

What each phase used (both rounds summed; the primary's and standby's figures are
their own counters, whatever else ran on the machine):

| Resource | without export | with export | with / without |
|---|---:|---:|---:|
{chr(10).join(usage_rows(result))}

Exports on the standby in the "with" phase: {shown}. Rows of `audit_event`
read during the run: standby {read["standby"]:,}, primary {read["primary"]:,}.
"""


if __name__ == "__main__":
    sys.exit(main())
