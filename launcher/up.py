"""``manage.py up``: the whole portal on one machine, in one terminal.

Starts the embedded PostgreSQL (when DATABASE_URL is unset) and the demo ticket
desk (``python -m ticketdesk``, the remote system the example agent's tickets land
in), migrates, collects static files, seeds the demo data, then runs gunicorn, a
Celery worker, Celery beat and the MCP server (``manage.py mcp --http``, port
``PORTAL_MCP_PORT`` or 8200) as child processes; outside production, with the
worker, also a witness of the audit log (``manage.py witness`` on a free port, its
key and state under var/), which the worker and beat are given as
``PORTAL_AUDIT_WITNESSES`` unless that is set. Ctrl-C (or SIGTERM) stops them all,
the database last. If any of them exits, the others are stopped and ``up`` exits
non-zero. Every child also gets a parent-death signal, so even a SIGKILLed ``up``
leaves nothing behind. The management command only parses its options and calls
``Up.run``.

Quiet by default: the children log warnings and errors only (``PORTAL_LOG_LEVEL``,
default ``WARNING`` here; ``INFO`` brings back every job, request and access line),
so the banner with the one-time agent key is the last thing printed; pressing
Enter prints it again.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Final

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import OutputWrapper
from django.db import connections

from config.management.commands.seed_demo import USERS, seed, ticketdesk_keys_path
from portal import db_roles

from . import embedded_db

STOP_TIMEOUT: Final = 20.0
WEB_START_TIMEOUT: Final = 60.0
TICKETDESK_START_TIMEOUT: Final = 15.0
# It imports Django and the MCP SDK while gunicorn, the worker and beat do the same:
# on a busy 2-core machine (load 27) it took 45 s, and 30 s stopped `up` twice.
MCP_START_TIMEOUT: Final = 90.0
_POLL_SECONDS: Final = 0.5
# The one line the desk prints to stdout once its socket listens (ticketdesk/README).
_TICKETDESK_LISTENING: Final = re.compile(
    r"ticketdesk listening on (?P<url>http://\S+)"
)
# And the MCP server's (``manage.py mcp --http``).
_MCP_LISTENING: Final = re.compile(r"mcp listening on (?P<url>http://\S+)")
DEV_WITNESS_NAME: Final = "witness.local/portal-dev"
# The children's log level unless PORTAL_LOG_LEVEL names one (README, "Logs").
QUIET_LOG_LEVEL: Final = "WARNING"


def children_log_level() -> str:
    """``PORTAL_LOG_LEVEL`` (upper case), or WARNING: what the children log."""
    return (os.environ.get("PORTAL_LOG_LEVEL") or QUIET_LOG_LEVEL).upper()


def _verbose(level: str) -> bool:
    return level in ("DEBUG", "INFO")


def _wait_for_enter(stream: IO[str], asked: threading.Event) -> None:
    """Set ``asked`` each time a line (Enter) arrives on ``stream``, until EOF."""
    with contextlib.suppress(OSError, ValueError):
        for _line in stream:
            asked.set()


class _StopRequested(BaseException):
    """SIGINT or SIGTERM arrived. A BaseException, like KeyboardInterrupt, so that
    no ``except Exception`` on the way (migrations, seeding) swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _StopRequested(signum)


def _note_signal_while_stopping(signum: int, frame: FrameType | None) -> None:
    print("up: already stopping, please wait…", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Child:
    name: str
    process: subprocess.Popen[bytes]


def _accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection((embedded_db.HOST, port), timeout=1):
            return True
    except OSError:
        return False


def _pump_stdout(stream: IO[bytes], lines: queue.Queue[str | None]) -> None:
    """Hand the child's stdout lines to ``lines``, and on to our stdout.

    Drains the pipe for the child's whole life, so a full pipe never blocks it.
    """
    with stream:
        for raw in stream:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            # Printed before it is handed on: the banner that waits for this line
            # comes after it.
            print(line, flush=True)
            lines.put(line)
    lines.put(None)


def _listening_url(
    process: subprocess.Popen[bytes], pattern: re.Pattern[str], *, timeout: float
) -> str | None:
    """The URL a child prints on the line ``pattern`` matches once it listens; None
    if it exits or stays silent for ``timeout`` s. Its output goes on to ours."""
    assert process.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(
        target=_pump_stdout,
        args=(process.stdout, lines),
        name=f"child-{process.pid}-stdout",
        daemon=True,
    ).start()
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=min(left, _POLL_SECONDS))
        except queue.Empty:
            continue
        if line is None:  # stdout closed: the child exited
            return None
        if match := pattern.fullmatch(line):
            return match["url"]
    return None


