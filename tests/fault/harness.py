"""The fault tier's machinery: real Celery workers, a SIGKILL/SIGSTOP nemesis, checks.

Nothing here is a mock. Workers are ``celery -A config worker`` processes on the
machine's RabbitMQ and the test database; the nemesis sends real SIGKILLs to pool
children and worker main processes and real SIGSTOP/SIGCONT to whole nodes; the
checks read the database and the ticket desk's own ledger.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import psutil
from django.db import InterfaceError, OperationalError, connection
from kombu import Connection, Exchange, Queue

REPO = Path(__file__).resolve().parents[2]
REPORTS = REPO / "reports"
# Celery's INFO line for every message a worker main process takes off the queue.
_RECEIVED = re.compile(r"run_operation_job\[(?P<id>[0-9a-f-]{36})\] received")
_READY = " ready."


T = TypeVar("T")
# What a lost database connection (a restart, anyone's) raises in this process.
DB_DOWN = (OperationalError, InterfaceError)


def retrying(
    action: Callable[[], T],
    *,
    counter: Counter[str] | None = None,
    label: str = "db_retries",
    timeout: float = 120,
) -> T:
    """Run ``action``; while the database is unreachable, reconnect and run it again.

    Only for actions that are safe to repeat. PostgreSQL on this machine is shared,
    and other tests restart it, so every step of the test process needs this.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            return action()
        except DB_DOWN:
            connection.close()
            if counter is not None:
                counter[label] += 1
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    return float(value) if value else default


# --- RabbitMQ ------------------------------------------------------------------------


def celery_queue(name: str) -> Queue:
    """The queue exactly as Celery declares a missing one (direct exchange, durable,
    of the settings' queue type: RabbitMQ refuses a second declaration that differs)."""
    from django.conf import settings

    quorum = settings.CELERY_TASK_CREATE_MISSING_QUEUE_TYPE == "quorum"
    return Queue(
        name,
        Exchange(name, type="direct"),
        routing_key=name,
        durable=True,
        queue_arguments={"x-queue-type": "quorum"} if quorum else None,
    )


def queue_declare(url: str, name: str) -> None:
    with Connection(url) as broker:
        celery_queue(name)(broker.default_channel).declare()


def queue_depth(url: str, name: str) -> int:
    """Messages ready in the queue (not those a worker holds unacknowledged)."""
    with Connection(url, connect_timeout=5) as broker:
        queue = celery_queue(name)(broker.default_channel)
        # (name, message_count, consumer_count); kombu's stubs say str.
        declared: Any = queue.queue_declare(passive=True)
    return int(declared[1])


def queue_delete(url: str, name: str) -> None:
    # Each on a fresh channel: a failed delete closes the channel it ran on.
    for delete in ("queue_delete", "exchange_delete"):
        with (
            Connection(url, connect_timeout=5) as broker,
            contextlib.suppress(Exception),
        ):
            getattr(broker.default_channel, delete)(name)


# --- Worker processes ----------------------------------------------------------------


def database_url() -> str:
    """The test database (with committed rows: ``transactional_db``), for workers."""
    params = connection.settings_dict
    user = quote(params.get("USER") or "postgres")
    password = params.get("PASSWORD") or ""
    auth = f"{user}:{quote(password)}@" if password else f"{user}@"
    host = params.get("HOST") or "127.0.0.1"
    port = params.get("PORT") or 5432
    return f"postgres://{auth}{host}:{port}/{params['NAME']}"


@dataclass
class Slot:
    """One worker node: a name that outlives the processes started under it."""

    index: int
    name: str
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    restart_at: float | None = None  # monotonic; set while it is down
    starts: int = 0
    resume_at: float | None = None  # monotonic; set while it is paused (SIGSTOP)
    readies: int = 0  # "ready." lines read from its log so far
    log_read_to: int = 0  # how far the log has been read for them
    log_tail: bytes = b""  # the last bytes read, for a line split across reads

    @property
    def up(self) -> bool:
        return self.process is not None and self.process.poll() is None


