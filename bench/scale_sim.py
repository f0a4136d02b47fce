"""Scale-out by simulation: throughput and queue age today and at 10x (issue 12 §6).

    .venv/bin/python bench/scale_sim.py [--seed 1] [--seconds 30] [--no-docs]
        [--web 8] [--workers 2] [--relays 6] [--shards 4] [--shard-cores 2]

A discrete-event simulation (standard library only, seeded) of the portal as a network
of FIFO multi-server queues. Every cost in it is a CPU time per operation or a
per-relay rate measured by the benchmarks in docs/performance-log.md (``FIGURES`` names
each one and its table); nothing else is fitted. What it is not: a benchmark. It says
which resource runs out first and how queue age behaves past that point, under the
assumptions printed with its output.

The work: agents' tasks arrive as a Poisson stream, each of one tenant (20 tenants
sized 1/n, as ``manage.py load_scale_data`` makes them). A task is a REST operation
reserve (web, then its tenant's database), an execution on a worker (the measured
claim -> complete services: worker, then the database), and a REST transition (web,
then the database). Each database commit writes outbox rows (reserve 1, claim ->
complete 2, transition 1, as bench/service_layer.py checks); each row is published
by a relay (its measured per-relay rate) and claimed/marked on its tenant's database.
Service times are exponential around the measured means.

Two layouts: today's single node (every stage on one shared pool of cores, as
``manage.py up`` runs web, worker, relay and PostgreSQL on one machine), and the
scale-out plan (web, worker and relay pools of their own, and the database split
into shards by tenant, largest tenant first onto the least loaded shard).

Output: docs/scale-out.md between the ``bench:scale-sim`` markers, and stdout.
"""

from __future__ import annotations

import argparse
import heapq
import random
import shlex
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

if not __package__:  # run as a script: the repository, not bench/, is the import root
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.report import percentile, replace_section

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs" / "scale-out.md"
SECTION = "scale-sim"


@dataclass(frozen=True)
class Figure:
    value: float
    source: str


# Measured single-node figures, docs/performance-log.md (2 CPUs, PostgreSQL on host),
# 4 clients, CPU per operation in microseconds: "client" is the process running the
# portal's Python, "server" the PostgreSQL backends (or, for the API, gunicorn's
# workers and the backends together).
FIGURES: dict[str, Figure] = {
    "api_reserve_server_us": Figure(
        8204, "HTTP API, reserve operation, 4 clients: API CPU µs/req, server"
    ),
    "api_transition_server_us": Figure(
        7393, "HTTP API, transition, 4 clients: API CPU µs/req, server"
    ),
    "db_reserve_us": Figure(
        1518, "Service layer, reservation, 4 clients: service CPU µs/op, server"
    ),
    "db_transition_us": Figure(
        1255, "Service layer, transition, 4 clients: service CPU µs/op, server"
    ),
    "worker_claim_complete_us": Figure(
        1873, "Service layer, claim -> complete, 4 clients: service CPU µs/op, client"
    ),
    "db_claim_complete_us": Figure(
        2180, "Service layer, claim -> complete, 4 clients: service CPU µs/op, server"
    ),
    "relay_rows_per_s_1": Figure(
        370, "Outbox relay, 1 worker: relay with confirms rows/s"
    ),
    "relay_rows_per_s_4": Figure(
        822, "Outbox relay, 4 workers: relay with confirms rows/s (2 CPUs shared)"
    ),
    "raw_claim_mark_rows_per_s_4": Figure(
        2389, "Outbox relay, 4 workers: raw SQL claim+mark rows/s (2 CPUs shared)"
    ),
    "node_cores": Figure(2, "every table's setup: 2 CPUs (nproc)"),
}

TENANTS = 20  # load_scale_data's default: tenant n holds a share proportional to 1/n
ROWS = {"reserve": 1, "execute": 2, "transition": 1}  # outbox rows per commit


def _f(name: str) -> float:
    return FIGURES[name].value


