"""Reads of what tenant deletion leaves behind (docs/tenant-deletion.md)."""

from __future__ import annotations

import uuid

from .models import Tombstone, TombstoneStamp


def tombstones(*, slug: str | None = None) -> list[Tombstone]:
    """The purged tenants' tombstones by slug (one slug's, when given).

    A slug may come back after a purge (it is free again), so one slug can name
    a live tenant and purged ones; each tombstone is its own tenant id.
    """
    rows = Tombstone.objects.order_by("slug", "signed_at")
    return list(rows.filter(slug=slug) if slug is not None else rows)


def tombstone_stamps(*, tenant_id: uuid.UUID) -> list[tuple[str, str]]:
    """A purged tenant's tombstone cosignatures as ``(witness name, line)``."""
    rows = TombstoneStamp.objects.filter(tombstone_id=tenant_id).order_by("created_at")
    return list(rows.values_list("signer", "stamp"))