class WorkerPool:
    """N ``celery worker`` nodes on one queue; each in its own process group.

    ``stop()`` ends every process ever started here (SIGTERM, then SIGKILL to each
    process group) and proves with psutil that none is left.
    """

    def __init__(
        self,
        *,
        count: int,
        queue: str,
        env: dict[str, str],
        log_dir: Path,
        concurrency: int = 2,
    ) -> None:
        self.queue = queue
        self.env = env
        self.concurrency = concurrency
        self.lock = threading.RLock()
        self.slots = [
            Slot(index=i, name=f"chaos{i}-{queue[-8:]}", log_path=log_dir / f"w{i}.log")
            for i in range(count)
        ]
        self.started: list[subprocess.Popen[bytes]] = []

    def command(self, slot: Slot) -> list[str]:
        return [
            sys.executable, "-m", "celery", "-A", "config", "worker",
            "--pool", "prefork", "--concurrency", str(self.concurrency),
            "-Q", self.queue, "--without-gossip", "--without-mingle",
            "--without-heartbeat", "-n", f"{slot.name}@%h", "-l", "INFO",
        ]  # fmt: skip

    def start(self, slot: Slot) -> None:
        with self.lock, slot.log_path.open("ab") as log:
            process = subprocess.Popen(
                self.command(slot),
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, killed as one
            )
            slot.process = process
            slot.restart_at = None
            slot.starts += 1
            self.started.append(process)

    def start_all(self, timeout: float = 90) -> float:
        """Start every node and wait until each says ``ready``; seconds it took."""
        began = time.monotonic()
        for slot in self.slots:
            self.start(slot)
        deadline = began + timeout
        for slot in self.slots:
            while self.ready_count(slot) < slot.starts:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{slot.name} not ready:\n{self.tail(slot)}")
                if not slot.up:
                    raise RuntimeError(f"{slot.name} exited:\n{self.tail(slot)}")
                time.sleep(0.2)
        return time.monotonic() - began

    def ready_count(self, slot: Slot) -> int:
        try:
            return slot.log_path.read_text(errors="replace").count(_READY)
        except FileNotFoundError:
            return 0

    def ready(self, slot: Slot) -> bool:
        """Whether the node's current process is up and said ``ready`` (it consumes).

        Reads only what the log gained since the last call: the nemesis asks before
        every strike, and a big run's logs grow to megabytes.
        """
        if not slot.up:
            return False
        try:
            with slot.log_path.open("rb") as log:
                log.seek(slot.log_read_to)
                fresh = log.read()
        except FileNotFoundError:
            return False
        slot.log_read_to += len(fresh)
        text = slot.log_tail + fresh
        slot.readies += text.count(_READY.encode())
        # Keep less than one marker, so a marker is never counted twice.
        slot.log_tail = text[-(len(_READY) - 1) :]
        return slot.readies >= slot.starts

    def tail(self, slot: Slot, lines: int = 30) -> str:
        try:
            text = slot.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def children(self, slot: Slot) -> list[psutil.Process]:
        if not slot.up:
            return []
        assert slot.process is not None
        try:
            return psutil.Process(slot.process.pid).children()
        except psutil.NoSuchProcess:
            return []

    def kill_child(self, slot: Slot, rng: random.Random) -> bool:
        """SIGKILL one pool child of the node; its job is redelivered (acks_late)."""
        children = self.children(slot)
        if not children:
            return False
        victim = rng.choice(children)
        try:
            victim.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            return False
        return True

    def kill_main(self, slot: Slot, *, restart_in: float) -> bool:
        """SIGKILL the node's main process (its children die with it: pdeathsig)."""
        with self.lock:
            if not slot.up:
                return False
            assert slot.process is not None
            slot.process.send_signal(signal.SIGKILL)
            slot.process.wait()
            slot.restart_at = time.monotonic() + restart_in
            return True

    def pause(self, slot: Slot, *, resume_in: float) -> bool:
        """SIGSTOP the node's whole process group (main and pool children, as a
        paused VM); ``resume_due`` sends SIGCONT once ``resume_in`` s have passed."""
        with self.lock:
            if not slot.up or slot.resume_at is not None:
                return False
            assert slot.process is not None
            try:
                os.killpg(slot.process.pid, signal.SIGSTOP)
            except ProcessLookupError:
                return False
            slot.resume_at = time.monotonic() + resume_in
            return True

    def resume_due(self, *, all_now: bool = False) -> int:
        """SIGCONT each paused node whose pause is over (every one: ``all_now``)."""
        resumed = 0
        with self.lock:
            for slot in self.slots:
                if slot.resume_at is None:
                    continue
                if all_now or time.monotonic() >= slot.resume_at:
                    if slot.process is not None:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(slot.process.pid, signal.SIGCONT)
                    slot.resume_at = None
                    resumed += 1
        return resumed

    def restart_due(self) -> int:
        """Start again each killed node whose pause is over; how many were started."""
        started = 0
        with self.lock:
            for slot in self.slots:
                if slot.restart_at is not None and time.monotonic() >= slot.restart_at:
                    self.start(slot)
                    started += 1
        return started

    def supervise(self) -> list[int | None]:
        """Start again every node that exited on its own, as systemd would.

        Celery's main process gives up ("Unrecoverable error: WorkerLostError('Could
        not start worker processes')") when a pool child dies while the pool is
        starting, so a deployment runs workers under a supervisor. Returns the exit
        codes of the nodes restarted.
        """
        codes: list[int | None] = []
        with self.lock:
            for slot in self.slots:
                if slot.process is not None and slot.restart_at is None and not slot.up:
                    codes.append(slot.process.returncode)
                    self.start(slot)
        return codes

    def up_slots(self) -> list[Slot]:
        return [slot for slot in self.slots if slot.up]

    def targets(self) -> list[Slot]:
        """The nodes a strike may hit: up, said ``ready`` since their last start, and
        not paused. A node still starting is spared: under load a start takes longer
        than the nemesis's interval, and striking starting nodes kept most workers
        from ever consuming (2026-12-05's 1,000 x 8 drain miss, docs/chaos.md)."""
        return [
            slot for slot in self.slots if slot.resume_at is None and self.ready(slot)
        ]

    def deliveries(self) -> Counter[str]:
        """How often each run_operation_job message was taken off the queue."""
        seen: Counter[str] = Counter()
        for slot in self.slots:
            with contextlib.suppress(FileNotFoundError):
                seen.update(
                    match["id"]
                    for match in _RECEIVED.finditer(
                        slot.log_path.read_text(errors="replace")
                    )
                )
        return seen

    def leftovers(self) -> list[psutil.Process]:
        """Live processes of this pool (main or child: both carry ``-Q <queue>``)."""
        found = []
        for process in psutil.process_iter(["cmdline", "status"]):
            cmdline = process.info["cmdline"] or []
            if self.queue in cmdline and process.info["status"] != "zombie":
                found.append(process)
        return found

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM every node, SIGKILL what is left; no process may survive this."""
        with self.lock:
            self.resume_due(all_now=True)  # a stopped process ignores SIGTERM
            for slot in self.slots:
                slot.restart_at = None
            for process in self.started:
                if process.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for process in self.started:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(max(0.1, deadline - time.monotonic()))
            for process in self.started:
                # The whole group: a main that is gone may have left a child behind.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            left = self.leftovers()
            for process in left:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
            psutil.wait_procs(left, timeout=5)
            still = self.leftovers()
            assert not still, f"worker processes survived stop(): {still}"


# --- The nemesis ---------------------------------------------------------------------


class Nemesis(threading.Thread):
    """Every U(interval) s, strike one ready node: pause it, or SIGKILL a pool child
    or its main process.

    A strike pauses the node (SIGSTOP to its process group, SIGCONT after
    U(pause_for) s: past the execution deadline, so the settle job takes its
    in-flight calls over meanwhile) with probability ``pause_share``, and at the
    latest at the ``1 / pause_share``-th strike when none has paused yet (a short
    run draws few strikes: 24 at a 0.1 share miss every pause one run in twelve);
    otherwise it
    kills, a main process with probability ``main_share``. A killed main is started
    again (same node name) after U(pause) s, and a main that exits on its own is
    started again at once (``WorkerPool.supervise``). Only nodes that said ``ready``
    and are not paused are struck (``WorkerPool.targets``). With ``strike=False`` it
    only supervises. While half the nodes are out (starting, down or paused), a
    strike that would take another out kills a pool child instead (``held_back``).
    Runs until ``stop()``, which resumes every paused node; counts strikes by kind.
    """

    def __init__(
        self,
        pool: WorkerPool,
        rng: random.Random,
        *,
        main_share: float,
        pause_share: float = 0.0,
        interval: tuple[float, float] = (0.2, 1.0),
        pause: tuple[float, float] = (0.2, 1.0),
        pause_for: tuple[float, float] = (4.0, 8.0),
        strike: bool = True,
    ) -> None:
        super().__init__(name="nemesis", daemon=True)
        self.pool = pool
        self.rng = rng
        self.main_share = main_share
        self.pause_share = pause_share
        self.interval = interval
        self.pause = pause
        self.pause_for = pause_for
        self.striking = strike
        self.kills: Counter[str] = Counter()
        self.pauses = 0
        self.paused_s = 0.0  # the pauses' planned lengths, added up
        self.strikes = 0  # every strike at a target, held back ones included
        # At most this many nodes out (starting, down or paused) by the nemesis's
        # hand; a strike past it is a child kill (counted in held_back).
        self.max_out = max(1, len(pool.slots) // 2)
        self.held_back = 0
        self.restarts = 0
        self.self_exits: list[int | None] = []  # exit codes of mains that gave up
        self.last_kill_at: float | None = None  # monotonic
        self.error: BaseException | None = None
        self._stopped = threading.Event()

    def run(self) -> None:
        try:
            while not self._stopped.wait(self.rng.uniform(*self.interval)):
                self.pool.resume_due()
                self.restarts += self.pool.restart_due()
                self.self_exits += self.pool.supervise()
                if self.striking:
                    self.strike()
        except BaseException as error:  # surfaced by stop()  # noqa: BLE001
            self.error = error
        finally:
            self.pool.resume_due(all_now=True)

    def strike(self) -> None:
        targets = self.pool.targets()
        if not targets:
            return
        slot = self.rng.choice(targets)
        # Nodes starting, down or paused consume nothing. A strike that would take
        # one more out while half are out kills a pool child instead: under load a
        # start takes longer than the time between strikes, and without this bound
        # the nodes spent the run restarting (docs/chaos.md, the 1,000 x 8 miss).
        out = len(self.pool.slots) - len(targets)
        may_take_out = out < self.max_out
        self.strikes += 1
        pause = self.rng.random() < self.pause_share or (
            self.pause_share > 0
            and self.pauses == 0
            and self.strikes >= round(1 / self.pause_share)
        )
        main = self.rng.random() < self.main_share
        if (pause or main) and not may_take_out:
            self.held_back += 1
            pause = main = False
        if pause:
            length = self.rng.uniform(*self.pause_for)
            if self.pool.pause(slot, resume_in=length):
                self.pauses += 1
                self.paused_s += length
                self.last_kill_at = time.monotonic()
        elif main:
            restart_in = self.rng.uniform(*self.pause)
            if self.pool.kill_main(slot, restart_in=restart_in):
                self.kills["main"] += 1
                self.last_kill_at = time.monotonic()
        elif self.pool.kill_child(slot, self.rng):
            self.kills["child"] += 1
            self.last_kill_at = time.monotonic()

    def stop(self) -> None:
        """Stop striking (a node still down stays down); re-raise the thread's error."""
        self._stopped.set()
        self.join(30)
        if self.error is not None:
            raise self.error


