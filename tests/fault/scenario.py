"""One chaos run, shared by the tests: plan, start workers, submit, settle, check.

The settle job (``check_receipts_job``) runs in the test process, in a loop: the
workers only run ``run_operation_job`` messages, as a deployment's queue workers do,
and the loop plays celery beat's part. Keeping it out of the workers keeps the
nemesis's targets and the settle cadence independent; the settle job itself is
never killed here.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import connection
from kombu import Connection

from config.celery import app
from portal import scope
from tasks.jobs import check_receipts_job, run_operation_job

from .conftest import Planned, World
from .harness import (
    Clock,
    Nemesis,
    Verdict,
    WorkerPool,
    check,
    operation_views,
    percentile,
    queue_depth,
    retrying,
    settle,
)

_JOB_FAILED = re.compile(r"run_operation_job\[[0-9a-f-]{36}\] raised unexpected")
# A pool child died under its job (the main process logs it; its own death is silent).
_WORKER_LOST = re.compile(r"Task handler raised error: WorkerLostError")
# A resumed (or late) run whose record of its call was refused: someone moved first.
_STALE = re.compile(r"StaleState")


class Submitter(threading.Thread):
    """Queue every execution through the gateway and publish its job, in order.

    Runs beside the settle loop, as agents and celery beat run beside each other.
    ``rate``: submissions per second (0: as fast as this process goes).
    """

    def __init__(self, run: Run) -> None:
        super().__init__(name="submitter", daemon=True)
        self.run_ = run
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        run = self.run_
        try:
            # The agent's tenant, as its key sets it on a request (row-level
            # security): a new thread starts with no scope of its own.
            with (
                scope.tenant_scope([run.world.tenant.pk]),
                Connection(run.amqp_url) as broker,
            ):
                producer = app.amqp.Producer(broker)
                began = time.monotonic()
                for index, item in enumerate(run.planned):
                    if run.rate:
                        time.sleep(
                            max(0.0, began + index / run.rate - time.monotonic())
                        )
                    item.submitted_at = time.time()  # when the agent asked
                    tries = [0]

                    def queue(item: Planned = item, tries: list[int] = tries) -> None:
                        tries[0] += 1
                        run.world.queue_execution(item, again=tries[0] > 1)

                    retrying(queue, counter=run.retries, label="submit_db_retries")
                    run_operation_job.apply_async(
                        kwargs={
                            "tenant_id": str(run.world.tenant.pk),
                            "operation_id": str(item.operation_id),
                        },
                        queue=run.queue,
                        task_id=str(item.operation_id),  # deliveries map to ops
                        producer=producer,
                    )
            run.clock.mark("submitted")
        except BaseException as error:  # surfaced by join()  # noqa: BLE001
            self.error = error
        finally:
            connection.close()  # this thread's own connection to the test database
            self.done.set()

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self.error is not None:
            raise self.error


@dataclass
class Run:
    """What a scenario sets up before the clock starts, and what it saw."""

    world: World
    pool: WorkerPool
    queue: str
    amqp_url: str
    ops: int
    drain_s: float  # from the first submission until all must have settled
    rate: float = 0.0  # submissions per second; 0: as fast as the process goes
    clock: Clock = field(default_factory=Clock)
    planned: list[Planned] = field(default_factory=list)
    settle_figures: dict[str, int] = field(default_factory=dict)
    retries: Counter[str] = field(default_factory=Counter)
    submitter: Submitter | None = None

    def plan(self) -> None:
        self.planned = [
            retrying(
                functools.partial(self.world.plan, n),
                counter=self.retries,
                label="plan_db_retries",
            )
            for n in range(self.ops)
        ]
        self.clock.mark("planned")

    def start_workers(self) -> None:
        self.pool.start_all()
        self.clock.mark("workers_ready")

    def submit(self) -> None:
        """Start submitting in the background; ``settle`` runs meanwhile."""
        self.submitter = Submitter(self)
        self.submitter.start()

    def sweep(self) -> int:
        """One settle-job pass (what celery beat starts every 10 s in production)."""
        return int(check_receipts_job(limit=200))

    def drained(self) -> bool:
        """Everything submitted and no message waiting: the workers are done."""
        if self.submitter is None or not self.submitter.done.is_set():
            return False
        try:
            return queue_depth(self.amqp_url, self.queue) == 0
        except Exception:  # noqa: BLE001
            return False

    def settle(self, between: Callable[[], None] = lambda: None) -> None:
        """Run the settle loop until every operation is terminal (or the deadline)."""
        assert self.submitter is not None, "submit() first"
        self.settle_figures = settle(
            tenant_id=self.world.tenant.pk,
            total=self.ops,
            deadline=time.monotonic() + self.drain_s,
            sweep=self.sweep,
            drained=self.drained,
            between=between,
        )
        self.clock.mark("settled")
        self.submitter.join(60)

    def verdict(self) -> tuple[Verdict, dict[str, Any]]:
        """The checks, and the figures every chaos test reports."""
        views = retrying(lambda: operation_views(self.world.tenant.pk))
        tickets = self.world.tickets()
        verdict = check(views=views, tickets=tickets)
        submitted = {item.operation_id: item.submitted_at for item in self.planned}
        latencies = [
            view.updated_at.timestamp() - submitted[view.id]
            for view in views.values()
            if view.state == "verified" and submitted.get(view.id) is not None
        ]
        deliveries = self.pool.deliveries()
        logs = "".join(
            slot.log_path.read_text(errors="replace")
            for slot in self.pool.slots
            if slot.log_path.exists()
        )
        attempts = Counter(view.attempts for view in views.values())
        figures: dict[str, Any] = {
            "operations": self.ops,
            "workers": len(self.pool.slots),
            "concurrency_per_worker": self.pool.concurrency,
            "duplicates": sum(n - 1 for n in verdict.duplicates.values()),
            "lost": len(verdict.lost),
            "final_states": dict(verdict.final_states),
            "desk_tickets_for_tenant": len(tickets),
            "event_mismatches": len(verdict.event_mismatches),
            "receipt_mismatches": len(verdict.receipt_mismatches),
            "deliveries": sum(deliveries.values()),
            "redeliveries": sum(deliveries.values()) - len(deliveries),
            "messages_redelivered": sum(1 for n in deliveries.values() if n > 1),
            "messages_never_logged": self.ops - len(deliveries),
            "job_failures_logged": len(_JOB_FAILED.findall(logs)),
            "jobs_killed_with_their_child": len(_WORKER_LOST.findall(logs)),
            "stale_state_refusals_logged": len(_STALE.findall(logs)),
            "attempts_histogram": {str(k): v for k, v in sorted(attempts.items())},
            "calls_made_but_unrecorded": sum(
                view.attempts - view.count("connector.called")
                for view in views.values()
            ),
            "settled_through_recovery": sum(
                1 for view in views.values() if view.count("operation.unknown")
            ),
            "latency_submit_to_settled_s": {
                "p50": round(percentile(latencies, 50), 3),
                "p99": round(percentile(latencies, 99), 3),
                "max": round(max(latencies, default=0.0), 3),
            },
            "settle_loop": self.settle_figures,
            "test_process_db_retries": dict(self.retries),
            "timeline_s": dict(self.clock.marks),
        }
        return verdict, figures


def nemesis_figures(nemesis: Nemesis, clock: Clock) -> dict[str, Any]:
    return {
        "kills": {"child": nemesis.kills["child"], "main": nemesis.kills["main"]},
        "kills_total": sum(nemesis.kills.values()),
        "pauses": nemesis.pauses,
        "strikes_held_back_half_out": nemesis.held_back,
        "paused_s_total": round(nemesis.paused_s, 1),
        "worker_restarts": nemesis.restarts,
        # Mains that exited on their own (see WorkerPool.supervise), restarted.
        "worker_self_exits": len(nemesis.self_exits),
        "last_kill_s": (
            round(nemesis.last_kill_at - clock.started, 2)
            if nemesis.last_kill_at is not None
            else None
        ),
    }
