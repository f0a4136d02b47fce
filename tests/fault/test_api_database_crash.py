"""R11/R13: PostgreSQL restarted (``-m fast``) or crashed (``-m immediate``) on a
cadence while agents drive the API.

A real gunicorn (the repository's ``gunicorn.conf.py``) serves the test database;
``AGENTS`` separate processes (``tests/fault/api_agent.py``), one tenant each,
register tasks and list their tenant's tasks without pause. Every
``CADENCE_S`` seconds the server is restarted in the parametrized mode
(``tests/support/chaos.restart_database``); ``immediate`` kills it without a
shutdown checkpoint, so each start is a crash recovery from the WAL. Then:

- every answer is a success or a retryable 503 ``application/problem+json``
  (``DATABASE_UNAVAILABLE``, ``Retry-After`` ≥ 1); no 500, no dropped connection;
- every write the portal acknowledged (200/201) before a crash is in the database
  after it, in its tenant, once: the tasks in the database are exactly the ones
  acknowledged, none twice (a 503 retried with the same ``client_task_id``);
- every probe that succeeds lists its own tenant's tasks only, and each agent has
  a successful write and probe after the last recovery (it reconnected).

It restarts the server the tests use: ``PORTAL_FAULT_PGDATA`` names a private
one's data directory (docs/chaos.md); without it, the machine's cluster, so it runs
only in the slow phase, alone. Sizes: ``PORTAL_CHAOS_API_AGENTS`` (8),
``PORTAL_CHAOS_API_RESTARTS`` (2 per mode), ``PORTAL_CHAOS_API_CADENCE_S`` (3 s from
one recovery to the next restart).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from portal import services as portal_services
from portal.models import Agent, Tenant
from tasks.models import Task
from tests.http.conftest import Server, start, stop
from tests.support.chaos import Mode, restart_database

from .harness import REPO, env_float, env_int, retrying, write_report

AGENTS = env_int("PORTAL_CHAOS_API_AGENTS", 8)
RESTARTS = env_int("PORTAL_CHAOS_API_RESTARTS", 2)
CADENCE_S = env_float("PORTAL_CHAOS_API_CADENCE_S", 3.0)
# Writes each agent has acknowledged before the first restart (load is on).
WARMUP_WRITES = 3
WAIT_S = 120.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(int(300 + RESTARTS * (CADENCE_S + 60))),
]


@dataclass
class AgentProcess:
    name: str
    tenant: Tenant
    out: Path
    process: subprocess.Popen[bytes]

    def lines(self) -> list[dict[str, Any]]:
        text = self.out.read_text(encoding="utf-8") if self.out.exists() else ""
        # The last line may be half-written while the agent runs.
        return [json.loads(x) for x in text.splitlines() if x.endswith("}")]


@pytest.fixture
def api(transactional_db: None, tmp_path: Path) -> Iterator[Server]:
    running = start(debug=False, log_path=tmp_path / "gunicorn.log")
    try:
        yield running
    finally:
        stop(running)


def _start_agents(
    server: Server, tmp_path: Path, stop_file: Path
) -> list[AgentProcess]:
    agents = []
    for i in range(AGENTS):
        name = f"a{i}-{uuid.uuid4().hex[:6]}"
        tenant = Tenant.objects.create(slug=name, name=name)
        agent = Agent.objects.create(tenant=tenant, name=f"{name}-agent")
        secret = portal_services.agent_key_issue(agent=agent).secret
        out = tmp_path / f"{name}.jsonl"
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.fault.api_agent",
                server.base_url,
                name,
                secret,
                str(out),
                str(stop_file),
            ],
            cwd=REPO,
            env=dict(os.environ),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        agents.append(AgentProcess(name, tenant, out, process))
    return agents


def _acked(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [x for x in lines if x["kind"] == "write" and x["status"] in (200, 201)]


def _wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _stored(tenant: Tenant) -> dict[str, str]:
    """The tenant's tasks in the database: client_task_id → id."""
    rows = Task.objects.filter(tenant=tenant).values_list("client_task_id", "pk")
    return {cid: str(pk) for cid, pk in rows}