# --- Figures and checks --------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); 0 for no values."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


def write_report(name: str, figures: dict[str, Any]) -> Path:
    """Print the figures and keep them in reports/<name>.json (git-ignored)."""
    REPORTS.mkdir(exist_ok=True)
    path = REPORTS / f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', name)}.json"
    path.write_text(json.dumps(figures, indent=2, default=str) + "\n")
    print(f"\n{name}: {json.dumps(figures, default=str)}")
    return path


# Operation events that move its state; each carries {"from": ..., "to": ...}.
MOVE_EVENTS = (
    "operation.executing",
    "operation.verified",
    "operation.failed",
    "operation.unknown",
    "operation.conflicted",
    "operation.escalated",
)


@dataclass
class OperationView:
    """One operation as the database has it, with its events in id (time) order."""

    id: uuid.UUID
    key: str
    state: str
    reason_code: str | None
    attempts: int
    provider_reference: str | None
    updated_at: Any
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def count(self, code: str) -> int:
        return sum(1 for event_code, _ in self.events if event_code == code)

    def walk(self) -> str | None:
        """Replay the state moves from ``reserved``; where they lead, None if nowhere.

        Each move event names the state it left and the state it entered; a log that
        agrees with the row chains every move from ``reserved`` to the row's state.
        Moves are tried in id order, but ids are only millisecond-ordered across
        processes, so the replay may take a later one first when it fits (a
        backtracking search over a handful of events).
        """
        moves = [
            (payload.get("from"), payload.get("to"))
            for code, payload in self.events
            if code in MOVE_EVENTS
        ]

        seen: set[tuple[str, tuple[int, ...]]] = set()  # dead ends

        def replay(state: str, left: tuple[int, ...]) -> str | None:
            if not left:
                return state
            if (state, left) in seen:
                return None
            for index in left:
                source, target = moves[index]
                if source == state and isinstance(target, str):
                    end = replay(target, tuple(i for i in left if i != index))
                    if end is not None:
                        return end
            seen.add((state, left))
            return None

        return replay("reserved", tuple(range(len(moves))))


