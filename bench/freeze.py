"""The kill switch under load: from a person's freeze click to the last call let
through, with eight agent processes calling as fast as they can (issue 22 §2).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/portal \\
        .venv/bin/python bench/freeze.py [--agents 8] [--freeze agent|tenant] \\
        [--seconds 4] [--workers 4] [--base-url URL]

One command: it seeds a tenant of its own (``bench-freeze-<run>``) with the agents,
their keys and a tenant administrator in the database of ``DATABASE_URL`` (already
migrated, as ``manage.py up`` leaves it), starts gunicorn with ``--workers`` worker
processes on a free port (the API throttle raised so it never answers first), and
then:

1. each agent is its own OS process calling ``GET /api/v1/tasks`` with its key in
   a loop, all released together by a barrier;
2. after ``--warmup`` seconds the administrator, logged in through the admin's form,
   clicks: ``POST /api/v1/tenants/<slug>/agents/<id>/freeze`` (agent 0) or
   ``…/freeze`` (the whole tenant), the staff API the admin's button calls the
   same service through;
3. the calls go on for ``--seconds`` in all.

The figures, all on the machine's one monotonic clock, measured from the moment the
click was sent: the click's round trip; when the last call of a frozen agent that
was *accepted* came back (negative: before the click was even sent); when its first
refusal came back; how many of its calls sent after the click's answer were
accepted (must be 0); and how many calls of the agents left running were refused
(must be 0). ``--base-url`` runs against a portal already up instead (its
``PORTAL_AGENT_RATE_LIMIT`` must not answer 429 first).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

sys.path[0] = str(Path(__file__).resolve().parent.parent)

import httpx  # noqa: E402

REPO: Final = Path(__file__).resolve().parent.parent
FROZEN_CODES: Final = frozenset({"AGENT_FROZEN", "TENANT_FROZEN"})
# A call: (sent, answered) on time.monotonic(), the HTTP status and problem code.
Call = tuple[float, float, int, str]


@dataclass(frozen=True, kw_only=True)
class Seeded:
    tenant_slug: str
    agent_ids: tuple[str, ...]
    secrets: tuple[str, ...]
    admin: str
    password: str


def seed(*, agents: int, run_id: str) -> Seeded:
    """A tenant with ``agents`` agents (one key each) and an administrator."""
    from django.contrib.auth.models import User

    from portal import services as portal_services
    from portal.models import Role

    tenant = portal_services.tenant_create(
        slug=f"bench-freeze-{run_id}", name=f"Freeze bench {run_id}"
    )
    made = [
        portal_services.agent_create(tenant=tenant, name=f"bench-agent-{n}")
        for n in range(agents)
    ]
    keys = [portal_services.agent_key_issue(agent=agent).secret for agent in made]
    password = secrets.token_urlsafe(18)
    admin = User.objects.create_user(
        f"bench-freeze-{run_id}", password=password, is_staff=True
    )
    portal_services.membership_grant(tenant=tenant, user=admin, role=Role.ADMIN)
    return Seeded(
        tenant_slug=tenant.slug,
        agent_ids=tuple(str(agent.pk) for agent in made),
        secrets=tuple(keys),
        admin=admin.username,
        password=password,
    )


def _agent_calls(
    base_url: str, secret: str, barrier: Any, seconds: float
) -> list[Call]:
    """One agent process: call as fast as it can for ``seconds`` after the barrier."""
    calls: list[Call] = []
    with httpx.Client(
        base_url=base_url, headers={"Authorization": f"Bearer {secret}"}, timeout=30
    ) as http:
        http.get("/api/v1/")  # the connection is up before the clock starts
        barrier.wait()
        stop_at = time.monotonic() + seconds
        while time.monotonic() < stop_at:
            sent = time.monotonic()
            answer = http.get("/api/v1/tasks")
            code = "" if answer.status_code == 200 else answer.json().get("code", "")
            calls.append((sent, time.monotonic(), answer.status_code, code))
    return calls


def person_session(*, base_url: str, username: str, password: str) -> httpx.Client:
    """An HTTP client logged in through the admin's login form, as a person is
    (open: close it)."""
    http = httpx.Client(base_url=base_url, timeout=30)
    http.get("/admin/login/")
    logged_in = http.post(
        "/admin/login/?next=/admin/",
        data={
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": http.cookies["csrftoken"],
        },
    )
    if logged_in.status_code != 302:
        raise RuntimeError(f"login failed: HTTP {logged_in.status_code}")
    return http


@dataclass(frozen=True, kw_only=True)
class Figures:
    agents: int
    freeze: str
    calls: int
    seconds: float
    click_ms: float
    last_accepted_ms: float  # of a frozen agent, from the click sent; < 0: before
    first_refused_ms: float
    accepted_after_answer: int  # frozen agents' calls sent after the click's answer
    others_refused: int  # calls of the agents left running that were refused

    def report(self) -> str:
        return (
            f"{self.agents} agent processes, freeze {self.freeze}: "
            f"{self.calls} calls in {self.seconds:.1f} s; click round trip "
            f"{self.click_ms:.0f} ms; last accepted call of a frozen agent back "
            f"{self.last_accepted_ms:+.0f} ms after the click was sent; first "
            f"refusal back at {self.first_refused_ms:+.0f} ms; accepted after the "
            f"click's answer: {self.accepted_after_answer}; others refused: "
            f"{self.others_refused}"
        )


def measure(
    *,
    base_url: str,
    seeded: Seeded,
    freeze: str = "agent",
    seconds: float = 4.0,
    warmup: float = 1.5,
) -> Figures:
    """Run the agents, click freeze after ``warmup`` s, and measure (the module's
    docstring says what)."""
    n = len(seeded.secrets)
    context = multiprocessing.get_context("spawn")
    manager = context.Manager()
    barrier = manager.Barrier(n + 1, timeout=120)
    person = person_session(
        base_url=base_url, username=seeded.admin, password=seeded.password
    )
    with context.Pool(n) as pool:
        results = [
            pool.apply_async(_agent_calls, (base_url, secret, barrier, seconds))
            for secret in seeded.secrets
        ]
        barrier.wait()
        started = time.monotonic()
        time.sleep(warmup)
        url = f"/api/v1/tenants/{seeded.tenant_slug}/freeze"
        if freeze == "agent":
            url = url.replace("/freeze", f"/agents/{seeded.agent_ids[0]}/freeze")
        clicked = time.monotonic()
        answer = person.post(url, headers={"X-CSRFToken": person.cookies["csrftoken"]})
        answered = time.monotonic()
        if answer.status_code != 200:
            raise RuntimeError(f"freeze: HTTP {answer.status_code} {answer.text}")
        calls = [result.get(timeout=seconds + 120) for result in results]
    person.close()
    manager.shutdown()
    frozen = calls if freeze == "tenant" else calls[:1]
    others = [] if freeze == "tenant" else calls[1:]
    mine = [call for agent in frozen for call in agent]
    accepted = [done for _, done, status, _ in mine if status == 200]
    refused = [done for _, done, status, code in mine if code in FROZEN_CODES]
    if not refused:
        raise RuntimeError("no call was refused: run longer after the click")
    return Figures(
        agents=n,
        freeze=freeze,
        calls=sum(len(agent) for agent in calls),
        seconds=time.monotonic() - started,
        click_ms=(answered - clicked) * 1000,
        last_accepted_ms=(max(accepted) - clicked) * 1000 if accepted else float("nan"),
        first_refused_ms=(min(refused) - clicked) * 1000,
        accepted_after_answer=sum(
            1 for sent, _, status, _ in mine if sent > answered and status == 200
        ),
        others_refused=sum(
            1 for agent in others for sent, _, status, _ in agent
            if sent > clicked and status != 200
        ),
    )  # fmt: skip


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serve(*, workers: int, log_path: Path) -> Iterator[str]:
    """gunicorn with ``workers`` processes on a free port, against DATABASE_URL;
    yields its base URL. The API throttle is raised out of the way."""
    port = _free_port()
    env = {
        **os.environ,
        "PORTAL_DEV_MODE": "1",
        "DJANGO_DEBUG": "0",
        "PORTAL_AGENT_RATE_LIMIT": "1000000/min",
    }
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "config.wsgi:application",
             "-b", f"127.0.0.1:{port}", "--workers", str(workers),
             "--no-control-socket"],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gunicorn did not start: {log_path.read_text()}")
            try:
                httpx.get(f"{base_url}/api/v1/", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        yield base_url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--freeze", choices=["agent", "tenant"], default="agent")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--warmup", type=float, default=1.5)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--base-url", default="")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("PORTAL_DEV_MODE", "1")
    import django

    django.setup()
    seeded = seed(agents=args.agents, run_id=secrets.token_hex(4))

    def run(base_url: str) -> Figures:
        return measure(
            base_url=base_url,
            seeded=seeded,
            freeze=args.freeze,
            seconds=args.seconds,
            warmup=args.warmup,
        )

    if args.base_url:
        figures = run(args.base_url)
    else:
        log_path = Path(os.environ.get("TMPDIR", "/tmp")) / "bench-freeze-gunicorn.log"
        with serve(workers=args.workers, log_path=log_path) as base_url:
            figures = run(base_url)
    print(figures.report())


if __name__ == "__main__":
    main()