def use_ticketdesk_port(port: int) -> None:
    """Make ``port`` the desk's for this process and the children it starts.

    Settings read ``PORTAL_TICKETDESK_PORT`` once, at import, for the development
    default of ``PORTAL_OUTBOUND_ALLOWED_HOSTS``; with ``--ticketdesk-port`` that
    default would name another port than the desk's, and the seed's connector (and
    every call the gateway makes to it) would be refused. An allow-list set in the
    environment is the operator's and stays as it is.
    """
    os.environ["PORTAL_TICKETDESK_PORT"] = str(port)  # the children's settings
    if settings.DEV_MODE and "PORTAL_OUTBOUND_ALLOWED_HOSTS" not in os.environ:
        settings.PORTAL_OUTBOUND_ALLOWED_HOSTS = [f"{embedded_db.HOST}:{port}"]


def _exit_code(returncode: int) -> int:
    # Any exit is a failure here: the children are meant to run until stopped.
    if returncode > 0:
        return returncode
    return 128 - returncode if returncode < 0 else 1


class Up:
    """One run of ``manage.py up``: progress to ``stderr``, the banner to ``stdout``."""

    def __init__(
        self,
        *,
        stdout: OutputWrapper,
        stderr: OutputWrapper,
        stdin: IO[str] | None = None,
    ) -> None:
        self.stdout = stdout
        self.stderr = stderr
        # Enter on ``stdin`` prints the banner again (None: it is not read).
        self.stdin = stdin
        self.witness_line: str | None = None

    def run(
        self, *, port: int, ticketdesk_port: int, no_worker: bool, verbosity: int = 1
    ) -> int:
        """Start everything, supervise until a stop or an exit; return the exit code.

        Raises:
            LaunchError: a server could not be started (port taken, database, desk);
                everything started so far has been stopped.
        """
        server: embedded_db.EmbeddedServer | None = None
        children: list[Child] = []
        code = 0
        # The desk is demo equipment: production settings seed nothing that uses it.
        demo = not settings.PRODUCTION
        previous = {
            signum: signal.signal(signum, _raise_stop)
            for signum in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            embedded_db.check_port_free(
                port,
                server="the web server",
                hint="Pass --port or set PORTAL_PORT to use another one.",
            )
            if demo:
                embedded_db.check_port_free(
                    ticketdesk_port,
                    server="the ticket desk",
                    hint="Pass --ticketdesk-port or set PORTAL_TICKETDESK_PORT to use "
                    "another one.",
                )
                use_ticketdesk_port(ticketdesk_port)
            database_url = os.environ.get("DATABASE_URL")
            if not database_url:
                server = embedded_db.EmbeddedServer(
                    data_dir=Path(settings.VAR_DIR) / "pgdata",
                    port=embedded_db.settings_port(),
                )
                self._say(f"starting PostgreSQL on {embedded_db.HOST}:{server.port}…")
                server.start()
                database_url = server.url
            database_url = self._two_roles(database_url)
            desk_url = None
            if demo:
                desk_url = self._start_ticketdesk(children, port=ticketdesk_port)
            secret = self._prepare(verbosity=verbosity, desk_url=desk_url)
            mcp_url = self._start_children(
                children, database_url=database_url, port=port, no_worker=no_worker
            )
            code = self._supervise(
                children=children,
                server=server,
                port=port,
                secret=secret,
                desk_url=desk_url,
                mcp_url=mcp_url,
            )
        except _StopRequested as stop:
            self._say(f"{stop}: stopping…")
        finally:
            for signum in previous:
                signal.signal(signum, _note_signal_while_stopping)
            self._stop_children(children)
            if server is not None:
                server.stop()
                self._say("PostgreSQL stopped")
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return code

    def _two_roles(self, database_url: str) -> str:
        """Make the owner and the app role from an administrator's URL; the app's URL.

        With an administrator's URL (the embedded server's, or DATABASE_URL naming a
        role that may create roles) both roles are made and given the database;
        migrations then run as the owner and everything else as the app role. Any
        other DATABASE_URL is the app role's already, with DATABASE_OWNER_URL beside
        it (README, "Database roles").
        """
        if not db_roles.can_create_roles(database_url):
            return database_url
        self._say(
            f"database roles: {db_roles.OWNER_ROLE} owns the schema, "
            f"{db_roles.APP_ROLE} runs the portal…"
        )
        db_roles.ensure_roles(database_url)
        db_roles.adopt_database(database_url)
        settings.DATABASE_OWNER_URL = db_roles.url_as(
            database_url, user=db_roles.OWNER_ROLE
        )
        settings.DATABASE_APP_ROLE = db_roles.APP_ROLE
        db_roles.use_role("default", user=db_roles.APP_ROLE)
        return db_roles.url_as(database_url, user=db_roles.APP_ROLE)

    def _prepare(self, *, verbosity: int, desk_url: str | None) -> str | None:
        """Migrate, collect static files, seed; return the demo agent's key."""
        self._say("applying migrations…")
        call_command("migrate", interactive=False, verbosity=verbosity)
        self._say("collecting static files…")
        call_command("collectstatic", interactive=False, verbosity=0)
        secret = None
        if settings.PRODUCTION:
            self._say("production settings: not seeding demo users")
        else:
            secret = seed(
                report=lambda line: self._say(f"seed_demo: {line}"),
                ticketdesk_url=desk_url,
                ticketdesk_keys=ticketdesk_keys_path(),
            )
        # Idle connections would hold the embedded server open at shutdown.
        connections.close_all()
        return secret

    def _start_ticketdesk(self, children: list[Child], *, port: int) -> str:
        """Start the demo ticket desk as a child; return its URL once it listens.

        Raises:
            LaunchError: it exited or stayed silent past the start timeout.
        """
        command = [
            sys.executable, "-m", "ticketdesk", "--host", embedded_db.HOST,
            "--port", str(port),
        ]  # fmt: skip
        self._say(f"starting ticket desk: {' '.join(command[1:])}")
        env = dict(os.environ)
        # Public keys only: the seed writes the demo connector's into this JWKS
        # file after the desk starts, and the desk reads it again on change.
        env["TICKETDESK_KEYS"] = str(ticketdesk_keys_path())
        env["PYTHONUNBUFFERED"] = "1"
        process = subprocess.Popen(  # noqa: S603 (this interpreter, fixed arguments)
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            cwd=settings.BASE_DIR,
            env=env,
            preexec_fn=embedded_db.die_with_parent(signal.SIGTERM),
            process_group=0,  # as the other children: see _start_children
        )
        children.append(Child(name="ticket desk", process=process))
        url = _listening_url(
            process, _TICKETDESK_LISTENING, timeout=TICKETDESK_START_TIMEOUT
        )
        if url is None:
            raise embedded_db.LaunchError(
                f"the ticket desk did not start on port {port} within "
                f"{TICKETDESK_START_TIMEOUT:.0f} s (exit code {process.poll()}); its "
                "messages are above."
            )
        return url

    def _start_mcp(self, children: list[Child], *, env: dict[str, str]) -> str:
        """Start the MCP server (``manage.py mcp --http``, its port from
        ``PORTAL_MCP_PORT``) as a child; return its URL once it listens.

        Raises:
            LaunchError: it exited or stayed silent past the start timeout.
        """
        command = [sys.executable, "manage.py", "mcp", "--http"]
        self._say(f"starting MCP server: {' '.join(command[1:])}")
        process = subprocess.Popen(  # noqa: S603 (this interpreter, fixed arguments)
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            cwd=settings.BASE_DIR,
            env=env,
            preexec_fn=embedded_db.die_with_parent(signal.SIGTERM),
            process_group=0,  # as the other children: see _start_children
        )
        children.append(Child(name="MCP server", process=process))
        url = _listening_url(process, _MCP_LISTENING, timeout=MCP_START_TIMEOUT)
        if url is None:
            code = process.poll()
            hint = (
                "it was still starting (a busy machine?)"
                if code is None
                else "set PORTAL_MCP_PORT to use another port"
            )
            raise embedded_db.LaunchError(
                f"the MCP server did not start within {MCP_START_TIMEOUT:.0f} s (exit "
                f"code {code}); its messages are above; {hint}."
            )
        return url

    def _start_witness(self, children: list[Child], *, env: dict[str, str]) -> str:
        """Start a development witness (``manage.py witness``, its key and state
        under var/, a free port) as a child; return the ``PORTAL_AUDIT_WITNESSES``
        entry for the worker and beat. Nothing waits for it to listen: the worker
        first calls it after a checkpoint, and a head it missed goes again with
        the next run; if it exits, ``up`` stops like for any child."""
        from audit import checkpoints, witness

        var_dir = Path(settings.VAR_DIR)
        key_file = var_dir / "witness-key.pem"
        checkpoints.signing_key()  # writes the log's public key, which it trusts
        vkey = witness.verifier_key(
            DEV_WITNESS_NAME, witness.load_or_make_key(key_file).public_key()
        )
        with socket.socket() as probe:  # a port nothing listens on now
            probe.bind((embedded_db.HOST, 0))
            port = int(probe.getsockname()[1])
        url = f"http://{embedded_db.HOST}:{port}"
        command = [
            sys.executable, "manage.py", "witness", "--name", DEV_WITNESS_NAME,
            "--state-dir", str(var_dir / "witness"), "--key-file", str(key_file),
            "--listen", f"{embedded_db.HOST}:{port}",
        ]  # fmt: skip
        self._say(f"starting witness: {' '.join(command[1:])}")
        process = subprocess.Popen(  # noqa: S603 (this interpreter, fixed arguments)
            command,
            stdin=subprocess.DEVNULL,
            # Its two start-up lines (URL, key) are the banner's Witness line.
            stdout=subprocess.DEVNULL,
            cwd=settings.BASE_DIR,
            env=env,
            preexec_fn=embedded_db.die_with_parent(signal.SIGTERM),
            process_group=0,  # as the other children: see _start_children
        )
        children.append(Child(name="witness", process=process))
        self.witness_line = f"  Witness:    {url}  ({vkey})"
        return f"{vkey} {url}"

    def _start_children(
        self, children: list[Child], *, database_url: str, port: int, no_worker: bool
    ) -> str:
        """Start the servers, adding each to ``children`` as soon as it runs; return
        the MCP server's URL."""
        env = dict(os.environ)
        env["DATABASE_URL"] = database_url
        env.setdefault("DJANGO_DEBUG", "1")
        env["PYTHONUNBUFFERED"] = "1"  # logs appear as they happen
        level = children_log_level()
        env["PORTAL_LOG_LEVEL"] = level  # config/settings.py's root logger
        # The access log and Celery's start-up banner only when logs are verbose.
        access_log = ["--access-logfile", "-"] if _verbose(level) else []
        quiet = [] if _verbose(level) else ["--quiet"]
        var_dir = Path(settings.VAR_DIR)
        if "PROMETHEUS_MULTIPROC_DIR" not in env:
            # One metrics folder for gunicorn's workers and the Celery worker's pool,
            # emptied here, before any of them starts (docs/observability.md).
            metrics_dir = var_dir / "metrics"
            shutil.rmtree(metrics_dir, ignore_errors=True)
            metrics_dir.mkdir(parents=True)
            env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        commands = {
            "web server": [
                "gunicorn", "config.wsgi:application", "-b", f"127.0.0.1:{port}",
                "--config", str(Path(settings.BASE_DIR) / "gunicorn.conf.py"),
                "--workers", "2", "--graceful-timeout", "10", *access_log,
                "--log-level", level.lower(),
                # Its default socket is one per user ($HOME/.gunicorn): a second
                # portal checkout would fight over it.
                "--no-control-socket",
            ],
        }  # fmt: skip
        if not no_worker:
            # kombu's filesystem transport does not create its folders.
            options = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {})
            for key, value in options.items():
                if key.endswith("_folder") or key.startswith("data_folder_"):
                    Path(value).mkdir(parents=True, exist_ok=True)
            if not settings.PRODUCTION and "PORTAL_AUDIT_WITNESSES" not in env:
                env["PORTAL_AUDIT_WITNESSES"] = self._start_witness(children, env=env)
            commands["Celery worker"] = [
                "celery", *quiet, "-A", "config", "worker",
                f"--loglevel={level}", "--concurrency=2",
            ]  # fmt: skip
            commands["Celery beat"] = [
                "celery", *quiet, "-A", "config", "beat", f"--loglevel={level}",
                "--schedule", str(var_dir / "celerybeat-schedule"),
            ]  # fmt: skip
        for name, command in commands.items():
            self._say(f"starting {name}: {' '.join(command)}")
            process = subprocess.Popen(  # noqa: S603 (fixed commands)
                # The venv's interpreter, whatever PATH says.
                [sys.executable, "-m", *command],
                stdin=subprocess.DEVNULL,
                cwd=settings.BASE_DIR,
                env=env,
                preexec_fn=embedded_db.die_with_parent(signal.SIGTERM),
                # Own process group: Ctrl-C reaches only `up`, which stops the
                # children in order; killpg then also reaches their workers.
                process_group=0,
            )
            children.append(Child(name=name, process=process))
        # The MCP server names the portal as the issuer of its Bearer keys; its spans
        # are the MCP server's (manage.py would name them portal-command).
        mcp_env = {"OTEL_SERVICE_NAME": "portal-mcp", **env, "PORTAL_PORT": str(port)}
        return self._start_mcp(children, env=mcp_env)

    def _supervise(
        self,
        *,
        children: list[Child],
        server: embedded_db.EmbeddedServer | None,
        port: int,
        secret: str | None,
        desk_url: str | None,
        mcp_url: str,
    ) -> int:
        """Wait until a child or the database exits; return the exit code for up.

        Once the web server listens, the banner; again each time Enter is pressed.
        """
        web_deadline: float | None = time.monotonic() + WEB_START_TIMEOUT
        asked = threading.Event()

        def banner() -> None:
            self._banner(
                port=port,
                server=server,
                secret=secret,
                desk_url=desk_url,
                mcp_url=mcp_url,
            )

        while True:
            if server is not None and (returncode := server.poll()) is not None:
                self._say(f"PostgreSQL exited with code {returncode}; stopping")
                return _exit_code(returncode)
            for child in children:
                if (returncode := child.process.poll()) is not None:
                    self._say(f"{child.name} exited with code {returncode}; stopping")
                    return _exit_code(returncode)
            if web_deadline is not None:
                if _accepts_connections(port):
                    web_deadline = None
                    banner()
                    if self.stdin is not None:
                        threading.Thread(
                            target=_wait_for_enter,
                            args=(self.stdin, asked),
                            name="up-enter",
                            daemon=True,
                        ).start()
                elif time.monotonic() > web_deadline:
                    self._say(f"the web server did not listen on port {port}; stopping")
                    return 1
            elif asked.is_set():
                asked.clear()
                banner()
            time.sleep(_POLL_SECONDS)

    def _stop_children(self, children: list[Child]) -> None:
        """SIGTERM all (graceful), wait, then SIGKILL what is left of each group."""
        for child in reversed(children):
            if child.process.poll() is None:
                child.process.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT
        for child in reversed(children):
            try:
                child.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._say(f"{child.name} did not stop in {STOP_TIMEOUT:.0f} s; killing")
            # The group outlives its leader while a worker process lingers.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.process.pid, signal.SIGKILL)
            child.process.wait()
            self._say(f"{child.name} stopped")

    def _banner(
        self,
        *,
        port: int,
        server: embedded_db.EmbeddedServer | None,
        secret: str | None,
        desk_url: str | None,
        mcp_url: str,
    ) -> None:
        base = f"http://127.0.0.1:{port}"
        lines = [
            "",
            "The agent governance portal is up.",
            f"  Admin:      {base}/admin/",
            f"  API:        {base}/api/v1/",
            f"  MCP:        {mcp_url}  (streamable HTTP; Bearer: an agent key)",
        ]
        if secret is not None:
            for username, password, role in USERS:
                lines.append(f"  Log in as:  {username} / {password}  ({role.label})")
            lines.append(f"  Agent key:  Authorization: Bearer {secret}")
        if desk_url is not None:
            lines.append(f"  Ticket desk: {desk_url}  (demo target 'ticket-desk')")
        if self.witness_line is not None:
            lines.append(self.witness_line)
        if server is not None:
            app_url = db_roles.url_as(server.url, user=db_roles.APP_ROLE)
            lines.append(
                f"  Database:   {app_url} (embedded, {server.data_dir}; "
                f"migrations as {db_roles.OWNER_ROLE})"
            )
        if secret is not None and desk_url is not None:
            lines.append(
                "  Try:        .venv/bin/python examples/customer_issue_agent.py "
                f"--base-url {base} --api-key {secret}"
            )
        lines += [
            "Press Enter to show this again, Ctrl-C to stop everything. Logs: "
            f"{children_log_level()} and above (PORTAL_LOG_LEVEL=INFO for all).",
            "",
        ]
        self.stdout.write("\n".join(lines))
        # A pipe (`up | tee log`, a test) buffers stdout; the banner is needed now.
        self.stdout.flush()

    def _say(self, message: str) -> None:
        self.stderr.write(f"up: {message}")
        self.stderr.flush()