def operation_views(tenant_id: uuid.UUID) -> dict[uuid.UUID, OperationView]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, idempotency_key, state, reason_code, attempts,"
            " provider_reference, updated_at"
            " FROM tasks_operation WHERE tenant_id = %s",
            [tenant_id],
        )
        views = {row[0]: OperationView(*row) for row in cursor.fetchall()}
        cursor.execute(
            "SELECT operation_id, code, payload FROM audit_event"
            " WHERE tenant_id = %s AND operation_id IS NOT NULL ORDER BY id",
            [tenant_id],
        )
        for operation_id, code, payload in cursor.fetchall():
            if operation_id in views:
                # Django leaves jsonb from a raw cursor as text.
                data = json.loads(payload) if isinstance(payload, str) else payload
                views[operation_id].events.append((code, data))
    return views


def operation_states(tenant_id: uuid.UUID) -> Counter[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state, count(*) FROM tasks_operation WHERE tenant_id = %s"
            " GROUP BY state",
            [tenant_id],
        )
        return Counter(dict(cursor.fetchall()))


def first_verified_after(tenant_id: uuid.UUID, moment: float) -> float | None:
    """Seconds from ``moment`` (a ``time.time()``) to the next operation verified."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXTRACT(EPOCH FROM min(updated_at)) FROM tasks_operation"
            " WHERE tenant_id = %s AND state = 'verified'"
            " AND updated_at > to_timestamp(%s)",
            [tenant_id, moment],
        )
        (first,) = cursor.fetchone()
    return None if first is None else round(float(first) - moment, 2)


def make_due(tenant_id: uuid.UUID) -> Counter[str]:
    """Make every queued-but-unstarted or unknown operation of the tenant due now.

    What the wall clock would do: the queued grace and the lookup backoff pass.
    Called once the queue is empty, when no worker will start those operations.
    Executing operations keep their own deadline, so a call in flight is never
    declared in doubt early. Returns how many were made due, by state.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tasks_operation SET next_check_at = app_now()"
            " WHERE tenant_id = %s AND next_check_at > app_now() AND ("
            "  state = 'unknown' OR (state = 'reserved' AND authorized_at IS NOT NULL))"
            " RETURNING state",
            [tenant_id],
        )
        return Counter(f"made_due_{state}" for (state,) in cursor.fetchall())


