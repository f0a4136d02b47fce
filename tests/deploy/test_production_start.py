"""The production layout of deploy/ starts and serves the README demo agent.

A fresh database owned by ``portal_owner`` (as README "Database roles" makes it),
migrated by the owner with production settings; then gunicorn, one Celery worker and
the one beat as separate processes, each started with its unit's ``ExecStart``
(deploy/*.service, paths localised by tests/deploy/units.py) and the environment file
deploy/portal.env.example with its ``change-me`` values filled in (the audit
signing key only in the worker's environment, as its unit's credential). RabbitMQ is the
machine's (127.0.0.1:5672); a queue name and events exchange of this test keep it
apart from anything else there. In front of gunicorn sits what production puts
there: a proxy that says the request came over HTTPS (``X-Forwarded-Proto``). The
ticket desk is reached as the outbound URL policy lets production reach a private
address: over https (a test CA, trusted through ``SSL_CERT_FILE``) at a ``host:port``
named in ``PORTAL_OUTBOUND_ALLOWED_HOSTS``.
"""

from __future__ import annotations

import http.client
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit import checkpoints
from portal import db_roles
from tests.deploy import support, units
from tests.support.broker import (
    SHARED_URL,
    EventQueue,
    delete_exchange,
    delete_queue,
    ensure_shared_broker,
)
from tests.support.evidence import run_verifier
from tests.support.net import free_port
from tests.support.tls import make_certificates
from ticketdesk.harness import TicketDesk, start_ticketdesk

REPO = units.REPO
START_TIMEOUT_S = 90.0
AGENT_KEY = re.compile(r"issued a new API key for '[^']+': (\S+) \(shown once\)")
ISSUES = 3
# Read by the settings but not part of a production deployment.
DEVELOPMENT_ONLY = {
    "PORTAL_DEV_MODE",
    "PORTAL_EMBEDDED_PG_PORT",
    "PORTAL_TEST_DATABASE",
}


