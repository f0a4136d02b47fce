"""What a tenant purge leaves behind: the signed tombstone of its log.

A tenant deleted under ``purge`` loses its events, checkpoints and its row; its
transparency log's leaves and signed heads stay (``audit_logentry``,
``audit_treehead``: no foreign key to the tenant), and the log ends in a
**tombstone**: a C2SP checkpoint note over the log's final size and root with the
extension line ``tombstone: tenant purged`` (``audit.tlog.TOMBSTONE_LINE``), signed
by the audit key (docs/tenant-deletion.md, docs/audit-integrity.md).
``verify_audit`` checks it against the kept log.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from portal.ids import new_id


class Tombstone(models.Model):
    """The signed last head of a purged tenant's log; one per tenant, append-only.

    No foreign key (the tenant row is gone); row-level security by the tenant's
    id like every tenant table. Written by the operator (``tenant_delete``) in the
    purge's transaction; the purge function refuses to purge without a tombstone
    of the log as it stands. ``verify_audit`` finds them through the discovery
    function ``audit_tenants_with_log``.
    """

    tenant_id = models.UUIDField(primary_key=True)
    slug = models.CharField(max_length=64)
    size = models.BigIntegerField()
    root_hash = models.CharField(max_length=64)  # hex
    note = models.TextField()  # the signed tombstone note (audit/tlog.py)
    key_id = models.CharField(max_length=16)
    signed_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(size__gte=0), name="tenant_deletion_tombstone_size_check"
            ),
        ]

    def __str__(self) -> str:
        return f"tombstone of tenant {self.slug} at size {self.size}"


class TombstoneStamp(models.Model):
    """A witness's cosignature of a purged tenant's tombstone (audit/witness.py).

    The tombstone is a checkpoint with one extension line; C2SP ``cosignature/v1``
    signs the whole checkpoint body, extension lines included, so the witness's
    line binds ``tombstone: tenant purged`` as well as the size and root. Written
    by the operator after the purge commits (``tombstone_witness``), one per
    witness; append-only (trigger), row-level security by the tenant's id.
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    tombstone = models.ForeignKey(
        Tombstone, on_delete=models.PROTECT, db_column="tenant_id"
    )
    # The witness's name (its verifier key's name).
    signer = models.CharField(max_length=255)
    # The cosignature line as the witness answered it.
    stamp = models.TextField()
    # The cosignature's own timestamp.
    stamped_at = models.DateTimeField()
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tombstone", "signer"],
                name="tenant_deletion_tombstonestamp_uniq",
            ),
        ]

    def __str__(self) -> str:
        return f"cosignature by {self.signer} of {self.tombstone_id}'s tombstone"