@dataclass
class Verdict:
    """What the checks found; every list must end up empty."""

    lost: list[str] = field(default_factory=list)
    duplicates: dict[str, int] = field(default_factory=dict)
    missing_tickets: list[str] = field(default_factory=list)
    foreign_tickets: list[str] = field(default_factory=list)
    receipt_mismatches: list[str] = field(default_factory=list)
    event_mismatches: list[str] = field(default_factory=list)
    final_states: Counter[str] = field(default_factory=Counter)

    def problems(self) -> dict[str, Any]:
        return {
            name: value
            for name, value in {
                "lost": self.lost,
                "duplicates": self.duplicates,
                "missing_tickets": self.missing_tickets,
                "foreign_tickets": self.foreign_tickets,
                "receipt_mismatches": self.receipt_mismatches,
                "event_mismatches": self.event_mismatches,
            }.items()
            if value
        }


def check(
    *,
    views: dict[uuid.UUID, OperationView],
    tickets: Iterable[dict[str, Any]],
) -> Verdict:
    """Every operation verified, one ticket per key, and logs that agree with rows.

    ``tickets``: the desk's tickets of this test's tenant, as the desk counts them.
    """
    verdict = Verdict()
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for ticket in tickets:
        by_key[ticket["idempotency_key"]].append(ticket)
    keys = {view.key for view in views.values()}
    verdict.foreign_tickets = sorted(set(by_key) - keys)
    for view in views.values():
        verdict.final_states[view.state] += 1
        if view.state != "verified":
            verdict.lost.append(f"{view.key}: {view.state} ({view.reason_code})")
        made = by_key.get(view.key, [])
        if len(made) > 1:
            verdict.duplicates[view.key] = len(made)
        if not made:
            verdict.missing_tickets.append(view.key)
        elif view.provider_reference != made[0]["ticket_id"]:
            verdict.receipt_mismatches.append(
                f"{view.key}: {view.provider_reference} != {made[0]['ticket_id']}"
            )
        verdict.event_mismatches.extend(f"{view.key}: {p}" for p in events_agree(view))
    return verdict


