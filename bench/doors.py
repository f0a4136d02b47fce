"""The one-call action and the MCP tool call, on a portal this command starts.

    .venv/bin/python bench/doors.py [--database-url postgres://.../portal_doors_bench]
        [--actions 40] [--mcp-actions 20] [--clients 1,8] [--slice 10]
        [--json reports/bench-doors.json]

Drops and creates its database (the name must contain "bench"), then runs
``manage.py up --no-worker`` on it, as a person would (gunicorn from
``gunicorn.conf.py``, the MCP server, the real ticket desk, the seeded demo agent),
with ``DJANGO_DEBUG=0`` as deployed (``up`` turns debug on by default, which costs
about a third more CPU per action in Django's query recording). Against it:

- ``bench/actions.py``: the one call against the six-call lifecycle, one client,
  alternating slices (actions per second, and the ratio);
- ``bench/mcp_actions.py``: an MCP tool call against the REST one call at each
  ``--clients``, alternating slices (p50 / p99, and MCP's p50 over REST's);
- server CPU per action of each door, one client: the web server's processes and
  the MCP server's, read from ``/proc`` around runs of one door alone (the
  object-version ``PUT`` before each action is counted in both). CPU per action
  barely moves with the machine's other load, where latencies do.

``bench/peers.py --also doors`` runs it as one of its side rows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

sys.path[0] = str(Path(__file__).resolve().parent.parent)

import httpx2  # noqa: E402
import psutil  # noqa: E402
import psycopg  # noqa: E402
from mcp import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from psycopg import sql  # noqa: E402

from bench import actions as bench_actions  # noqa: E402
from bench import mcp_actions as bench_mcp  # noqa: E402
from portal_client import PortalClient  # noqa: E402

REPO: Final = Path(__file__).resolve().parent.parent
DEFAULT_DATABASE_URL: Final = "postgres://postgres@127.0.0.1:5432/portal_doors_bench"
JSON_REPORT: Final = REPO / "reports" / "bench-doors.json"
START_TIMEOUT_S: Final = 300.0
_BANNER: Final = {
    "api": re.compile(r"^\s*API:\s+(?P<v>http://\S+?)/api/v1/", re.M),
    "mcp": re.compile(r"^\s*MCP:\s+(?P<v>http://\S+)", re.M),
    "key": re.compile(r"^\s*Agent key:\s+Authorization: Bearer (?P<v>\S+)", re.M),
}


def say(message: str) -> None:
    print(message, flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def recreate(url: str) -> None:
    name = str(psycopg.conninfo.conninfo_to_dict(url).get("dbname", ""))
    if "bench" not in name:
        raise SystemExit(f"refusing to drop {name!r}: its name must contain 'bench'")
    admin = psycopg.conninfo.make_conninfo(url, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)
            )
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


@dataclass(frozen=True, kw_only=True)
class Portal:
    base_url: str
    mcp_url: str
    key: str
    process: subprocess.Popen[bytes]

    def listener_tree_cpu_s(self, url: str) -> float:
        """CPU seconds so far of the server listening on ``url``'s port: its
        master (or supervisor) and every process under it."""
        port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
        pid = next(
            c.pid
            for c in psutil.net_connections(kind="tcp")
            if c.status == "LISTEN" and c.laddr.port == port and c.pid
        )
        top = psutil.Process(pid)
        up = psutil.Process(self.process.pid)
        while (parent := top.parent()) is not None and parent.pid != up.pid:
            top = parent
        total = 0.0
        for proc in [top, *top.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                times = proc.cpu_times()
                total += times.user + times.system
        return total


@contextlib.contextmanager
def running_portal(database_url: str, log_path: Path) -> Iterator[Portal]:
    """``manage.py up --no-worker`` on its own ports and var folder; stopped after."""
    var = log_path.parent / "var"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PORTAL_NO_BOOTSTRAP", "DJANGO_SECRET_KEY"}
    }
    env.update(
        DATABASE_URL=database_url,
        DJANGO_DEBUG="0",
        PORTAL_DEV_MODE="1",
        PORTAL_VAR_DIR=str(var),
        PORTAL_MCP_PORT=str(free_port()),
        PORTAL_NO_BOOTSTRAP="1",
    )
    command = [
        sys.executable, "manage.py", "up", "--no-worker",
        "--port", str(free_port()), "--ticketdesk-port", str(free_port()),
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,  # kept open: up reads Enter from it
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        found: dict[str, str] = {}
        while time.monotonic() < deadline and len(found) < len(_BANNER):
            if process.poll() is not None:
                raise RuntimeError(f"up exited:\n{log_path.read_text()[-3000:]}")
            text = log_path.read_text(errors="replace")
            found = {
                name: match.group("v")
                for name, pattern in _BANNER.items()
                if (match := pattern.search(text))
            }
            time.sleep(0.5)
        if len(found) < len(_BANNER):
            raise RuntimeError(f"no banner from up:\n{log_path.read_text()[-3000:]}")
        yield Portal(
            base_url=found["api"],
            mcp_url=found["mcp"],
            key=found["key"],
            process=process,
        )
    finally:
        if process.stdin is not None:
            process.stdin.close()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def cpu_per_action(portal: Portal, *, actions: int) -> dict[str, dict[str, float]]:
    """Server CPU ms per action of each door alone, one client: web and MCP."""
    run = secrets.token_hex(3)

    def both() -> tuple[float, float]:
        return (
            portal.listener_tree_cpu_s(portal.base_url),
            portal.listener_tree_cpu_s(portal.mcp_url),
        )

    out: dict[str, dict[str, float]] = {}
    names = [f"cpu-{run}-rest-{n}" for n in range(actions)]
    web_0, mcp_0 = both()
    bench_mcp._rest_slice(portal.base_url, portal.key, names)
    web_1, mcp_1 = both()
    out["rest"] = {
        "web_ms": 1000 * (web_1 - web_0) / actions,
        "mcp_ms": 1000 * (mcp_1 - mcp_0) / actions,
    }
    out["mcp"] = asyncio.run(_mcp_cpu(portal, both, run=run, actions=actions))
    return out


async def _mcp_cpu(
    portal: Portal, both: Any, *, run: str, actions: int
) -> dict[str, float]:
    """As ``bench_mcp._mcp_slice``, with the session opened and the tools listed
    before the CPU is read: an agent opens its session once, not per call."""
    async with (
        httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {portal.key}"}, timeout=60
        ) as http,
        streamable_http_client(portal.mcp_url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        listed = await session.list_tools()
        tool = next(
            t.name for t in listed.tools if t.name.startswith(bench_mcp.TOOL_PREFIX)
        )
        with PortalClient(portal.base_url, portal.key) as client:
            web_0, mcp_0 = both()
            for n in range(actions):
                name = f"cpu-{run}-mcp-{n}"
                client.record_object_version(
                    bench_actions.OBJECT_TYPE, name, version="1"
                )
                result = await session.call_tool(tool, bench_mcp.tool_arguments(name))
                answer = result.structured_content or {}
                if result.is_error or answer.get("status") != "verified":
                    raise RuntimeError(f"{name}: {answer or result.content}")
            web_1, mcp_1 = both()
    return {
        "web_ms": 1000 * (web_1 - web_0) / actions,
        "mcp_ms": 1000 * (mcp_1 - mcp_0) / actions,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/doors.py", description=__doc__)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DOORS_DATABASE_URL", DEFAULT_DATABASE_URL),
    )
    parser.add_argument("--actions", type=int, default=40, help="one vs six, each")
    parser.add_argument(
        "--mcp-actions", type=int, default=20, help="per client and door"
    )
    parser.add_argument("--clients", default="1,8")
    parser.add_argument("--slice", type=int, default=10)
    parser.add_argument("--json", type=Path, default=JSON_REPORT)
    parser.add_argument("--no-docs", action="store_true", help="(writes no docs)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    say(f"doors: recreating {args.database_url.rsplit('/', 1)[-1]}; starting up")
    recreate(args.database_url)
    load_before = os.getloadavg()
    with (
        tempfile.TemporaryDirectory(prefix="bench-doors-") as scratch,
        running_portal(args.database_url, Path(scratch) / "up.log") as portal,
    ):
        say(f"doors: portal {portal.base_url}, MCP {portal.mcp_url}")
        with PortalClient(portal.base_url, portal.key) as client:
            bench_actions.one_call(client, f"warm-{secrets.token_hex(4)}")
            bench_actions.six_calls(client, f"warm-{secrets.token_hex(4)}")
            flows = bench_actions.measure(
                client, actions=args.actions, slice_size=args.slice
            )
        say(
            f"doors: one call {flows.one_call_per_s:.1f}/s, six calls"
            f" {flows.six_calls_per_s:.1f}/s, ratio {flows.ratio:.2f}x"
        )
        cpu = cpu_per_action(portal, actions=args.mcp_actions)
        say(f"doors: server CPU ms per action {json.dumps(cpu)}")
        latency = []
        for clients in (int(c) for c in args.clients.split(",") if c):
            bench_mcp.measure(
                base_url=portal.base_url,
                mcp_url=portal.mcp_url,
                secret=portal.key,
                clients=clients,
                actions=1,
                slice_size=1,
            )  # warm both doors
            rest, mcp = bench_mcp.measure(
                base_url=portal.base_url,
                mcp_url=portal.mcp_url,
                secret=portal.key,
                clients=clients,
                actions=args.mcp_actions,
                slice_size=args.slice,
            )
            latency.append(
                {
                    "clients": clients,
                    "rest_p50_ms": rest.p50,
                    "rest_p99_ms": rest.p99,
                    "mcp_p50_ms": mcp.p50,
                    "mcp_p99_ms": mcp.p99,
                    "samples": len(rest.samples_ms),
                }
            )
            say(
                f"doors: {clients} client(s): REST p50 {rest.p50:.1f} p99"
                f" {rest.p99:.1f} ms; MCP p50 {mcp.p50:.1f} p99 {mcp.p99:.1f} ms;"
                f" MCP over REST p50 {mcp.p50 - rest.p50:+.1f} ms"
            )
    load_after = os.getloadavg()
    meta = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average_1m": [round(load_before[0], 1), round(load_after[0], 1)],
        "actions": args.actions,
        "mcp_actions": args.mcp_actions,
        "wall_s": round(time.monotonic() - started, 1),
    }
    figures = {
        "meta": meta,
        "flows": {
            "one_call_per_s": flows.one_call_per_s,
            "six_calls_per_s": flows.six_calls_per_s,
            "ratio": flows.ratio,
        },
        "cpu_ms_per_action": cpu,
        "latency": latency,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(figures, indent=2) + "\n")
    say(f"doors: wrote {args.json}; done in {meta['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
