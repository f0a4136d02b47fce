"""Figures from client results: throughput, percentiles, the Markdown section."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .spec import FLAVOUR_LABELS, ClientResult

SECTION = "service-layer"


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    workload: str
    flavour: str
    clients: int
    ops: int
    ops_per_s: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    cpu_us_per_op: float
    server_cpu_us_per_op: float
    refills: int
    per_client_ops: list[int]
    round_ops_per_s: list[float]

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def percentile(ordered: Sequence[int], q: float) -> int:
    """Nearest-rank percentile of an ascending sequence (``q`` in 0..100)."""
    if not ordered:
        return 0
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _throughput(results: Sequence[ClientResult]) -> float:
    """Sum over clients of each one's operations per second of its running time."""
    per_client: dict[int, list[float]] = {}
    for result in results:
        totals = per_client.setdefault(result.index, [0, 0.0])
        totals[0] += result.ops
        totals[1] += result.elapsed_s
    return sum(ops / elapsed for ops, elapsed in per_client.values() if elapsed > 0)


def summarise(
    *,
    workload: str,
    flavour: str,
    clients: int,
    rounds: Sequence[Sequence[ClientResult]],
) -> RunSummary:
    """Pool the rounds of one flavour: throughput over all its running time,
    latency percentiles over every operation of every client."""
    results = [result for round_ in rounds for result in round_]
    latencies = sorted(ns for result in results for ns in result.latencies_ns)
    ops = len(latencies)
    per_client: dict[int, int] = {}
    for result in results:
        per_client[result.index] = per_client.get(result.index, 0) + result.ops
    return RunSummary(
        workload=workload,
        flavour=flavour,
        clients=clients,
        ops=ops,
        ops_per_s=_throughput(results),
        p50_ms=percentile(latencies, 50) / 1e6,
        p99_ms=percentile(latencies, 99) / 1e6,
        mean_ms=(sum(latencies) / ops / 1e6) if ops else 0.0,
        cpu_us_per_op=(sum(r.cpu_s for r in results) / ops * 1e6) if ops else 0.0,
        server_cpu_us_per_op=(
            (sum(r.server_cpu_s for r in results) / ops * 1e6) if ops else 0.0
        ),
        refills=sum(r.refills for r in results),
        per_client_ops=[per_client[index] for index in sorted(per_client)],
        round_ops_per_s=[_throughput(round_) for round_ in rounds],
    )


def progress_line(summary: RunSummary) -> str:
    return (
        f"  {summary.workload:<11} clients={summary.clients:<2} "
        f"{FLAVOUR_LABELS.get(summary.flavour, summary.flavour):<16}"
        f" {summary.ops_per_s:7.0f} ops/s  "
        f"p50 {summary.p50_ms:6.2f} ms  p99 {summary.p99_ms:6.2f} ms  "
        f"CPU/op client {summary.cpu_us_per_op:5.0f} us"
        f" server {summary.server_cpu_us_per_op:5.0f} us  "
        f"(ops {summary.ops}, refills {summary.refills})"
    )


def _latency(summary: RunSummary | None) -> str:
    if summary is None:
        return "-"
    return f"{summary.p50_ms:.2f} / {summary.p99_ms:.2f}"


def _rate(summary: RunSummary | None) -> str:
    return "-" if summary is None else f"{summary.ops_per_s:,.0f}"


def _ratio(part: RunSummary | None, whole: RunSummary | None) -> str:
    if part is None or whole is None or whole.ops_per_s == 0:
        return "-"
    return f"{100 * part.ops_per_s / whole.ops_per_s:.0f} %"


def round_ratios(part: RunSummary, whole: RunSummary) -> list[float]:
    """``part / whole`` per round (the rounds alternate the two flavours)."""
    return [
        100 * a / b
        for a, b in zip(part.round_ops_per_s, whole.round_ops_per_s, strict=True)
        if b > 0
    ]


