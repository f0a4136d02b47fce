"""A PostgreSQL cluster of the test's own: one etcd, N nodes under Patroni.

Debian's ``etcd-server`` and ``patroni`` (``.ci/run`` installs them) and the
PostgreSQL 15 binaries in ``/usr/lib/postgresql/15/bin``; nothing of the machine's
own services. Everything listens on 127.0.0.1 on free ports and lives in one
temporary folder: etcd's data, each node's data folder, socket folder and log.

Each node's configuration is deploy/ha/patroni-db1.yml, production's, with local
addresses and folders and short timings so that a failover takes seconds: ``synchronous_mode`` (a commit is acknowledged once
the synchronous standby has it), ``use_pg_rewind`` (a failed primary rejoins as a
replica), and ``primary_start_timeout: 0`` (a crashed primary is failed over at
once instead of restarted in place: the point of the exercise).

PostgreSQL refuses to run as root, so when the tests run as root etcd and Patroni
run as the ``postgres`` account, as the Debian services do.

``running_cluster(isolated=True)`` puts the first node (the bootstrap leader: its
Patroni and PostgreSQL) on a machine of its own: a network namespace reached from
this one over a veth pair (tests/support/netns.py, ``remote_link``), so that its
network can be stopped (``Cluster.cut``: its end of the pair goes down) while etcd
and the other nodes, which listen on this side's end, still reach each other. Needs
root, ``ip`` and ``nft`` (``netns.missing``); the namespace is removed afterwards,
and a killed run's by the next run (``netns.reap_stale``).

``bootstrap_portal`` makes the portal's database on the cluster the one way the
suite and ``up`` do it (portal/db_roles.py): the roles from the administrator's
URL, then ``manage.py migrate`` as the owner, which re-applies the app role's
grants; row-level security, the definer functions and the partitions come with
the migrations.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import yaml
from psycopg import sql

from portal import db_roles
from tests.deploy import support as deploy_support
from tests.support import netns
from tests.support.net import free_port

REPO = Path(__file__).resolve().parents[2]
PG_BIN = Path("/usr/lib/postgresql/15/bin")
START_TIMEOUT_S = 90.0
# The DCS timings (Patroni's): the leader key lives TTL seconds unless renewed each
# loop; short, so a lost primary is noticed and replaced within seconds.
TTL_S = 10
LOOP_WAIT_S = 1
RETRY_TIMEOUT_S = 3
SUPERUSER = "postgres"
FOLDER_PREFIX = "portal-ha-"
# In each cluster's folder: the pid of the test process that made it.
OWNER_FILE = "owner.pid"
# libpq's options in the cluster's URL (every portal process takes them): a peer
# that stops answering mid-connection (its machine's network is gone, no FIN, no RST)
# is given up after about TCP_USER_TIMEOUT_MS, not the kernel's 15 minutes of
# retransmissions (unacknowledged data: tcp_user_timeout; an idle wait for an answer:
# the keepalives, probed each second after one idle second).
TCP_USER_TIMEOUT_MS = 5000
LINK_OPTIONS = {
    "keepalives": "1",
    "keepalives_idle": "1",
    "keepalives_interval": "1",
    "keepalives_count": "3",
    "tcp_user_timeout": str(TCP_USER_TIMEOUT_MS),
}


def missing_tools() -> list[str]:
    """What the cluster needs and this machine lacks (empty: all there)."""
    missing = [tool for tool in ("etcd", "patroni") if shutil.which(tool) is None]
    missing += [
        str(PG_BIN / name)
        for name in ("postgres", "initdb", "pg_rewind", "pg_basebackup")
        if not (PG_BIN / name).exists()
    ]
    return missing


def _account() -> tuple[int, int] | None:
    """(uid, gid) to run the servers as: ``postgres`` when we are root, else us."""
    if os.geteuid() != 0:
        return None
    entry = pwd.getpwnam("postgres")
    return entry.pw_uid, entry.pw_gid


def _env() -> dict[str, str]:
    # PG* variables would override Patroni's own connection settings.
    env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _spawn(
    command: list[str], *, log: Path, link: netns.Link | None = None
) -> subprocess.Popen[bytes]:
    """``command`` in a session of its own, as ``postgres`` when we are root; inside
    ``link``'s network namespace if given (``Link.command``: the pid is the
    server's own)."""
    account = _account()
    if link is not None:
        assert account is not None, "a network namespace needs root"
        command = link.command(*command, user="postgres")
        account = None
    with log.open("ab") as out:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(),
            start_new_session=True,
            user=account[0] if account else None,
            group=account[1] if account else None,
        )


