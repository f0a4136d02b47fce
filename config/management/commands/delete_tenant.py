"""``manage.py delete_tenant <slug> [--dry-run] [--yes]``: the declared deletion policy.

The policy and its reasons are in docs/tenant-deletion.md; the code is
``tenant_deletion.services.tenant_delete``. This command only finds the tenant, asks
for confirmation and prints what went. The deletion (and its dry run) runs connected
as the operator role (``DATABASE_OPERATOR_URL``), the only role that may execute the
owner's purge function; the app role cannot.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Mapping
from typing import Any, TextIO

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import OperationalError

from portal import db_roles, scope
from portal.actors import Actor
from portal.exceptions import PortalError
from portal.models import EventsOnDelete, Tenant
from tenant_deletion import services as deletion

ACTOR_ID = "delete_tenant"


def _policy_lines(events_on_delete: str) -> list[str]:
    tables = ["object permissions"] + [
        model._meta.db_table for model in deletion.DELETION_ORDER
    ]
    if events_on_delete == EventsOnDelete.PURGE:
        events = (
            "the audit events and their signed checkpoints are deleted, then the "
            "tenant row itself; the transparency log's leaves and signed heads "
            "stay and end in a signed tombstone (needs the audit signing key)"
        )
    else:
        events = (
            "the audit events and their signed checkpoints stay, one "
            "tenant.deleted event is appended and the "
            "tenant row stays as a tombstone (deleted_at set)"
        )
    return [
        "Policy (docs/tenant-deletion.md), one transaction, all or nothing:",
        "  1. revoke: credentials and agent keys revoked, agents deactivated",
        "  2. delete, children before parents:",
        *textwrap.wrap(
            ", ".join(tables),
            width=88,
            initial_indent=" " * 5,
            subsequent_indent=" " * 5,
        ),
        f"  3. events ({events_on_delete}):",
        *textwrap.wrap(
            events, width=88, initial_indent=" " * 5, subsequent_indent=" " * 5
        ),
    ]


def _count_lines(title: str, counts: Mapping[str, int], width: int) -> list[str]:
    if not counts:
        return [f"{title}: nothing"]
    return [f"{title}:"] + [
        f"  {table:<{width}}  {rows:>8}" for table, rows in counts.items()
    ]


def render(report: deletion.TenantDeletionReport) -> list[str]:
    """The report as lines: per-table counts of what was (or would be) changed."""
    if report.dry_run:
        titles = ("Would revoke", "Would delete", "Would keep")
    else:
        titles = ("Revoked", "Deleted", "Kept")
    sections = (report.revoked, report.deleted, report.kept)
    width = max(len(table) for counts in sections for table in counts)
    return [
        line
        for title, counts in zip(titles, sections, strict=True)
        for line in _count_lines(title, counts, width)
    ]


class Command(BaseCommand):
    help = (
        "Delete a tenant by the declared policy: credentials revoked first; tasks, "
        "operations, outbox and identities removed; audit events kept or purged by "
        "the tenant's events_on_delete setting. See docs/tenant-deletion.md."
    )
    # Tests pass a stand-in stdin, as Django's own createsuperuser allows.
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug", help="the tenant's slug")
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="print what would be revoked, deleted and kept; change nothing",
        )
        parser.add_argument(
            "--yes",
            action="store_true",
            help="do not ask for confirmation (needed when stdin is not a terminal)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        slug: str = options["slug"]
        stdin: TextIO | None = options.get("stdin", sys.stdin)
        tenant = Tenant.objects.filter(slug=slug).first()
        if tenant is None:
            raise CommandError(f"No tenant with slug {slug!r}; nothing was deleted.")
        actor = Actor.system(ACTOR_ID)

        self._write(
            f"Tenant {tenant.slug!r} ({tenant.name}, id {tenant.pk}), "
            f"events_on_delete={tenant.events_on_delete}"
        )
        self._write(*_policy_lines(tenant.events_on_delete))

        if options["dry_run"]:
            report = self._delete(tenant=tenant, actor=actor, dry_run=True)
            self._write("Dry run: nothing was changed.", *render(report))
            return

        if not options["yes"]:
            if stdin is None or not stdin.isatty():
                raise CommandError(
                    "Refusing to delete without confirmation: stdin is not a "
                    "terminal. Run with --dry-run to see what would go, then pass "
                    "--yes to confirm. Nothing was deleted."
                )
            preview = self._delete(tenant=tenant, actor=actor, dry_run=True)
            self._write(*render(preview))
            self.stdout.write(
                f"Type the slug {tenant.slug!r} to delete this tenant: ", ending=""
            )
            self.stdout.flush()
            if stdin.readline().strip() != tenant.slug:
                raise CommandError("Confirmation did not match; nothing was deleted.")

        report = self._delete(tenant=tenant, actor=actor, dry_run=False)
        self._write(*render(report))
        if report.events_on_delete == EventsOnDelete.PURGE:
            self._witness_tombstone(report)
        outcome = f"Tenant {report.slug!r} deleted"
        if report.event_id is not None:
            outcome += f"; events kept, tenant.deleted event {report.event_id}"
        self.stdout.write(self.style.SUCCESS(outcome + "."))

    def _delete(
        self, *, tenant: Tenant, actor: Actor, dry_run: bool
    ) -> deletion.TenantDeletionReport:
        try:
            with (
                db_roles.connected_as("default", db_roles.operator_url()),
                scope.tenant_scope([tenant.pk]),  # row-level security: this tenant
            ):
                return deletion.tenant_delete(
                    tenant=tenant, actor=actor, dry_run=dry_run
                )
        except PortalError as error:
            raise CommandError(str(error)) from error
        except OperationalError as error:
            raise CommandError(
                f"Cannot connect as the operator role ({error}). Set "
                'DATABASE_OPERATOR_URL (README, "Database roles"). Nothing was '
                "deleted."
            ) from error

    def _witness_tombstone(self, report: deletion.TenantDeletionReport) -> None:
        """The committed tombstone to the configured witnesses (after the purge's
        transaction: HTTP), as the operator, who alone stores their answers."""
        with (
            db_roles.connected_as("default", db_roles.operator_url()),
            scope.tenant_scope([report.tenant_id]),
        ):
            missing = deletion.tombstone_witness(tenant_id=report.tenant_id)
        if missing:
            self.stderr.write(
                "The tombstone is not cosigned by witness(es) "
                f"{', '.join(missing)} (see the log); verify_audit reports it "
                "'not witnessed' after 10 minutes."
            )

    def _write(self, *lines: str) -> None:
        for line in lines:
            self.stdout.write(line)
