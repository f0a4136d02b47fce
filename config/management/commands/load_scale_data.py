"""``manage.py load_scale_data``: a realistic data set at scale, via COPY (dev only;
config/scale_data/ says what it makes)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from config.scale_data.loading import duration, load
from config.scale_data.rows import CHUNK_TASKS


class Command(BaseCommand):
    help = (
        "Load a realistic data set (tenants, people, agents, tasks, operations, "
        "escalations, events, outbox) through COPY, for performance work "
        "(development only)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tasks", type=int, default=1_000_000)
        parser.add_argument("--events", type=int, default=10_000_000)
        parser.add_argument("--tenants", type=int, default=20)
        parser.add_argument(
            "--outbox",
            type=int,
            default=None,
            help="about how many outbox rows (default: one per published event)",
        )
        parser.add_argument("--seed", type=int, default=8)
        parser.add_argument(
            "--append",
            action="store_true",
            help="add --tasks/--events on top of what the database holds",
        )
        parser.add_argument(
            "--chunk", type=int, default=CHUNK_TASKS, help="tasks per transaction"
        )
        parser.add_argument(
            "--writers",
            type=int,
            default=2,
            help="threads that COPY, each on its own connection (default: 2; "
            "0 writes in the calling thread)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # The set-up's events need no live relay (beat finds pending rows anyway);
        # without a broker each nudge would only wait for a timeout.
        settings.PORTAL_RELAY_NUDGE = False
        summary = load(
            tasks=options["tasks"],
            events=options["events"],
            tenants=options["tenants"],
            outbox=options["outbox"],
            seed=options["seed"],
            append=options["append"],
            report=lambda line: self.stdout.write(f"load_scale_data: {line}"),
            progress=lambda text: self.stderr.write(text, ending=""),
            progress_tty=self.stderr.isatty(),
            chunk_tasks=options["chunk"],
            writers=options["writers"],
        )
        rate = summary.events / summary.seconds if summary.seconds else 0.0
        self.stdout.write(
            f"load_scale_data: loaded {summary.tasks:,} tasks, "
            f"{summary.operations:,} operations, {summary.credentials:,} credentials, "
            f"{summary.escalations:,} escalations, {summary.events:,} events and "
            f"{summary.outbox:,} outbox rows in {duration(summary.seconds)} "
            f"({rate:,.0f} events/s)"
        )