def _stop(process: subprocess.Popen[bytes], *, timeout: float = 20) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@dataclass
class Node:
    name: str
    pg_port: int
    rest_port: int
    folder: Path
    process: subprocess.Popen[bytes] | None = None
    # Where it listens; an isolated node's is its namespace's end of the link.
    host: str = "127.0.0.1"
    netns: str | None = None

    @property
    def data_dir(self) -> Path:
        return self.folder / "data"

    @property
    def config(self) -> Path:
        return self.folder / "patroni.yml"

    @property
    def log_path(self) -> Path:
        return self.folder / "patroni.log"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid, from its ``postmaster.pid``."""
        try:
            first = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
        except FileNotFoundError:
            return None
        return int(first) if first.strip().isdigit() else None

    def conninfo(
        self, *, user: str = SUPERUSER, dbname: str = "postgres", socket: bool = False
    ) -> str:
        """Over TCP; ``socket``: over its Unix socket (in its folder), which
        reaches an isolated node whatever its network does."""
        host = str(self.folder) if socket else self.host
        return f"host={host} port={self.pg_port} user={user} dbname={dbname}"


@dataclass
class Cluster:
    scope: str
    folder: Path
    etcd_port: int
    etcd: subprocess.Popen[bytes]
    nodes: list[Node] = field(default_factory=list)
    # The first node's network namespace and the pair to it (isolated clusters).
    link: netns.Link | None = None
    # Nodes whose network is cut now.
    cut_nodes: set[str] = field(default_factory=set)

    # --- addresses -------------------------------------------------------------

    def url(self, *, user: str = SUPERUSER, dbname: str = "postgres") -> str:
        """The multi-host URL the portal is given: libpq finds the primary, and
        gives up on a silent peer after about ``TCP_USER_TIMEOUT_MS``."""
        hosts = ",".join(f"{node.host}:{node.pg_port}" for node in self.nodes)
        query = "&".join(f"{key}={value}" for key, value in LINK_OPTIONS.items())
        return (
            f"postgres://{user}@{hosts}/{dbname}"
            f"?target_session_attrs=read-write&{query}"
        )

    @property
    def var_dir(self) -> Path:
        """The portal's var/ for commands run on this cluster (the audit key)."""
        return self.folder / "var"

    @property
    def etcd_host(self) -> str:
        return self.link.outer if self.link else "127.0.0.1"

    def node(self, name: str) -> Node:
        (found,) = [node for node in self.nodes if node.name == name]
        return found

    # --- what Patroni says -----------------------------------------------------

    def members(self) -> list[dict[str, Any]]:
        """Patroni's ``GET /cluster`` from the first node that answers."""
        errors: list[str] = []
        # A cut node's silence costs the whole timeout: ask it last.
        for node in sorted(self.nodes, key=lambda node: node.name in self.cut_nodes):
            try:
                answer = httpx.get(
                    f"http://{node.host}:{node.rest_port}/cluster", timeout=2
                )
                answer.raise_for_status()
                return list(answer.json()["members"])
            except (httpx.HTTPError, ValueError, KeyError) as error:
                errors.append(f"{node.name}: {error}")
        raise RuntimeError("no Patroni node answered: " + "; ".join(errors))

    def leader(self) -> str | None:
        with contextlib.suppress(RuntimeError):
            for member in self.members():
                if member["role"] == "leader" and member["state"] == "running":
                    return str(member["name"])
        return None

    def patronictl(self, *args: str) -> str:
        """``patronictl`` against this cluster (the first node's configuration)."""
        done = subprocess.run(
            ["patronictl", "-c", str(self.nodes[0].config), *args],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=30,
            check=True,
        )
        return done.stdout

    # --- waiting ---------------------------------------------------------------

    def wait_for(
        self, what: str, check: Any, *, timeout: float = START_TIMEOUT_S
    ) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            result = check()
            if result:
                return result
            for node in self.nodes:
                if node.process is not None and node.process.poll() is not None:
                    raise RuntimeError(
                        f"patroni {node.name} exited {node.process.returncode} "
                        f"waiting for {what}:\n{node.log()[-4000:]}"
                    )
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}:\n{self.report()}")
            time.sleep(0.2)

    def wait_for_leader(self, *, other_than: str | None = None) -> str:
        def check() -> str | None:
            leader = self.leader()
            return leader if leader and leader != other_than else None

        return str(self.wait_for("a leader", check))

    def wait_for_sync_standby(
        self, name: str, *, timeout: float = START_TIMEOUT_S
    ) -> None:
        """Until ``name`` replicates and is the synchronous standby."""

        def check() -> bool:
            with contextlib.suppress(RuntimeError):
                for member in self.members():
                    if member["name"] == name:
                        return bool(
                            member["role"] == "sync_standby"
                            and member["state"] in ("running", "streaming")
                        )
            return False

        self.wait_for(f"{name} as the synchronous standby", check, timeout=timeout)

    def report(self) -> str:
        """What each node logged last, for a failure message."""
        parts = []
        with contextlib.suppress(RuntimeError):
            parts.append(json.dumps(self.members(), indent=1))
        parts += [f"--- {node.name} ---\n{node.log()[-3000:]}" for node in self.nodes]
        return "\n".join(parts)

    # --- faults ----------------------------------------------------------------

    def kill_postmaster(self, name: str) -> int:
        """SIGKILL the postmaster of node ``name``; returns its pid."""
        pid = self.node(name).postmaster_pid()
        assert pid is not None, f"{name} has no running postmaster"
        os.kill(pid, signal.SIGKILL)
        return pid

    def cut(self, name: str) -> None:
        """Stop the network of node ``name``'s machine (an isolated cluster's)."""
        assert self.link is not None and self.node(name).netns == self.link.netns
        self.link.down()
        self.cut_nodes.add(name)

    def restore(self, name: str) -> None:
        assert self.link is not None and self.node(name).netns == self.link.netns
        self.link.up()
        self.cut_nodes.discard(name)