def _range(part: RunSummary | None, whole: RunSummary | None) -> str:
    if part is None or whole is None:
        return "-"
    ratios = round_ratios(part, whole)
    return f"{min(ratios):.0f}-{max(ratios):.0f} %" if ratios else "-"


def _cpu_ratio(part: RunSummary | None, whole: RunSummary | None) -> str:
    """``whole``'s CPU (client + server) per operation as a share of ``part``'s."""
    if part is None or whole is None or not part.server_cpu_us_per_op:
        return "-"
    mine = part.cpu_us_per_op + part.server_cpu_us_per_op
    theirs = whole.cpu_us_per_op + whole.server_cpu_us_per_op
    return f"{100 * theirs / mine:.0f} %"


def _cpu(summary: RunSummary | None) -> str:
    """Client + server CPU microseconds per operation."""
    if summary is None:
        return "-"
    server = (
        f"{summary.server_cpu_us_per_op:.0f}" if summary.server_cpu_us_per_op else "?"
    )
    return f"{summary.cpu_us_per_op:.0f} + {server}"


# Flavours beyond service and raw, as extra column groups: flavour -> label.
EXTRA_COLUMNS = {
    "orm": "plain ORM",
    "service-prepared": "what-if",
    "service-unprepared": "unprepared",
}

WORKLOAD_TITLES = {
    "transition": "Transition (running → succeeded: state + event + outbox)",
    "reservation": "Reservation (new idempotency key on a leased task)",
    "claim": "Claim → complete (claim_next, then transition to succeeded)",
}