def derived_costs() -> dict[str, float]:
    """Seconds of CPU (or relay time) per step, from ``FIGURES``.

    - web CPU of an API request: the API's server CPU less the database's share,
      taken as the same service's PostgreSQL CPU in the service-layer benchmark;
    - a relayed row on the shared node: 2 CPUs over the 4 relays' rate (the node was
      CPU-bound: relay, broker and PostgreSQL on the same 2 cores), of which the
      database's share is at most 2 CPUs over the raw claim+mark rate;
    - a relay of its own: one row per 1/370 s (its wait for the confirm included).
    """
    cores = _f("node_cores")
    db_relay = cores / _f("raw_claim_mark_rows_per_s_4")
    node_relay = cores / _f("relay_rows_per_s_4")
    us = 1e-6
    return {
        "web_reserve": (_f("api_reserve_server_us") - _f("db_reserve_us")) * us,
        "web_transition": (_f("api_transition_server_us") - _f("db_transition_us"))
        * us,
        "db_reserve": _f("db_reserve_us") * us,
        "db_transition": _f("db_transition_us") * us,
        "worker_execute": _f("worker_claim_complete_us") * us,
        "db_execute": _f("db_claim_complete_us") * us,
        "db_relay": db_relay,
        "relay_cpu_shared": node_relay - db_relay,
        "relay_own": 1 / _f("relay_rows_per_s_1"),
    }


