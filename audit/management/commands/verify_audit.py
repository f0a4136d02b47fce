"""``manage.py verify_audit [--tenant SLUG] [--public-key PEM]``: check the trail.

Recomputes every event chain and compares it with the signed checkpoints
(audit/verify.py), then each tenant's transparency log with its events and signed
tree heads (audit/verify_log.py). Exit 0 when intact; 1 with the first break and
its kind.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit import checkpoints, timestamp, verify, verify_log, witness_client
from portal import scope
from portal.models import Tenant
from tenant_deletion import selectors as deletion_selectors

PROGRESS_EVERY = 50_000


class Command(BaseCommand):
    help = "Verify the audit event chains against their signed checkpoints."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", metavar="SLUG", help="only this tenant")
        parser.add_argument(
            "--witness-key",
            action="append",
            default=[],
            metavar="VKEY",
            help="require this witness's cosignatures (its verifier key, or a file "
            "holding it, optionally followed by its URL); repeatable; default: "
            "PORTAL_AUDIT_WITNESSES",
        )
        parser.add_argument(
            "--tsa-root",
            metavar="PEM",
            help="check every RFC 3161 token against this root; default: "
            "PORTAL_AUDIT_TSA_ROOT_FILE",
        )
        parser.add_argument(
            "--public-key",
            action="append",
            default=[],
            metavar="PEM",
            help="trust this public key file (repeatable); default: the published "
            "one (PORTAL_AUDIT_PUBLIC_KEY_FILE, or the development key's)",
        )

    def _witnesses(self, vkeys: list[str]) -> list[witness_client.WitnessConfig]:
        try:
            if not vkeys:
                return witness_client.configured()
            return [
                witness_client.witness_parse(
                    Path(v).read_text().strip() if Path(v).is_file() else v
                )
                for v in vkeys
            ]
        except witness_client.WitnessConfigError as error:
            raise CommandError(str(error)) from None

    def _public_keys(self, files: list[str]) -> dict[str, Ed25519PublicKey]:
        if not files:
            key_id, published = checkpoints.public_key()
            return {key_id: published}
        keys: dict[str, Ed25519PublicKey] = {}
        for name in files:
            public = serialization.load_pem_public_key(Path(name).read_bytes())
            if not isinstance(public, Ed25519PublicKey):
                raise CommandError(f"{name}: not an Ed25519 public key")
            keys[checkpoints.key_id_of(public)] = public
        return keys

    def handle(self, *args: Any, **options: Any) -> None:
        public_keys = self._public_keys(options["public_key"])
        witnesses = self._witnesses(options["witness_key"])
        tsa_roots = (
            timestamp.roots_load(Path(options["tsa_root"]).read_bytes())
            if options["tsa_root"]
            else timestamp.configured_roots()
        )
        tenants = Tenant.objects.order_by("slug")
        if options["tenant"]:
            tenants = tenants.filter(slug=options["tenant"])
            if not tenants.exists() and not self._tombstones(
                verify_log.purged_tenant_ids(), options["tenant"]
            ):
                raise CommandError(f"no tenant {options['tenant']!r}")
        total = 0
        for tenant in tenants:
            next_note = PROGRESS_EVERY

            def progress(events: int, slug: str = tenant.slug) -> None:
                nonlocal next_note
                if events >= next_note:
                    self.stderr.write(f"  {slug}: {events} events verified…")
                    next_note += PROGRESS_EVERY

            with scope.tenant_scope([tenant.pk]):  # row-level security
                report = verify.verify_tenant(
                    tenant_id=tenant.pk, public_keys=public_keys, progress=progress
                )
                broken = report.broken
                if broken is None:
                    leaves, heads, broken = verify_log.log_verify(
                        tenant_id=tenant.pk, public_keys=public_keys
                    )
                stamps = None
                if broken is None and (witnesses or tsa_roots):
                    stamps = witness_client.tenant_stamps_verify(
                        tenant_id=tenant.pk, witnesses=witnesses, tsa_roots=tsa_roots
                    )
                    broken = stamps.broken
            if broken is not None:
                self.stdout.write(f"BROKEN tenant {tenant.slug}: {broken}")
                sys.exit(1)
            total += report.events
            signed = (
                checkpoints.signed_at_text(report.last_signed_at)
                if report.last_signed_at
                else "never"
            )
            self.stdout.write(
                f"ok tenant {tenant.slug}: {report.events} events in "
                f"{report.chains} chains, {report.checkpoints} checkpoints, last "
                f"signed {signed}; {report.unsigned_tail} events after the last "
                "checkpoint (a cut there shows only after the next one); log of "
                f"{leaves} events under {heads} signed tree heads"
            )
            if stamps is not None:
                self.stdout.write(
                    f"  witnessed: {stamps.cosigned} heads cosigned by "
                    f"{', '.join(w.name for w in witnesses) or 'no witness'}; "
                    f"{stamps.timestamped} RFC 3161 tokens checked"
                )
                for note in stamps.notes:
                    self.stderr.write(f"  {note}")
        self._purged(public_keys, slug=options["tenant"], witnesses=witnesses)
        self.stdout.write(f"intact: {total} events")

    def _tombstones(self, gone: list[uuid.UUID], slug: str | None) -> list[Any]:
        with scope.tenant_scope(gone):  # row-level security: the purged tenants
            return deletion_selectors.tombstones(slug=slug)

    def _purged(
        self,
        public_keys: dict[str, Ed25519PublicKey],
        *,
        slug: str | None,
        witnesses: list[witness_client.WitnessConfig],
    ) -> None:
        """Each purged tenant's kept log and its signed tombstone; then (without
        ``--tenant``) any log whose tenant is gone without a tombstone."""
        gone = verify_log.purged_tenant_ids()
        purged = self._tombstones(gone, slug)
        for tombstone in purged:
            name = f"{tombstone.slug} ({tombstone.tenant_id})"
            with scope.tenant_scope([tombstone.tenant_id]):  # row-level security
                leaves, heads, broken = verify_log.tombstone_verify(
                    tenant_id=tombstone.tenant_id,
                    note=tombstone.note,
                    size=tombstone.size,
                    root_hash=tombstone.root_hash,
                    key_id=tombstone.key_id,
                    public_keys=public_keys,
                )
                if broken is None and witnesses:
                    broken = witness_client.tombstone_stamps_verify(
                        tenant_id=tombstone.tenant_id,
                        note=tombstone.note,
                        size=tombstone.size,
                        signed_at=tombstone.signed_at,
                        stamps=deletion_selectors.tombstone_stamps(
                            tenant_id=tombstone.tenant_id
                        ),
                        witnesses=witnesses,
                    )
            if broken is not None:
                self.stdout.write(f"BROKEN purged tenant {name}: {broken}")
                sys.exit(1)
            self.stdout.write(
                f"ok purged tenant {name}: purged at size {tombstone.size}, "
                f"tombstone valid; log of {leaves} events under {heads} signed "
                "tree heads"
                + (
                    f"; tombstone witnessed by {', '.join(w.name for w in witnesses)}"
                    if witnesses
                    else ""
                )
            )
        if slug is not None:
            return
        tombstoned = {tombstone.tenant_id for tombstone in purged}
        for tenant_id in (t for t in gone if t not in tombstoned):
            self.stdout.write(
                f"BROKEN tenant {tenant_id}: {verify.DELETED}: its log has signed "
                "heads, but the tenant and its events are gone without a tombstone"
            )
            sys.exit(1)