class _Proxy(BaseHTTPRequestHandler):
    """The TLS proxy's part that matters to the portal: X-Forwarded-Proto."""

    upstream: tuple[str, int] = ("127.0.0.1", 0)

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
        headers["X-Forwarded-Proto"] = "https"
        upstream = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            answer = upstream.getresponse()
            payload = answer.read()
            self.send_response(answer.status)
            for key, value in answer.getheaders():
                if key.lower() not in ("connection", "transfer-encoding"):
                    self.send_header(key, value)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload)
        finally:
            upstream.close()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def tls_proxy() -> Iterator[tuple[ThreadingHTTPServer, type[_Proxy]]]:
    handler = type("Proxy", (_Proxy,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, handler
    server.shutdown()
    server.server_close()


def _environment(*, database: str, tmp: Path, web_port: int) -> dict[str, str]:
    """deploy/portal.env.example with its placeholders filled for this machine.

    The audit key pair goes where deploy/README.md puts it (here in ``tmp``): the
    public half named by the environment file, the private key only as the worker
    unit's credential (``_start``)."""
    active, _ = units.environment_template()
    private = Ed25519PrivateKey.generate()
    (tmp / "audit-signing-key.pem").write_bytes(
        private.private_bytes(
            encoding=serialization.Encoding.PEM,
            format=serialization.PrivateFormat.PKCS8,
            encryption_algorithm=serialization.NoEncryption(),
        )
    )
    public_file = tmp / "audit-public-key.pem"
    public_file.write_text(checkpoints.public_key_pem(private.public_key()))
    filled = {
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
        "DJANGO_CSRF_TRUSTED_ORIGINS": "https://127.0.0.1",
        "DJANGO_STATIC_ROOT": str(tmp / "static"),
        "PORTAL_VAR_DIR": str(tmp / "state"),
        "PORTAL_BIND": f"127.0.0.1:{web_port}",
        "PORTAL_WEB_WORKERS": "2",  # as deploy/portal.env.example (two cores)
        "DATABASE_URL": support.url(database, role=db_roles.APP_ROLE),
        "CELERY_BROKER_URL": SHARED_URL,
        "PORTAL_CELERY_QUEUE": f"deploy-test-{uuid.uuid4().hex[:10]}",
        "PORTAL_EVENTS_EXCHANGE": f"portal.events.deploy-{uuid.uuid4().hex[:10]}",
        "PORTAL_AUDIT_PUBLIC_KEY_FILE": str(public_file),
        "PORTAL_REDACTION_SECRET": secrets.token_urlsafe(32),
    }
    # The test fills in only what the template names.
    assert set(filled) <= set(active), set(filled) - set(active)
    env = {**active, **filled}
    assert not [k for k, v in env.items() if "change-me" in v], env
    # What systemd gives a service besides its EnvironmentFile.
    env.update(PATH=os.environ["PATH"], HOME=str(tmp), LANG="C.UTF-8")
    return env


def _start(name: str, env: dict[str, str], tmp: Path) -> subprocess.Popen[bytes]:
    """The unit's ``ExecStart`` with the environment file, its own ``Environment=``
    and its ``LoadCredential=`` files (from ``tmp``, by name) as systemd gives them."""
    service = units.unit(name)["Service"]
    workdir = units.localise(service["WorkingDirectory"], state_dir=tmp / "state")
    credentials_dir = tmp / "credentials" / name
    credentials_dir.mkdir(parents=True)
    for credential, source in units.credentials(name).items():
        shutil.copyfile(tmp / Path(source).name, credentials_dir / credential)
    unit_env = units.environment(name, credentials_dir=credentials_dir)
    with (tmp / f"{name}.log").open("wb") as log:
        return subprocess.Popen(
            units.command(name, state_dir=tmp / "state"),
            cwd=workdir,
            env={**env, **unit_env},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _wait_for(
    condition: Any, what: str, processes: dict[str, subprocess.Popen[bytes]], tmp: Path
) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not condition():
        for name, process in processes.items():
            if process.poll() is not None:
                log = (tmp / f"{name}.log").read_text(errors="replace")
                pytest.fail(f"{name} exited {process.returncode}:\n{log[-5000:]}")
        if time.monotonic() > deadline:
            logs = {n: (tmp / f"{n}.log").read_text()[-3000:] for n in processes}
            pytest.fail(f"no {what} in {START_TIMEOUT_S:.0f} s: {logs}")
        time.sleep(0.5)


def _a_task_of(database: str) -> str:
    """A task the demo agent made (as the administrator, past row-level security)."""
    with psycopg.connect(
        dbname=database, autocommit=True, **support.admin_params()
    ) as conn:
        row = conn.execute("SELECT id FROM tasks_task ORDER BY id LIMIT 1").fetchone()
    assert row is not None
    return str(row[0])


def test_the_environment_template_names_every_setting() -> None:
    active, optional = units.environment_template()
    named = set(active) | set(optional)
    missing = units.settings_variables() - named - DEVELOPMENT_ONLY
    assert not missing, f"deploy/portal.env.example does not name {sorted(missing)}"
    assert not named & DEVELOPMENT_ONLY


def test_the_unit_files_verify() -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    with tempfile.TemporaryDirectory() as scratch:
        # The binaries must exist: the localised copies name this checkout's.
        for name in units.UNITS:
            text = (units.DEPLOY / f"{name}.service").read_text()
            local = units.localise(text, state_dir=Path(scratch))
            (Path(scratch) / f"{name}.service").write_text(local)
        done = subprocess.run(
            [analyze, "verify", *sorted(str(p) for p in Path(scratch).iterdir())],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), (
        done.stdout + done.stderr
    )


@pytest.mark.timeout(900)  # migrate, three services and the agent, machine shared
def test_the_production_layout_starts_and_serves_the_demo_agent(
    make_database: Callable[[str], str],
    tmp_path: Path,
    tls_proxy: tuple[ThreadingHTTPServer, type[_Proxy]],
) -> None:
    reason = ensure_shared_broker(SHARED_URL)
    if reason is not None:
        pytest.fail(reason)  # a service the suite needs (.ci/run starts it)
    database = make_database("deploy")
    web_port = free_port()
    env = _environment(database=database, tmp=tmp_path, web_port=web_port)
    (tmp_path / "state").mkdir()
    owner_url = support.url(database, role=db_roles.OWNER_ROLE)

    # Given: migrated by the owner and static files collected, as deploy/README.md
    # says, with production settings.
    migrated = support.manage(
        {**env, "DATABASE_OWNER_URL": owner_url}, "migrate", "--noinput"
    )
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    collected = support.manage(env, "collectstatic", "--noinput")
    assert collected.returncode == 0, collected.stdout + collected.stderr
    # And: Django's deployment checklist has nothing to say about these settings.
    check = support.manage(env, "check", "--deploy", "--fail-level", "DEBUG")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "System check identified no issues (0 silenced)." in check.stdout, (
        check.stdout + check.stderr
    )

    # And: the desk over https, with a certificate of a test CA the portal's
    # processes trust (httpx reads SSL_CERT_FILE), its host:port allowed.
    certs = make_certificates(tmp_path / "tls")
    desk: TicketDesk = start_ticketdesk(tls=(certs.cert, certs.key), ca_file=certs.ca)
    assert desk.url.startswith("https://127.0.0.1:"), desk.url
    env["SSL_CERT_FILE"] = str(certs.ca)
    env["PORTAL_OUTBOUND_ALLOWED_HOSTS"] = desk.url.removeprefix("https://")
    # And: the demo's tenant, contract, connector and agent key (seed_demo refuses
    # production, so it runs with DEBUG on, the same secrets and database).
    events = EventQueue(url=SHARED_URL, exchange=env["PORTAL_EVENTS_EXCHANGE"])
    events.declare()
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        seeded = support.manage(
            {**env, "DJANGO_DEBUG": "1"},
            "seed_demo",
            "--ticketdesk-url",
            desk.url,
            "--ticketdesk-keys",
            str(desk.keys_path),
        )
        assert seeded.returncode == 0, seeded.stdout + seeded.stderr
        match = AGENT_KEY.search(seeded.stdout + seeded.stderr)
        assert match, seeded.stdout
        key = match[1]

        # When: the three units' processes start.
        for name in units.UNITS:
            processes[name] = _start(name, env, tmp_path)

        def answers() -> bool:
            try:
                # Straight to gunicorn (plain HTTP): production redirects to HTTPS.
                got = httpx.get(f"http://127.0.0.1:{web_port}/api/v1/", timeout=2)
                return got.status_code == 301
            except httpx.TransportError:
                return False

        def log(name: str) -> str:
            return (tmp_path / f"{name}.log").read_text(errors="replace")

        _wait_for(answers, "answer from gunicorn", processes, tmp_path)
        _wait_for(
            lambda: " ready." in log("portal-worker"),
            "ready worker",
            processes,
            tmp_path,
        )

        # Then: the README demo agent, through the proxy, ends as the README says.
        proxy, handler = tls_proxy
        handler.upstream = ("127.0.0.1", web_port)
        base_url = f"http://127.0.0.1:{proxy.server_address[1]}"
        script = str(REPO / "examples" / "customer_issue_agent.py")
        demo = [sys.executable, script, "--base-url", base_url, "--api-key", key]
        agent = subprocess.run(
            [*demo, "--issues", str(ISSUES)],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=REPO,
            env={k: v for k, v in os.environ.items() if "proxy" not in k.lower()},
            check=False,
        )
        assert agent.returncode == 0, agent.stdout + agent.stderr
        assert f"issue-{ISSUES}: handed to a person: FIELD_STALE" in agent.stdout
        assert len(desk.tickets()) == ISSUES - 1
        # (over verified TLS: the desk saw no failed handshake)
        assert "TLS handshake" not in desk.log_path.read_text()
        # And: the worker ran the relay (the commits' nudges): the events left.
        received = events.drain(expected=1, timeout=60)
        assert received, "no event published"
        # And: beat sends its jobs, which the worker runs (reap-leases every 5 s).
        _wait_for(
            lambda: (
                "tasks.jobs.reap_leases_job" in log("portal-worker")
                and "Sending due task" in log("portal-beat")
            ),
            "job from beat",
            processes,
            tmp_path,
        )
        # And: the web publishes the worker's public key from its file, and an
        # evidence bundle exported through it verifies offline, though the web's
        # environment holds no private key (the worker signed).
        assert not [k for k in env if k.startswith("PORTAL_AUDIT_SIGNING_KEY")]
        assert units.credentials("portal-web") == {}
        assert units.environment("portal-web", credentials_dir=tmp_path) == {}
        published = httpx.get(f"{base_url}/api/v1/audit/public-key", timeout=10)
        assert published.status_code == 200, published.text
        public_pem = (tmp_path / "audit-public-key.pem").read_text()
        assert published.json()["public_key_pem"] == public_pem
        task_id = _a_task_of(database)
        exported = httpx.get(
            f"{base_url}/api/v1/tasks/{task_id}/evidence",
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
        )
        assert exported.status_code == 200, exported.text
        assert exported.json()["coverage"]["complete"], exported.json()["coverage"]
        (tmp_path / "bundle.json").write_bytes(exported.content)
        verified = run_verifier(
            tmp_path / "bundle.json", tmp_path / "audit-public-key.pem"
        )
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert verified.stdout.startswith("intact"), verified.stdout
        for name in units.UNITS:
            assert "Traceback" not in log(name), log(name)[-5000:]
    finally:
        for process in processes.values():
            _stop(process)
        desk.stop()
        events.delete()
        delete_exchange(SHARED_URL, env["PORTAL_EVENTS_EXCHANGE"])
        delete_queue(SHARED_URL, env["PORTAL_CELERY_QUEUE"])
