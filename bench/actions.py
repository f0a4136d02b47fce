"""The one-call action against the six-call lifecycle, over REST, in one run.

    .venv/bin/python bench/actions.py --base-url http://127.0.0.1:8000 \\
        --api-key agp_... [--actions 200] [--slice 10]

Runs against a portal that ``manage.py up`` started (its seeded demo tenant: the
``customer-issue`` contract, the agent's grant and the real ticket desk). Each
action makes one real ticket at the desk, under a fresh key. The two flows run in
alternating slices of ``--slice`` actions, one client, so both see the same server,
desk and table sizes; the figure is actions per second and the ratio between them.

- ``one-call``: ``POST /api/v1/actions`` (``PortalClient.take_action``);
- ``six-calls``: register, lease, ``running``, reserve, execute, ``succeeded``.

Both record the object's version first (one ``PUT`` each, the same for both).
"""

from __future__ import annotations

import argparse
import datetime as dt
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from portal_client import FieldRead, FieldValue, PortalClient  # noqa: E402

CONTRACT_KEY: Final = "customer-issue"
OBJECT_TYPE: Final = "customer_issue"
TARGET: Final = "ticket-desk"
ACTION: Final = "create_ticket"


@dataclass(frozen=True, kw_only=True)
class Figures:
    """Actions per second of each flow, from the same run."""

    one_call_per_s: float
    six_calls_per_s: float
    actions: int

    @property
    def ratio(self) -> float:
        return self.one_call_per_s / self.six_calls_per_s


def field_reads(now: dt.datetime) -> dict[str, FieldRead]:
    return {
        "email": FieldRead(value="bench@example.com", source="crm", read_at=now),
        "plan": FieldRead(value="pro", source="billing", read_at=now),
    }


def one_call(client: PortalClient, name: str) -> None:
    client.record_object_version(OBJECT_TYPE, name, version="1")
    take_action(client, name)


def take_action(client: PortalClient, name: str) -> None:
    """The one call alone (the object's version recorded before); verified or
    an error."""
    answer = client.take_action(
        action=ACTION,
        target=TARGET,
        object_type=OBJECT_TYPE,
        object_id=name,
        object_version="1",
        fields=field_reads(dt.datetime.now(dt.UTC)),
        arguments={"queue": "bench", "summary": name},
        idempotency_key=f"ticket-{name}",
        contract_key=CONTRACT_KEY,
    )
    if answer.status != "verified":
        raise RuntimeError(f"{name}: {answer.status} {answer.reason_code}")


def six_calls(client: PortalClient, name: str) -> None:
    client.record_object_version(OBJECT_TYPE, name, version="1")
    task, _ = client.register_task(
        client_task_id=name,
        workflow_key=ACTION,
        workflow_version="1",
        object_type=OBJECT_TYPE,
        object_id=name,
        object_version="1",
        contract_key=CONTRACT_KEY,
    )
    leased = client.acquire_lease(task.id, owner="bench", ttl_s=60)
    token = leased.lease.token
    running = client.transition(
        task.id,
        to="running",
        expected_state_version=leased.state_version,
        lease_token=token,
    )
    operation, _ = client.reserve_operation(
        task.id,
        lease_token=token,
        idempotency_key=f"ticket-{name}",
        action=ACTION,
        target=TARGET,
        input={"queue": "bench", "summary": name},
    )
    now = dt.datetime.now(dt.UTC)
    execution = client.execute_operation(
        operation.id,
        lease_token=token,
        field_values=[
            FieldValue(
                name=field, value=read.value, source=read.source, observed_at=now
            )
            for field, read in field_reads(now).items()
        ],
    )
    if execution.outcome != "verified":
        raise RuntimeError(f"{name}: {execution.outcome}")
    client.transition(
        task.id,
        to="succeeded",
        expected_state_version=running.state_version,
        lease_token=token,
    )


def measure(
    client: PortalClient, *, actions: int, slice_size: int, run_id: str | None = None
) -> Figures:
    """Run ``actions`` of each flow in alternating slices; their rates."""
    run_id = run_id or secrets.token_hex(4)
    flows: dict[str, Callable[[PortalClient, str], None]] = {
        "one": one_call,
        "six": six_calls,
    }
    spent = dict.fromkeys(flows, 0.0)
    done = dict.fromkeys(flows, 0)
    while min(done.values()) < actions:
        for label, flow in flows.items():
            count = min(slice_size, actions - done[label])
            started = time.perf_counter()
            for n in range(done[label], done[label] + count):
                flow(client, f"bench-{run_id}-{label}-{n}")
            spent[label] += time.perf_counter() - started
            done[label] += count
    return Figures(
        one_call_per_s=actions / spent["one"],
        six_calls_per_s=actions / spent["six"],
        actions=actions,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--actions", type=int, default=200)
    parser.add_argument("--slice", type=int, default=10)
    args = parser.parse_args(argv)
    with PortalClient(args.base_url, args.api_key) as client:
        one_call(client, f"warm-{secrets.token_hex(4)}")  # imports, connections
        six_calls(client, f"warm-{secrets.token_hex(4)}")
        figures = measure(client, actions=args.actions, slice_size=args.slice)
    print(
        f"{figures.actions} actions each, 1 client: one call "
        f"{figures.one_call_per_s:.1f}/s, six calls {figures.six_calls_per_s:.1f}/s, "
        f"ratio {figures.ratio:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
