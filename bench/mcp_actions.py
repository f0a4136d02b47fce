"""An MCP tool call against the REST one call: the same governed action, latency.

    .venv/bin/python bench/mcp_actions.py --base-url http://127.0.0.1:8000 \\
        --mcp-url http://127.0.0.1:8001/mcp --api-key agp_... \\
        [--actions 80] [--clients 1,8] [--slice 10]

Runs against what ``manage.py up`` started: the portal (REST) and its MCP server
(``manage.py mcp --http``), the seeded demo tenant and the real ticket desk. Each
action makes one real ticket under a fresh key, either way:

- ``rest``: ``POST /api/v1/actions`` (``PortalClient.take_action``, the
  ``bench/actions.py`` one call);
- ``mcp``: a ``tools/call`` of the agent's ``create_ticket`` tool over streamable
  HTTP, with the SDK's own ``ClientSession`` (one session per client, opened and
  initialised before the clock starts).

At each client count the two run in alternating slices of ``--slice`` actions per
client, so both see the same server, desk and table sizes. Each client records the
object's version (``PUT``, untimed) and then times only the action call. The figure
is each door's p50 and p99 latency and MCP's p50 over REST's.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import multiprocessing
import secrets
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

sys.path[0] = str(Path(__file__).resolve().parent.parent)

import httpx2  # noqa: E402
from mcp import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from bench import actions as bench_actions  # noqa: E402
from portal_client import PortalClient  # noqa: E402

# The demo agent's tool for the bench's action (mcp_server/tools.py names it
# <action>__<target>[__<contract>]); the listing picks the one that starts so.
TOOL_PREFIX: Final = f"{bench_actions.ACTION}__{bench_actions.TARGET}"


@dataclass(frozen=True, kw_only=True)
class Latency:
    """One door's action-call latencies at one client count, in milliseconds."""

    door: str
    clients: int
    samples_ms: tuple[float, ...]

    @property
    def p50(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def p99(self) -> float:
        ordered = sorted(self.samples_ms)
        return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def tool_arguments(name: str) -> dict[str, Any]:
    """The MCP tool call's arguments for the action ``bench_actions.one_call``
    takes over REST under the same name."""
    now = dt.datetime.now(dt.UTC)
    return {
        "idempotency_key": f"ticket-{name}",
        "object": {"type": bench_actions.OBJECT_TYPE, "id": name, "version": "1"},
        "fields": {
            field: {
                "value": read.value,
                "source": read.source,
                "read_at": read.read_at.isoformat(),
            }
            for field, read in bench_actions.field_reads(now).items()
        },
        "arguments": {"queue": "bench", "summary": name},
    }


def _rest_slice(base_url: str, secret: str, names: list[str]) -> list[float]:
    out: list[float] = []
    with PortalClient(base_url, secret) as client:
        for name in names:
            client.record_object_version(bench_actions.OBJECT_TYPE, name, version="1")
            started = time.perf_counter()
            bench_actions.take_action(client, name)
            out.append((time.perf_counter() - started) * 1000)
    return out


async def _mcp_slice(
    base_url: str, mcp_url: str, secret: str, names: list[str]
) -> list[float]:
    out: list[float] = []
    async with (
        httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {secret}"}, timeout=60
        ) as http,
        streamable_http_client(mcp_url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        listed = await session.list_tools()
        tool = next(t.name for t in listed.tools if t.name.startswith(TOOL_PREFIX))
        with PortalClient(base_url, secret) as client:
            for name in names:
                client.record_object_version(
                    bench_actions.OBJECT_TYPE, name, version="1"
                )
                started = time.perf_counter()
                result = await session.call_tool(tool, tool_arguments(name))
                out.append((time.perf_counter() - started) * 1000)
                answer = result.structured_content or {}
                if result.is_error or answer.get("status") != "verified":
                    raise RuntimeError(f"{name}: {answer or result.content}")
    return out


def _client_slice(
    door: str, base_url: str, mcp_url: str, secret: str, names: list[str]
) -> list[float]:
    """One client's slice through one door, in its own process: its latencies."""
    if door == "rest":
        return _rest_slice(base_url, secret, names)
    return asyncio.run(_mcp_slice(base_url, mcp_url, secret, names))


def measure(
    *,
    base_url: str,
    mcp_url: str,
    secret: str,
    clients: int,
    actions: int,
    slice_size: int,
    run_id: str | None = None,
) -> tuple[Latency, Latency]:
    """``actions`` per client through each door at ``clients`` clients, in
    alternating slices; the REST and MCP latencies.

    Each client is its own process, as agents are: clients as threads of one
    process would share its interpreter lock, and the MCP SDK's client (anyio,
    pydantic) spends more of it than the REST client, so the clients' own
    contention would be counted as the server's.
    """
    run_id = run_id or secrets.token_hex(4)
    samples: dict[str, list[float]] = {"rest": [], "mcp": []}
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=clients, mp_context=spawn) as pool:
        # Start every process (imports) before the clock does.
        list(pool.map(time.sleep, [0.2] * clients))
        done = 0
        while done < actions:
            count = min(slice_size, actions - done)
            for door in ("rest", "mcp"):
                futures = [
                    pool.submit(
                        _client_slice,
                        door,
                        base_url,
                        mcp_url,
                        secret,
                        [
                            f"bench-{run_id}-{door}-{clients}-{c}-{n}"
                            for n in range(done, done + count)
                        ],
                    )
                    for c in range(clients)
                ]
                for future in futures:
                    samples[door].extend(future.result())
            done += count
    return (
        Latency(door="rest", clients=clients, samples_ms=tuple(samples["rest"])),
        Latency(door="mcp", clients=clients, samples_ms=tuple(samples["mcp"])),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--mcp-url", default="http://127.0.0.1:8001/mcp")
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--actions", type=int, default=80, help="per client")
    parser.add_argument("--clients", default="1,8")
    parser.add_argument("--slice", type=int, default=10)
    args = parser.parse_args(argv)
    for clients in (int(part) for part in args.clients.split(",")):
        # Warm both doors (imports, connections, the tool listing) off the clock.
        measure(
            base_url=args.base_url,
            mcp_url=args.mcp_url,
            secret=args.api_key,
            clients=clients,
            actions=1,
            slice_size=1,
        )
        rest, mcp = measure(
            base_url=args.base_url,
            mcp_url=args.mcp_url,
            secret=args.api_key,
            clients=clients,
            actions=args.actions,
            slice_size=args.slice,
        )
        print(
            f"{clients} client(s), {len(rest.samples_ms)} actions each door: "
            f"REST p50 {rest.p50:.1f} ms p99 {rest.p99:.1f} ms; "
            f"MCP p50 {mcp.p50:.1f} ms p99 {mcp.p99:.1f} ms; "
            f"MCP over REST p50 {mcp.p50 - rest.p50:+.1f} ms, "
            f"p99 {mcp.p99 - rest.p99:+.1f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
