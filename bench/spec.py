"""What the coordinator sends a client process, and what the client sends back.

Plain data only (no Django imports): both sides unpickle these before or without
``django.setup()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

WORKLOADS: Final = ("transition", "reservation", "claim")
# Raw first, so the service run of a pair is never the one on the colder cache.
FLAVOURS: Final[dict[str, tuple[str, ...]]] = {
    "transition": ("raw", "service", "orm"),
    "reservation": ("raw", "service"),
    "claim": ("raw", "service"),
}
FLAVOUR_LABELS: Final = {
    "raw": "raw psycopg",
    "service": "service layer",
    "orm": "plain ORM",
    "raw-like-django": "raw, psycopg configured as Django does",
    "django-sql": "raw statements through Django's atomic and cursor",
    "service-prepared": "service prepared",
    "service-unprepared": "service unprepared",
    "service-sql-grant": "service, SQL grant",
    "service-prepared-sql-grant": "service, both",
    "lean": "lean raw psycopg",
    "procrastinate": "Procrastinate",
    "dbos": "DBOS Transact",
}


@dataclass(frozen=True, kw_only=True)
class WhatIf:
    """The unchanged service under a changed environment (not the project's code)."""

    # Added to the settings' Django connection OPTIONS.
    django_options: dict[str, object] = field(default_factory=dict)
    # ``portal.selectors.agent_may`` replaced by one hand-written statement.
    sql_grant: bool = False


_PREPARED: Final[dict[str, object]] = {
    "server_side_binding": True,
    "prepare_threshold": 5,
}
WHAT_IFS: Final[dict[str, WhatIf]] = {
    "service-prepared": WhatIf(django_options=_PREPARED),
    "service-sql-grant": WhatIf(sql_grant=True),
    "service-prepared-sql-grant": WhatIf(django_options=_PREPARED, sql_grant=True),
    # The settings before issue 11: Django's default, nothing prepared.
    "service-unprepared": WhatIf(django_options={"prepare_threshold": None}),
}


def runner_flavour(flavour: str) -> str:
    """The runner a flavour uses: what-ifs run the service's."""
    return "service" if flavour in WHAT_IFS else flavour


# The steps from raw to service, and what-ifs, for bench/profile_client.py.
DIAGNOSTIC_FLAVOURS: Final[dict[str, tuple[str, ...]]] = {
    "transition": (
        "raw", "raw-like-django", "django-sql", "service", "service-prepared", "orm",
    ),
    "reservation": (
        "raw", "raw-like-django", "django-sql", "service", "service-prepared",
        "service-sql-grant", "service-prepared-sql-grant",
    ),
    "claim": ("raw", "service", "service-prepared"),
}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    run_id: str
    round: int
    workload: str
    flavour: str
    clients: int
    duration_s: float
    warmup: int
    tenant_id: str
    agent_id: str
    refill_batch: int
    # The peer's own database (bench/peers.py), for the peers' runners.
    peer_url: str = ""


@dataclass(frozen=True, kw_only=True)
class ClientResult:
    index: int
    ops: int
    warmup_ops: int
    elapsed_s: float
    cpu_s: float
    server_cpu_s: float
    refills: int
    latencies_ns: list[int] = field(repr=False)


# The guarantee-cost ledger of bench/peers.py --ledger (bench/peer_runners.py).
LEDGER_STEPS: Final = ("bare", "rls", "guard", "chain", "outbox", "partitions")
"""Each step adds its guarantee to every one before it; ``bare`` is the lean
baseline without the outbox row (``bench/lean.sql`` with the event alone)."""
LEDGER_FLAVOURS: Final = tuple(f"ledger-{step}" for step in LEDGER_STEPS)
LEDGER_LABELS: Final = {
    "ledger-bare": "lean: state and event, one CTE, no trigger or policy",
    "ledger-rls": "+ row-level security (the services' policy on every table)",
    "ledger-guard": "+ the guard trigger on the task (tasks_task_guard_update)",
    "ledger-chain": "+ the hash chain (head row moved, payload and link SHA-256)",
    "ledger-outbox": "+ the outbox row, written from the event",
    "ledger-partitions": "+ the event table in month partitions on its UUIDv7 id",
}