def tables(summaries: Sequence[RunSummary]) -> str:
    """One Markdown table per workload; ORM columns when the ORM ran."""
    by_key = {(s.workload, s.clients, s.flavour): s for s in summaries}
    blocks: list[str] = []
    for workload in dict.fromkeys(s.workload for s in summaries):
        clients = sorted({s.clients for s in summaries if s.workload == workload})
        extras = [
            flavour
            for flavour in EXTRA_COLUMNS
            if any((workload, c, flavour) in by_key for c in clients)
        ]
        header = [
            "clients", "service ops/s", "raw ops/s", "**service / raw**",
            "per round", "CPU raw / service", "service p50 / p99 ms",
            "raw p50 / p99 ms", "service CPU µs/op client + server",
            "raw CPU µs/op client + server",
        ]  # fmt: skip
        for flavour in extras:
            label = EXTRA_COLUMNS[flavour]
            header += [
                f"{label} ops/s", f"{label} / raw", f"{label} p50 / p99 ms",
                f"{label} CPU µs/op client + server",
            ]  # fmt: skip
        lines = [
            f"**{WORKLOAD_TITLES.get(workload, workload)}**",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "|".join("---:" for _ in header) + "|",
        ]
        for count in clients:
            service = by_key.get((workload, count, "service"))
            raw = by_key.get((workload, count, "raw"))
            cells = [
                str(count), _rate(service), _rate(raw),
                f"**{_ratio(service, raw)}**", _range(service, raw),
                _cpu_ratio(service, raw), _latency(service), _latency(raw),
                _cpu(service), _cpu(raw),
            ]  # fmt: skip
            for flavour in extras:
                extra = by_key.get((workload, count, flavour))
                cells += [
                    _rate(extra),
                    _ratio(extra, raw),
                    _latency(extra),
                    _cpu(extra),
                ]
            lines.append("| " + " | ".join(cells) + " |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def headline(summaries: Sequence[RunSummary]) -> str:
    """One line per workload: service / raw throughput at each client count."""
    by_key = {(s.workload, s.clients, s.flavour): s for s in summaries}
    lines = []
    for workload in dict.fromkeys(s.workload for s in summaries):
        cells = [
            f"{_ratio(by_key.get((workload, n, 'service')), raw)} at {n}"
            for (w, n, flavour), raw in by_key.items()
            if w == workload and flavour == "raw"
        ]
        lines.append(f"- {workload}: " + ", ".join(cells))
    return "\n".join(lines)


def markdown_section(meta: Mapping[str, Any], summaries: Sequence[RunSummary]) -> str:
    settings = ", ".join(f"`{k}={v}`" for k, v in meta["postgres_settings"].items())
    duration, rounds = meta["duration_s"], meta["rounds"]
    slice_s = duration / rounds
    versions = (
        f"Python {meta['python_version']}, Django {meta['django_version']},"
        f" psycopg {meta['psycopg_version']}"
    )
    load = " → ".join(str(value) for value in meta["load_average_1m"])
    what_if = (
        "- *What-if* is the unchanged service on a Django connection with `OPTIONS`\n"
        "  `server_side_binding=True, prepare_threshold=5` (not the project's"
        " settings).\n"
        if meta.get("what_if")
        else ""
    ) + (
        "- *Unprepared* is the unchanged service with `prepare_threshold=None` (the\n"
        "  settings before issue 11: Django's default, nothing prepared).\n"
        if meta.get("unprepared")
        else ""
    )
    return f"""## Service layer against raw psycopg

Generated by `bench/run.py` on {meta["date"]} (run took {meta["wall_s"]:.0f} s); do
not edit between the markers, run the command again:

```
{meta["command"]}
```

Service-layer throughput as a share of raw psycopg's, by number of clients:

{headline(summaries)}

Setup:

- {meta["nproc"]} CPUs (`nproc`), {meta["platform"]}; 1-minute load average
  {load} (start → end). Other work shared the machine and the PostgreSQL
  cluster, which is why the slices below vary.
- PostgreSQL {meta["postgres_version"]}, same host, over TCP:
  {settings}.
- {versions}.

Method:

- Clients are separate processes, each with its own connections, released together
  by a barrier. Each flavour runs {duration:g} s per client count, as {rounds} slices of
  {slice_s:g} s alternated with the other flavours' slices (rotating order), so
  background load falls on all flavours alike; "per round" is the range of the
  per-slice ratios. {meta["warmup"]} untimed warm-up operations per client before the
  first slice, {meta["rewarmup"]} before each later one.
- Throughput is summed over clients; p50 / p99 pool every operation of every
  client. Client CPU is the client process's CPU time per operation (Python, plus the
  kernel's share of its socket traffic); server CPU is that of the PostgreSQL
  backends serving it. "CPU raw / service" is raw's CPU per operation (client +
  server) as a share of the service's: where the machine is CPU-bound (here from
  about 4 clients) throughput ratios tend to it, and it is far less noisy. After
  each run the benchmark checks that every operation committed its state change,
  its event and its outbox row.
- *Raw* is psycopg 3 with its defaults (server-side binding, statements prepared
  after five uses) running the services' own SQL constants (checked to be exactly
  the statements the services execute) with the same parameters in the same
  `BEGIN … COMMIT`, without argument checks, redaction or model building. Django's
  connection is configured by the settings: server-side binding, statements
  prepared after five uses (`PORTAL_DB_PREPARE_THRESHOLD`). *Plain ORM* is
  docs/style.md R4's readable form (read, guarded `update()`, `Event` and `Outbox` via
  `create()`, `refresh_from_db()`).
{what_if}- Transition: each client moves its own prepared, leased `running` tasks to
  `succeeded`. Reservation: each client reserves new keys on its own leased task
  (the grant check, the insert, the event). Claim → complete: `task_claim_next`,
  then the transition to `succeeded`: two transactions per operation, all clients
  on one pending queue (`SKIP LOCKED`).

{tables(summaries)}
"""


def replace_section(path: Path, body: str, section: str = SECTION) -> None:
    """Write ``body`` between this section's markers, leaving the rest of the file."""
    start = f"<!-- bench:{section}:start -->"
    end = f"<!-- bench:{section}:end -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else "# Performance\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text, count=1)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