def tenant_weights(tenants: int = TENANTS) -> list[float]:
    raw = [1 / n for n in range(1, tenants + 1)]
    total = sum(raw)
    return [w / total for w in raw]


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Where each stage runs: pools of servers (cores, or relays)."""

    name: str
    single_node_cores: int = 0  # > 0: everything shares one pool of this many cores
    web: int = 0
    workers: int = 0
    relays: int = 0
    shards: int = 1
    shard_cores: int = 0

    def describe(self) -> str:
        if self.single_node_cores:
            return (
                f"one node, {self.single_node_cores} cores shared by web, worker, "
                "relay and PostgreSQL"
            )
        return (
            f"{self.web} web cores, {self.workers} worker cores, {self.relays} relays, "
            f"{self.shards} database shards of {self.shard_cores} cores"
        )


@dataclass
class Station:
    name: str
    servers: int
    busy: int = 0
    queue: deque[tuple[float, Callable[[], None], float]] = field(default_factory=deque)
    busy_time: float = 0.0
    waits_us: list[int] = field(default_factory=list)
    served: int = 0
    oldest_age: list[tuple[float, float]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class StationReport:
    name: str
    servers: int
    utilisation: float
    served_per_s: float
    wait_p50_ms: float
    wait_p99_ms: float
    queued_at_end: int
    oldest_age_first_s: float  # mean age of the oldest waiting item, first third
    oldest_age_last_s: float  # the same, last third

    @property
    def growing(self) -> bool:
        """Queue age still rising at the end: the station cannot keep up."""
        return self.oldest_age_last_s > 2 * self.oldest_age_first_s + 0.05


@dataclass(frozen=True, kw_only=True)
class RunReport:
    layout: Layout
    tasks_per_s: float
    seed: int
    seconds: float
    tasks_done_per_s: float
    rows_sent_per_s: float
    task_p50_ms: float | None
    task_p99_ms: float | None
    lag_p50_ms: float | None
    lag_p99_ms: float | None
    stations: list[StationReport]


class Simulation:
    def __init__(self, layout: Layout, tasks_per_s: float, seed: int) -> None:
        self.layout = layout
        self.rate = tasks_per_s
        self.rng = random.Random(seed)
        self.seed = seed
        self.now = 0.0
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.sequence = 0
        self.costs = derived_costs()
        self.weights = tenant_weights()
        self.stations: dict[str, Station] = {}
        self.shard_of = self._place_tenants()
        self.task_us: list[int] = []
        self.lag_us: list[int] = []
        self.rows_sent = 0
        self.tasks_done = 0
        self.warmup = 0.0
        if layout.single_node_cores:
            self._station("node", layout.single_node_cores)
        else:
            self._station("web", layout.web)
            self._station("worker", layout.workers)
            self._station("relay", layout.relays)
            for shard in range(layout.shards):
                self._station(f"db{shard}", layout.shard_cores)

    def _station(self, name: str, servers: int) -> None:
        if servers < 1:
            raise ValueError(f"{name} needs at least one server")
        self.stations[name] = Station(name, servers)

    def _place_tenants(self) -> list[int]:
        """Largest tenant first onto the shard with the least share so far."""
        load = [0.0] * self.layout.shards
        shard_of = [0] * len(self.weights)
        for tenant in sorted(range(len(self.weights)), key=lambda t: -self.weights[t]):
            shard = min(range(self.layout.shards), key=lambda s: (load[s], s))
            shard_of[tenant] = shard
            load[shard] += self.weights[tenant]
        return shard_of

    # --- the event loop --------------------------------------------------------

    def _at(self, when: float, action: Callable[[], None]) -> None:
        self.sequence += 1
        heapq.heappush(self.events, (when, self.sequence, action))

    def _where(self, stage: str, tenant: int) -> str:
        if self.layout.single_node_cores:
            return "node"
        if stage == "db":
            return f"db{self.shard_of[tenant]}"
        return stage

    def _serve(
        self, station_name: str, mean_s: float, then: Callable[[], None]
    ) -> None:
        station = self.stations[station_name]
        if station.busy < station.servers:
            self._start(station, self.now, mean_s, then)
        else:
            station.queue.append((self.now, then, mean_s))

    def _start(
        self,
        station: Station,
        queued_at: float,
        mean_s: float,
        then: Callable[[], None],
    ) -> None:
        station.busy += 1
        station.waits_us.append(round((self.now - queued_at) * 1e6))
        service = self.rng.expovariate(1 / mean_s)
        station.busy_time += service

        def done() -> None:
            station.busy -= 1
            station.served += 1
            if station.queue:
                queued, follow, mean = station.queue.popleft()
                self._start(station, queued, mean, follow)
            then()

        self._at(self.now + service, done)

    def _steps(
        self, steps: list[tuple[str, float]], tenant: int, then: Callable[[], None]
    ) -> None:
        if not steps:
            then()
            return
        (stage, mean), rest = steps[0], steps[1:]
        self._serve(
            self._where(stage, tenant), mean, lambda: self._steps(rest, tenant, then)
        )

    # --- the work --------------------------------------------------------------

    def _arrive(self) -> None:
        tenant = self.rng.choices(range(len(self.weights)), self.weights)[0]
        started = self.now
        c = self.costs

        def transition() -> None:
            self._steps(
                [("web", c["web_transition"]), ("db", c["db_transition"])],
                tenant,
                lambda: self._committed("transition", tenant, finished=started),
            )

        def executed() -> None:
            self._committed("execute", tenant)
            transition()

        def execute() -> None:
            self._committed("reserve", tenant)
            self._steps(
                [("worker", c["worker_execute"]), ("db", c["db_execute"])],
                tenant,
                executed,
            )

        self._steps(
            [("web", c["web_reserve"]), ("db", c["db_reserve"])], tenant, execute
        )
        self._at(self.now + self.rng.expovariate(self.rate), self._arrive)

    def _committed(self, step: str, tenant: int, finished: float | None = None) -> None:
        for _ in range(ROWS[step]):
            self._relay(tenant, self.now)
        if finished is not None:
            self.tasks_done += 1
            if finished >= self.warmup:
                self.task_us.append(round((self.now - finished) * 1e6))

    def _relay(self, tenant: int, created: float) -> None:
        c = self.costs
        if self.layout.single_node_cores:
            steps = [("relay", c["relay_cpu_shared"]), ("db", c["db_relay"])]
        else:
            steps = [("relay", c["relay_own"]), ("db", c["db_relay"])]

        def sent() -> None:
            self.rows_sent += 1
            if created >= self.warmup:
                self.lag_us.append(round((self.now - created) * 1e6))

        self._steps(steps, tenant, sent)

    def _sample(self) -> None:
        for station in self.stations.values():
            age = self.now - station.queue[0][0] if station.queue else 0.0
            station.oldest_age.append((self.now, age))
        self._at(self.now + 0.25, self._sample)

    def run(self, seconds: float, warmup: float = 5.0) -> RunReport:
        self.warmup = warmup
        self._at(self.rng.expovariate(self.rate), self._arrive)
        self._at(0.25, self._sample)
        end = warmup + seconds
        measured_from: dict[str, tuple[float, int, int]] = {}
        done_at_warmup = sent_at_warmup = 0
        while self.events and self.events[0][0] <= end:
            when, _, action = heapq.heappop(self.events)
            if when >= warmup and not measured_from:
                measured_from = {
                    name: (s.busy_time, s.served, len(s.waits_us))
                    for name, s in self.stations.items()
                }
                done_at_warmup, sent_at_warmup = self.tasks_done, self.rows_sent
            self.now = when
            action()
        return RunReport(
            layout=self.layout,
            tasks_per_s=self.rate,
            seed=self.seed,
            seconds=seconds,
            tasks_done_per_s=(self.tasks_done - done_at_warmup) / seconds,
            rows_sent_per_s=(self.rows_sent - sent_at_warmup) / seconds,
            task_p50_ms=_pct_ms(self.task_us, 50),
            task_p99_ms=_pct_ms(self.task_us, 99),
            lag_p50_ms=_pct_ms(self.lag_us, 50),
            lag_p99_ms=_pct_ms(self.lag_us, 99),
            stations=[
                self._report(s, *measured_from[s.name], warmup, seconds)
                for s in self.stations.values()
            ],
        )

    @staticmethod
    def _report(
        s: Station,
        busy0: float,
        served0: int,
        waits0: int,
        warmup: float,
        seconds: float,
    ) -> StationReport:
        # Busy time is booked when a service starts: close enough over many services.
        waits = sorted(s.waits_us[waits0:])
        ages = [age for t, age in s.oldest_age if t >= warmup]
        third = max(1, len(ages) // 3)
        return StationReport(
            name=s.name,
            servers=s.servers,
            utilisation=min(1.0, (s.busy_time - busy0) / (s.servers * seconds)),
            served_per_s=(s.served - served0) / seconds,
            wait_p50_ms=percentile(waits, 50) / 1e3,
            wait_p99_ms=percentile(waits, 99) / 1e3,
            queued_at_end=len(s.queue),
            oldest_age_first_s=sum(ages[:third]) / third,
            oldest_age_last_s=sum(ages[-third:]) / third,
        )


def _pct_ms(values_us: list[int], q: float) -> float | None:
    """Nearest-rank percentile in ms; None when nothing that began measured ended."""
    return percentile(sorted(values_us), q) / 1e3 if values_us else None


def demand_per_task(layout: Layout) -> dict[str, float]:
    """Server-seconds of each station per task (a shard: its tenants' share)."""
    c = derived_costs()
    db = c["db_reserve"] + c["db_transition"] + c["db_execute"]
    rows = sum(ROWS.values())
    if layout.single_node_cores:
        return {
            "node": c["web_reserve"] + c["web_transition"] + c["worker_execute"] + db
            + rows * (c["relay_cpu_shared"] + c["db_relay"])
        }  # fmt: skip
    sim = Simulation(layout, 1.0, 0)
    share = [0.0] * layout.shards
    for tenant, weight in enumerate(sim.weights):
        share[sim.shard_of[tenant]] += weight
    demand = {
        "web": c["web_reserve"] + c["web_transition"],
        "worker": c["worker_execute"],
        "relay": rows * c["relay_own"],
    }
    for shard in range(layout.shards):
        demand[f"db{shard}"] = share[shard] * (db + rows * c["db_relay"])
    return demand


def capacity(layout: Layout) -> dict[str, float]:
    """Tasks per second at which each station reaches 100 % (servers / demand)."""
    sim = Simulation(layout, 1.0, 0)
    return {
        name: sim.stations[name].servers / need
        for name, need in demand_per_task(layout).items()
    }


# --- the report ------------------------------------------------------------------


def _fmt(value: float | None) -> str:
    if value is None:
        return "none ended"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def render(runs: Sequence[RunReport], command: str, today: float) -> str:
    c = derived_costs()
    lines = [
        "### The run",
        "",
        "Generated by `bench/scale_sim.py`; do not edit between the markers, run the",
        "command again (the same seed gives the same figures):",
        "",
        "```",
        command,
        "```",
        "",
        "Inputs, all from docs/performance-log.md (2 CPUs; its tables' 4-client rows):",
        "",
    ]
    for name, figure in FIGURES.items():
        lines.append(f"- `{name}` = {figure.value:,.0f}: {figure.source}")
    lines += [
        "",
        "Derived cost per step (ms): "
        + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in c.items())
        + ".",
        "",
    ]
    single = Layout(name="today", single_node_cores=int(_f("node_cores")))
    node_capacity = capacity(single)["node"]
    lines += [
        f"**Today's load** is not measured anywhere (no production figures exist): it "
        f"is taken as half of what the benchmarked 2-core node can carry, "
        f"{node_capacity:.1f} tasks/s by the costs above, so {today:.1f} agent tasks/s "
        f"({today * sum(ROWS.values()):.0f} outbox rows/s). 10x is "
        f"{today * 10:.0f} tasks/s.",
        "",
    ]
    for run in runs:
        caps = capacity(run.layout)
        first = min(caps, key=lambda name: caps[name])
        lines += [
            f"**{run.layout.name}** at {run.tasks_per_s:.0f} tasks/s: "
            f"{run.layout.describe()}. Simulated {run.seconds:.0f} s after 5 s "
            f"warm-up, seed {run.seed}.",
            "",
            f"- Tasks finished {_fmt(run.tasks_done_per_s)}/s ("
            + (
                f"arrival to transition p50 / p99 {_fmt(run.task_p50_ms)} / "
                f"{_fmt(run.task_p99_ms)} ms"
                if run.task_p50_ms is not None
                else "none of the tasks that arrived after the warm-up finished"
            )
            + "); outbox rows sent "
            f"{_fmt(run.rows_sent_per_s)}/s (commit→publish p50 / p99 "
            f"{_fmt(run.lag_p50_ms)} / {_fmt(run.lag_p99_ms)} ms).",
            f"- Saturates first: **{first}**, at {caps[first]:.0f} tasks/s "
            f"({caps[first] / run.tasks_per_s:.1f}x this load)"
            + "".join(
                f"; {name} at {caps[name]:.0f}"
                for name in sorted(caps, key=lambda name: caps[name])[1:]
            )
            + ".",
            "",
            "| station | servers | utilisation | served/s | wait p50 / p99 ms "
            "| queued at end | oldest waiting, first → last third (s) | growing |",
            "|---|---:|---:|---:|---:|---:|---:|:---:|",
        ]
        for s in run.stations:
            lines.append(
                f"| {s.name} | {s.servers} | {s.utilisation:.0%} | "
                f"{_fmt(s.served_per_s)} | {_fmt(s.wait_p50_ms)} / "
                f"{_fmt(s.wait_p99_ms)} | {s.queued_at_end:,} | "
                f"{s.oldest_age_first_s:.2f} → "
                f"{s.oldest_age_last_s:.2f} | {'**yes**' if s.growing else 'no'} |"
            )
        lines.append("")
    return "\n".join(lines)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--web", type=int, default=8, help="web cores (plan)")
    parser.add_argument("--workers", type=int, default=2, help="worker cores (plan)")
    parser.add_argument("--relays", type=int, default=6, help="relays (plan)")
    parser.add_argument("--shards", type=int, default=4, help="database shards")
    parser.add_argument("--shard-cores", type=int, default=2, help="cores per shard")
    parser.add_argument("--no-docs", action="store_true", help="print only")
    return parser.parse_args(argv)


def simulate(args: argparse.Namespace) -> list[RunReport]:
    single = Layout(name="Today's node", single_node_cores=int(_f("node_cores")))
    today = capacity(single)["node"] / 2
    plan = Layout(
        name="Scale-out plan",
        web=args.web,
        workers=args.workers,
        relays=args.relays,
        shards=args.shards,
        shard_cores=args.shard_cores,
    )
    return [
        Simulation(single, today, args.seed).run(args.seconds),
        Simulation(
            Layout(
                name="Today's node at 10x", single_node_cores=single.single_node_cores
            ),
            today * 10,
            args.seed,
        ).run(args.seconds),
        Simulation(plan, today * 10, args.seed).run(args.seconds),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    runs = simulate(args)
    shown = [a for a in argv if a != "--no-docs"]
    command = shlex.join([".venv/bin/python", "bench/scale_sim.py", *shown])
    today = runs[0].tasks_per_s
    body = render(runs, command, today)
    print(body)
    if not args.no_docs:
        replace_section(DOCS, body, SECTION)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