DEPLOYED_CONFIG = REPO / "deploy" / "ha" / "patroni-db1.yml"


def _patroni_yml(cluster: Cluster, node: Node) -> str:
    """One node's configuration: deploy/ha/patroni-db1.yml as production has it,
    with this machine's addresses and folders, trust on the loopback (the suite's
    server trusts 127.0.0.1 too) and short timings."""
    config: dict[str, Any] = yaml.safe_load(DEPLOYED_CONFIG.read_text())
    config["scope"] = cluster.scope
    config["name"] = node.name
    config["log"] = {"level": "INFO"}
    config["restapi"] = {
        "listen": f"{node.host}:{node.rest_port}",
        "connect_address": f"{node.host}:{node.rest_port}",
    }
    config["etcd3"] = {"hosts": [f"{cluster.etcd_host}:{cluster.etcd_port}"]}
    dcs = config["bootstrap"]["dcs"]
    dcs.update(ttl=TTL_S, loop_wait=LOOP_WAIT_S, retry_timeout=RETRY_TIMEOUT_S)
    dcs["postgresql"]["parameters"].update(
        wal_keep_size="128MB",
        max_connections=100,
        # Test data: the machine does not crash, a process does.
        fsync="off",
        # A primary whose network is cut finishes demoting itself only once its
        # WAL sender gives the unreachable standby up (its shutdown waits for it):
        # a third of PostgreSQL's 60 s, as the TTL is a third of production's.
        wal_sender_timeout="20s",
    )
    postgresql = config["postgresql"]
    networks = ["127.0.0.1/32"]
    if cluster.link is not None:
        networks.append(str(cluster.link.network))
    postgresql.update(
        listen=f"{node.host}:{node.pg_port}",
        connect_address=f"{node.host}:{node.pg_port}",
        data_dir=str(node.data_dir),
        bin_dir=str(PG_BIN),
        pgpass=str(node.folder / "pgpass"),
        pg_hba=[
            "local all all trust",
            "local replication all trust",
            *(f"host all all {network} trust" for network in networks),
            *(f"host replication all {network} trust" for network in networks),
        ],
    )
    postgresql["parameters"].update(
        unix_socket_directories=str(node.folder), shared_buffers="32MB"
    )
    # A replica clones the leader with pg_basebackup, which first waits for a
    # checkpoint; the default (spread) one paces its writes over up to 0.9 x
    # checkpoint_timeout (4.5 min) once the migrations have dirtied the buffers, and
    # the second node stayed "bootstrap from leader in progress" past the 90 s of
    # ``wait_for_sync_standby`` (pg_stat_progress_basebackup: "waiting for
    # checkpoint to finish"). A fast checkpoint takes a second here.
    postgresql["basebackup"] = [{"checkpoint": "fast"}]
    return yaml.safe_dump(config, sort_keys=False)