def _bad_answer(line: dict[str, Any]) -> bool:
    """Neither a success nor a retryable 503 problem."""
    if line["status"] in (200, 201):
        return False
    return not (
        line["status"] == 503
        and line.get("ctype") == "application/problem+json"
        and line.get("code") == "DATABASE_UNAVAILABLE"
        and int(line.get("retry_after") or 0) >= 1
    )


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_database_restarts_under_api_load_lose_no_acknowledged_write(
    mode: Mode, api: Server, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # Given AGENTS agent processes, one tenant each, writing and probing
    stop_file = tmp_path / "stop"
    agents = _start_agents(api, tmp_path, stop_file)
    restarts: list[dict[str, Any]] = []
    try:
        _wait_for(
            lambda: all(len(_acked(a.lines())) >= WARMUP_WRITES for a in agents),
            "every agent's first writes",
        )
        # When the server is restarted in `mode` on a cadence, under that load
        for _ in range(RESTARTS):
            acked_before = sum(len(_acked(a.lines())) for a in agents)
            down_at = time.time()
            how = restart_database(mode)
            up_at = time.time()
            restarts.append(
                {
                    "how": how,
                    "acked_before": acked_before,
                    "down_at": down_at,
                    "up_at": up_at,
                    "restart_took_s": round(up_at - down_at, 2),
                }
            )
            time.sleep(CADENCE_S)
        last_up = restarts[-1]["up_at"]

        def reconnected(agent: AgentProcess) -> bool:
            lines = [x for x in agent.lines() if x["t0"] > last_up]
            return any(x["status"] == 200 for x in lines if x["kind"] == "probe") and (
                len(_acked(lines)) > 0
            )

        _wait_for(lambda: all(reconnected(a) for a in agents), "every agent back")
    finally:
        stop_file.touch()
        for agent in agents:
            try:
                agent.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                agent.process.kill()
                agent.process.wait()

    # Then: every answer a success or a retryable 503 problem
    lines = {a.name: a.lines() for a in agents}
    every = [x for agent_lines in lines.values() for x in agent_lines]
    bad = [x for x in every if _bad_answer(x)]
    unavailable = [x for x in every if x["status"] == 503]
    # Each write the portal acknowledged is in the database, once, in its tenant
    acked = {
        name: {x["tag"]: x["task_id"] for x in _acked(ls)} for name, ls in lines.items()
    }
    stored = {a.name: retrying(functools.partial(_stored, a.tenant)) for a in agents}
    lost = {
        name: sorted(set(acked[name].items()) - set(stored[name].items()))
        for name in acked
    }
    extra = {name: sorted(set(stored[name]) - set(acked[name])) for name in acked}
    # Each successful probe saw its own tenant's tasks only
    leaks = [
        (name, x["seen"])
        for name, ls in lines.items()
        for x in ls
        if x["kind"] == "probe"
        and x["status"] == 200
        and any(not cid.startswith(f"{name}-") for cid in x["seen"])
    ]
    # A 503 whose write had committed: the retry found it (200, not 201)
    statuses: dict[tuple[str, str], list[int | None]] = defaultdict(list)
    for name, ls in lines.items():
        for x in ls:
            if x["kind"] == "write":
                statuses[(name, x["tag"])].append(x["status"])
    kept_after_503 = sum(
        1 for s in statuses.values() if 503 in s and s[-1] == 200 and 201 not in s
    )
    for item in restarts:
        item["answered_503_during"] = sum(
            1 for x in unavailable if item["down_at"] <= x["t"] <= item["up_at"] + 5
        )
        # Acknowledged in the last second before the server went down: the writes
        # a crash would lose if a commit were acknowledged before it was durable.
        item["acked_in_last_1s"] = sum(
            1
            for x in every
            if x["kind"] == "write"
            and x["status"] in (200, 201)
            and item["down_at"] - 1 <= x["t"] <= item["down_at"]
        )
        del item["down_at"], item["up_at"]
    figures = {
        "test": request.node.name,
        "mode": mode,
        "agents": AGENTS,
        "cadence_s": CADENCE_S,
        "restarts": restarts,
        "requests": len(every),
        "answers": dict(Counter(str(x["status"]) for x in every)),
        "acknowledged_writes": sum(len(v) for v in acked.values()),
        "acknowledged_before_last_restart": restarts[-1]["acked_before"],
        "lost": sum(len(v) for v in lost.values()),
        "unacknowledged_in_db": sum(len(v) for v in extra.values()),
        "answered_503_but_kept": kept_after_503,
        "probes_ok": sum(
            1 for x in every if x["kind"] == "probe" and x["status"] == 200
        ),
        "scope_leaks": len(leaks),
    }
    write_report(request.node.name, figures)
    assert len(restarts) == RESTARTS
    assert bad == [], bad[:5]
    assert unavailable, "no request met a restart: the test did not test it"
    assert all(v == [] for v in lost.values()), lost
    assert all(v == [] for v in extra.values()), extra
    assert leaks == [], leaks[:3]
    assert "Traceback" not in api.log(), api.log()[-5000:]
