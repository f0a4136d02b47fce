"""Figures of ``bench/api.py``: the table, the headline and its Markdown section.

Throughput and percentiles come from ``bench/report.py`` (``summarise``); this adds
what the HTTP runs have and the service-layer runs do not: failed requests, and the
server's CPU (gunicorn workers and PostgreSQL backends) measured per slice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from .report import RunSummary, round_ratios

SECTION: Final = "api"
FLAVOUR_LABELS: Final = {
    "api": "HTTP API",
    "close": "API close",
    "raw": "raw psycopg",
}
WORKLOAD_TITLES: Final = {
    "reservation": "Reserve operation: `POST /api/v1/tasks/{id}/operations`"
    " (new idempotency key on a leased task)",
    "transition": "Transition: `POST /api/v1/tasks/{id}/transitions`"
    " (running → succeeded)",
}
WORKLOAD_NAMES: Final = {"reservation": "reserve operation", "transition": "transition"}


@dataclass(frozen=True, kw_only=True)
class ApiFigures:
    """One flavour of one workload at one client count, over all its slices."""

    summary: RunSummary  # ops: 2xx answers only
    errors: int
    failures: dict[str, int] = field(default_factory=dict)  # why, with counts
    # The gunicorn workers' part of ``summary.server_cpu_us_per_op`` (the rest is
    # the database backends').
    web_cpu_us_per_op: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            **self.summary.as_json(),
            "web_cpu_us_per_op": self.web_cpu_us_per_op,
            "errors": self.errors,
            "failures": self.failures,
        }


def progress_line(figures: ApiFigures) -> str:
    s = figures.summary
    unit = "ops/s" if s.flavour == "raw" else "req/s"
    failures = f" {figures.failures}" if figures.failures else ""
    return (
        f"  {s.workload:<11} clients={s.clients:<2} {FLAVOUR_LABELS[s.flavour]:<11}"
        f" {s.ops_per_s:7.0f} {unit}  p50 {s.p50_ms:6.2f} ms  p99 {s.p99_ms:6.2f} ms"
        f"  CPU/op client {s.cpu_us_per_op:5.0f} us server"
        f" {s.server_cpu_us_per_op:5.0f} us (web {figures.web_cpu_us_per_op:5.0f})"
        f"  (ok {s.ops}, errors {figures.errors}"
        f"{failures}, refills {s.refills})"
    )


def _rate(figures: ApiFigures | None) -> str:
    return "-" if figures is None else f"{figures.summary.ops_per_s:,.0f}"


def _latency(figures: ApiFigures | None) -> str:
    if figures is None:
        return "-"
    return f"{figures.summary.p50_ms:.2f} / {figures.summary.p99_ms:.2f}"


def _cpu(figures: ApiFigures | None) -> str:
    """Client + server CPU per request; the server's split into web + database
    where there is a web."""
    if figures is None:
        return "-"
    s = figures.summary
    text = f"{s.cpu_us_per_op:,.0f} + {s.server_cpu_us_per_op:,.0f}"
    if figures.web_cpu_us_per_op:
        web = figures.web_cpu_us_per_op
        text += f" ({web:,.0f} + {s.server_cpu_us_per_op - web:,.0f})"
    return text


def share(api: ApiFigures | None, raw: ApiFigures | None) -> str:
    if api is None or raw is None or not raw.summary.ops_per_s:
        return "-"
    return f"{100 * api.summary.ops_per_s / raw.summary.ops_per_s:.0f} %"


def _slices(api: ApiFigures | None, raw: ApiFigures | None) -> str:
    if api is None or raw is None:
        return "-"
    ratios = round_ratios(api.summary, raw.summary)
    return f"{min(ratios):.0f}-{max(ratios):.0f} %" if ratios else "-"


def _cpu_share(api: ApiFigures | None, raw: ApiFigures | None) -> str:
    """Raw's CPU per operation (client + server) as a share of the API's."""
    if api is None or raw is None:
        return "-"
    mine = api.summary.cpu_us_per_op + api.summary.server_cpu_us_per_op
    theirs = raw.summary.cpu_us_per_op + raw.summary.server_cpu_us_per_op
    return f"{100 * theirs / mine:.0f} %" if mine else "-"


def _errors(figures: ApiFigures | None) -> str:
    """Errors / 2xx answers, with the reasons of the errors."""
    if figures is None:
        return "-"
    counts = f"{figures.errors} / {figures.summary.ops:,}"
    if not figures.errors:
        return counts
    why = ", ".join(f"{n} x {reason}" for reason, n in figures.failures.items())
    return f"{counts} ({why})"


Key = tuple[str, int, str]  # (workload, clients, flavour)


def by_key(figures: Sequence[ApiFigures]) -> dict[Key, ApiFigures]:
    return {
        (f.summary.workload, f.summary.clients, f.summary.flavour): f for f in figures
    }


def tables(figures: Sequence[ApiFigures]) -> str:
    """One Markdown table per workload, a row per client count."""
    keyed = by_key(figures)
    blocks = []
    for workload in dict.fromkeys(f.summary.workload for f in figures):
        counts = sorted({c for w, c, _ in keyed if w == workload})
        header = [
            "clients", "API req/s", "raw ops/s", "**API / raw**", "per slice",
            "CPU raw / API",
            "API p50 / p99 ms", "raw p50 / p99 ms",
            "API CPU µs/req client + server (web + database)",
            "raw CPU µs/op client + server", "API errors / 2xx", "raw errors / ok",
            "`Connection: close` req/s", "close / raw", "close p50 / p99 ms",
            "close CPU µs/req client + server (web + database)",
        ]  # fmt: skip
        lines = [
            f"**{WORKLOAD_TITLES.get(workload, workload)}**",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "|".join("---:" for _ in header) + "|",
        ]
        for count in counts:
            api = keyed.get((workload, count, "api"))
            raw = keyed.get((workload, count, "raw"))
            close = keyed.get((workload, count, "close"))
            cells = [
                str(count), _rate(api), _rate(raw), f"**{share(api, raw)}**",
                _slices(api, raw), _cpu_share(api, raw), _latency(api),
                _latency(raw), _cpu(api), _cpu(raw), _errors(api), _errors(raw),
                _rate(close), share(close, raw), _latency(close), _cpu(close),
            ]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def headline(figures: Sequence[ApiFigures]) -> str:
    keyed = by_key(figures)
    lines = []
    for workload in dict.fromkeys(f.summary.workload for f in figures):
        counts = sorted({c for w, c, _ in keyed if w == workload})
        cells = []
        for n in counts:
            raw = keyed.get((workload, n, "raw"))
            cell = f"{share(keyed.get((workload, n, 'api')), raw)} at {n}"
            if (workload, n, "close") in keyed:
                cell += f" ({share(keyed[workload, n, 'close'], raw)} with close)"
            cells.append(cell)
        lines.append(f"- {WORKLOAD_NAMES.get(workload, workload)}: " + ", ".join(cells))
    return "\n".join(lines)


# What the generic labels of captured statements stand for, where known.
STATEMENT_NOTES: Final = {
    "SELECT portal_agentkey": "the API key lookup, agent and tenant joined",
    "UPDATE portal_agentkey": "the key's `last_used_at` (a row once a minute,"
    " a round trip every request)",
}


def _statements(meta: Mapping[str, Any]) -> str:
    lines = []
    for workload, labels in meta["api_statements"].items():
        raw = meta["raw_statements"][workload]
        named = ";\n    ".join(STATEMENT_NOTES.get(label, label) for label in labels)
        lines.append(
            f"  - {WORKLOAD_NAMES.get(workload, workload)}: {len(labels)} through the"
            f" API against raw's {raw}:\n    {named}."
        )
    return "\n".join(lines)


def _connections(meta: Mapping[str, Any]) -> str:
    if meta["connection_header"] == "close":
        return (
            "The server answers `Connection: close`, so every\n"
            "  request opens a new TCP connection."
        )
    return (
        f"The server answered `Connection: {meta['connection_header']}`: the\n"
        "  client's connection is reused."
    )


def markdown_section(
    meta: Mapping[str, Any], figures: Sequence[ApiFigures], failed_checks: Sequence[str]
) -> str:
    settings = ", ".join(f"`{k}={v}`" for k, v in meta["postgres_settings"].items())
    load = " → ".join(str(value) for value in meta["load_average_1m"])
    duration, rounds = meta["duration_s"], meta["rounds"]
    versions = (
        f"Python {meta['python_version']}, Django {meta['django_version']},"
        f" psycopg {meta['psycopg_version']}, gunicorn {meta['gunicorn_version']},"
        f" httpx {meta['httpx_version']}"
    )
    checks = (
        "all passed."
        if not failed_checks
        else "**failed**: " + "; ".join(f"`{c}`" for c in failed_checks)
    )
    return f"""## HTTP API against raw psycopg