def events_agree(view: OperationView) -> list[str]:
    """Where the operation's event log disagrees with its row (empty: it agrees)."""
    problems = []
    verified = [p for code, p in view.events if code == "operation.verified"]
    if view.state == "verified":
        if len(verified) != 1:
            problems.append(f"{len(verified)} operation.verified events")
        elif verified[0].get("provider_reference") != view.provider_reference:
            problems.append("operation.verified names another receipt")
    elif verified:
        problems.append(f"operation.verified events on a {view.state} operation")
    walked = view.walk()
    if walked != view.state:
        problems.append(f"state moves replay to {walked}, the row says {view.state}")
    executing = view.count("operation.executing")
    if executing != view.attempts:
        problems.append(
            f"{executing} operation.executing events, attempts {view.attempts}"
        )
    # A run killed after the call but before recording it leaves an attempt without
    # a connector.called event; never the other way round.
    called = view.count("connector.called")
    if called > view.attempts:
        problems.append(f"{called} connector.called events, attempts {view.attempts}")
    if view.count("operation.reserved") != 1:
        problems.append(f"{view.count('operation.reserved')} operation.reserved events")
    return problems


@dataclass
class Clock:
    """Wall-clock marks of a run, in seconds since it started."""

    started: float = field(default_factory=time.monotonic)
    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, name: str) -> float:
        self.marks[name] = round(time.monotonic() - self.started, 2)
        return self.marks[name]


def settle(
    *,
    tenant_id: uuid.UUID,
    total: int,
    deadline: float,
    sweep: Callable[[], int],
    drained: Callable[[], bool],
    between: Callable[[], None] = lambda: None,
    interval: float = 0.5,
    stall_s: float = 180,
) -> dict[str, int]:
    """Run the settle job in this process until every operation is terminal.

    ``sweep``: one pass of the settle job (``check_receipts_job``). ``drained``:
    whether the workers can make no more progress on their own (everything
    submitted, queue empty); then the remaining waits are shortened with
    ``make_due``. ``between``: called on every round (fault injection that needs
    this thread). A lost database connection costs a round, not the run. Gives
    up early when no operation has settled for ``stall_s``.
    Returns figures: rounds, operations the settle job looked at, ``make_due``
    updates, database errors, ``stalled``.
    """
    figures: Counter[str] = Counter()
    terminal = ("verified", "failed", "conflict", "human_required")
    settled, progressed_at = -1, time.monotonic()
    while time.monotonic() < deadline:
        try:
            between()
            states = operation_states(tenant_id)
            now_settled = sum(states[state] for state in terminal)
            if now_settled >= total:
                break
            if now_settled > settled:
                settled, progressed_at = now_settled, time.monotonic()
            elif time.monotonic() - progressed_at > stall_s:
                figures["stalled"] = 1
                break
            figures["rounds"] += 1
            if drained():
                figures.update(make_due(tenant_id))
            looked = sweep()
        except DB_DOWN:
            connection.close()
            figures["db_errors"] += 1
            looked = 0
        figures["settle_job_looked_at"] += looked
        if not looked:
            time.sleep(interval)
    return dict(figures)


@contextlib.contextmanager
def running(nemesis: Nemesis) -> Iterator[Nemesis]:
    nemesis.start()
    try:
        yield nemesis
    finally:
        nemesis.stop()