def _start_node(cluster: Cluster, node: Node) -> None:
    node.folder.mkdir(mode=0o700)
    node.config.write_text(_patroni_yml(cluster, node))
    account = _account()
    if account:
        for path in (node.folder, node.config):
            os.chown(path, *account)
    node.process = _spawn(
        ["patroni", str(node.config)],
        log=node.log_path,
        link=cluster.link if node.netns else None,
    )


def reap_stale_clusters() -> list[Path]:
    """Stop what is left of clusters whose test process is gone; their folders.

    A run killed before its cleanup (a CI timeout, a SIGKILLed pytest) leaves etcd,
    both Patroni and their postmasters running in sessions of their own, looping
    every second on a machine of two cores. A folder's ``owner.pid`` names the
    process that made it; when that process no longer runs, every process whose
    command line names the folder is killed and the folder removed. A folder
    without one (being made now, or older) is left alone.
    """
    reaped = []
    for folder in Path(tempfile.gettempdir()).glob(FOLDER_PREFIX + "*"):
        try:
            owner = int((folder / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if psutil.pid_exists(owner):
            continue
        mark = str(folder) + "/"
        left = []
        for process in psutil.process_iter(["cmdline", "name"]):
            with contextlib.suppress(psutil.Error):
                if any(mark in part for part in process.info["cmdline"] or []):
                    left.append(process)
        # Patroni first (else it may start PostgreSQL again); a postmaster gets
        # SIGQUIT, its immediate shutdown, which takes its backends with it.
        left.sort(key=lambda process: process.info["name"] == "postgres")
        for process in left:
            with contextlib.suppress(psutil.Error):
                if process.info["name"] == "postgres":
                    process.send_signal(signal.SIGQUIT)
                else:
                    process.kill()
        psutil.wait_procs(left, timeout=10)
        shutil.rmtree(folder, ignore_errors=True)
        reaped.append(folder)
    return reaped


@contextlib.contextmanager
def running_cluster(*, nodes: int = 2, isolated: bool = False) -> Iterator[Cluster]:
    """etcd and ``nodes`` Patroni nodes, the first the leader; the others are
    still cloning it when this yields (``wait_for_sync_standby``: until the second
    is the synchronous standby). All stopped, the folder removed afterwards.

    ``isolated``: the first node in a network namespace of its own
    (``netns.remote_link``), etcd and the others on this side's end of the link;
    ``Cluster.cut``."""
    if not isolated:
        with _running_cluster(nodes=nodes, link=None) as cluster:
            yield cluster
        return
    with netns.remote_link() as link, _running_cluster(nodes=nodes, link=link) as made:
        yield made


@contextlib.contextmanager
def _running_cluster(*, nodes: int, link: netns.Link | None) -> Iterator[Cluster]:
    missing = missing_tools()
    if missing:
        raise RuntimeError(
            "the HA cluster needs " + ", ".join(missing) + " (.ci/run installs "
            "them: apt-get install patroni etcd-server postgresql-15)"
        )
    reap_stale_clusters()
    folder = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))
    (folder / OWNER_FILE).write_text(str(os.getpid()))
    folder.chmod(0o755)
    account = _account()
    if account:
        os.chown(folder, *account)
    with contextlib.suppress(OSError):  # a pytest temp root may be 0700
        for parent in folder.parents:
            mode = parent.stat().st_mode
            if mode & 0o055 != 0o055:
                parent.chmod(mode | 0o055)
    etcd_host = link.outer if link else "127.0.0.1"
    etcd_port, peer_port = free_port(), free_port()
    etcd_dir = folder / "etcd"
    etcd_dir.mkdir()
    if account:
        os.chown(etcd_dir, *account)
    etcd = _spawn(
        [
            "etcd",
            "--name",
            "ha-test",
            "--data-dir",
            str(etcd_dir / "data"),
            "--listen-client-urls",
            f"http://{etcd_host}:{etcd_port}",
            "--advertise-client-urls",
            f"http://{etcd_host}:{etcd_port}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer_port}",
            "--initial-cluster",
            f"ha-test=http://127.0.0.1:{peer_port}",
            "--initial-cluster-state",
            "new",
            "--enable-v2=false",
            "--unsafe-no-fsync",
        ],
        log=etcd_dir / "etcd.log",
    )
    cluster = Cluster(
        scope=f"portal-ha-{os.getpid()}",
        folder=folder,
        etcd_port=etcd_port,
        etcd=etcd,
        link=link,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if etcd.poll() is not None:
                raise RuntimeError(
                    f"etcd exited {etcd.returncode}:\n"
                    + (etcd_dir / "etcd.log").read_text(errors="replace")[-3000:]
                )
            try:
                if httpx.get(
                    f"http://{etcd_host}:{etcd_port}/health", timeout=1
                ).is_success:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("etcd did not answer")
            time.sleep(0.1)
        for index in range(nodes):
            node = Node(
                name=f"node{index + 1}",
                pg_port=free_port(),
                rest_port=free_port(),
                folder=folder / f"node{index + 1}",
            )
            if link is not None:
                node.host = link.outer
                if index == 0:  # the bootstrap leader: on a machine of its own
                    node.host, node.netns = link.inner, link.netns
            cluster.nodes.append(node)
        # The first node bootstraps (initdb) alone; the others clone it.
        _start_node(cluster, cluster.nodes[0])
        cluster.wait_for_leader()
        for node in cluster.nodes[1:]:
            _start_node(cluster, node)
        yield cluster
    finally:
        # Every node at once, PostgreSQL first (an immediate shutdown: the data
        # is thrown away), then each Patroni.
        for node in cluster.nodes:
            pid = node.postmaster_pid()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGQUIT)
        for node in cluster.nodes:
            if node.process is not None and node.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.process.pid, signal.SIGTERM)
        for node in cluster.nodes:
            if node.process is not None:
                _stop(node.process, timeout=30)
        for node in cluster.nodes:
            # A postmaster Patroni left behind (it was SIGKILLed, say): stop it too.
            pid = node.postmaster_pid()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGQUIT)
        _stop(etcd)
        shutil.rmtree(folder, ignore_errors=True)