Generated by `bench/api.py` on {meta["date"]} (run took {meta["wall_s"]:.0f} s); do
not edit between the markers, run the command again:

```
{meta["command"]}
```

**These figures are from a shared machine**: other work (test suites, other
benchmarks) ran on the same {meta["nproc"]} CPUs and PostgreSQL cluster throughout
(1-minute load average {load}, start → end of the measured runs). Compare the
columns of this run, which were measured in alternating slices, rather than its
figures with another run's.

HTTP API requests/s as a share of raw psycopg's operations/s, by number of clients:

{headline(figures)}

Setup:

- {meta["nproc"]} CPUs (`nproc`), {meta["platform"]}.
- PostgreSQL {meta["postgres_version"]}, same host, over TCP:
  {settings}.
- {versions}.
- Server ({meta["workers"]}; no access log):

  ```
  {meta["server_command"]}
  ```

  on the benchmark's own freshly migrated database, `DJANGO_DEBUG` unset,
  `PORTAL_AGENT_RATE_LIMIT={meta["rate_limit"]}` so the throttle never refuses
  (it still counts every request), and the commit's relay nudge on (to a scratch
  filesystem broker).

Method:

- Clients are separate processes released together by a barrier. Each flavour runs
  {duration:g} s per client count, as {rounds} slices alternated with the other
  flavour's (rotating order), so background load falls on both alike; "per slice" is
  the range of the per-slice ratios. "CPU raw / API" is raw's CPU per operation
  (client + server) as a share of the API's: where the machine is CPU-bound, throughput
  ratios tend to it, and it is less noisy. {meta["warmup"]} untimed warm-up requests per
  client before the first slice, {meta["rewarmup"]} before each later one.
- *HTTP API*: each client posts through one `httpx.Client` (keep-alive), with the
  agent's Bearer key and `Lease-Token`.
  {_connections(meta)}
  *`Connection: close`*: the same requests with that header, so each opens a new
  TCP connection (the same as keep-alive under gunicorn's sync workers, which close
  every connection).
  With more clients than worker threads, requests wait in the server's queue, and
  their latency includes that wait.
- *Raw psycopg*: `bench/workloads.py`'s raw runner, one connection per client
  process, psycopg 3 defaults, running the services' own SQL constants with the
  same parameters in one `BEGIN … COMMIT` (`bench/run.py` checks they are exactly
  the statements the services execute).
- Statements per request, captured in-process with Django's test client (a
  steady-state request, after the first):
{_statements(meta)}

  Not captured: `BEGIN`/`COMMIT` (both flavours) and Django's connection health
  check (`SELECT 1` before each request's first query, `conn_health_checks=True`).
- Throughput is summed over clients and counts 2xx answers only; p50 / p99 pool
  every 2xx request of every client. An error is any other answer or a transport
  error: counted, not timed. CPU per request: client is the client process's CPU
  time; server is that of the gunicorn workers (web) and of the benchmark
  database's PostgreSQL backends (database), read from `/proc` at the start and
  end of each slice.
- Transition: each client moves its own prepared, leased `running` tasks to
  `succeeded`, one request per task (`expected_state_version` 1, `Lease-Token: 1`).
  Reserve operation: each client reserves new keys on its own leased task
  (`create_ticket` on `ticket-desk`; the agent holds `create_ticket` on `*`).
- After each run the benchmark checks in the database that every 2xx (warm-up
  included) committed its state change or operation, its event and its outbox row:
  {checks}

{tables(figures)}
"""