def bootstrap_portal(cluster: Cluster, *, dbname: str) -> str:
    """The portal's database on the cluster, as ``up`` and the suite make it.

    The roles from the administrator's URL (``db_roles.ensure_roles``), a database
    the owner owns, then ``manage.py migrate`` as the owner (it re-applies the app
    role's grants). Returns the app role's multi-host URL.
    """
    admin_url = cluster.url(dbname="postgres")
    db_roles.ensure_roles(admin_url)
    with psycopg.connect(**db_roles._conninfo(admin_url), autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(dbname), sql.Identifier(db_roles.OWNER_ROLE)
            )
        )
    app_url = cluster.url(user=db_roles.APP_ROLE, dbname=dbname)
    manage(
        cluster,
        "migrate",
        "--no-input",
        "-v",
        "0",
        database_url=app_url,
    )
    return app_url


def portal_env(cluster: Cluster, *, database_url: str, **extra: str) -> dict[str, str]:
    """The whole environment of a portal process on the cluster (a command, a
    Celery worker, beat): ``database_url`` (the app role's) and the owner's URL
    beside it, as a deployment gives both, the cluster's own var/ folder (the
    development audit key), and ``extra``."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key != "DJANGO_SECRET_KEY" and not key.startswith("PG")
    }
    env.update(
        DATABASE_URL=database_url,
        DATABASE_OWNER_URL=db_roles.url_as(database_url, user=db_roles.OWNER_ROLE),
        PORTAL_DEV_MODE="1",
        PORTAL_VAR_DIR=str(cluster.var_dir),
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def manage(
    cluster: Cluster, *args: str, database_url: str, env: dict[str, str] | None = None
) -> str:
    """``manage.py <args>`` on the cluster as the app role (the owner's URL beside
    it, as a deployment gives both), with the cluster's own var/ folder (the
    development audit key); returns what it printed.

    Raises:
        RuntimeError: the command failed (its output in the message).
    """
    done = deploy_support.manage(
        portal_env(cluster, database_url=database_url, **(env or {})),
        *args,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"manage.py {' '.join(args)} exited {done.returncode}:\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        )
    return done.stdout
