"""The append-only export of tree heads: one JSON-lines file per tenant.

After a checkpoint run committed and the head went to the witnesses and the TSA
(audit/witness_client.py), ``head_export`` appends one line to
``<PORTAL_AUDIT_EXPORT_DIR>/<tenant id>.jsonl``: the head's size, root, signed
note with every cosignature line, its RFC 3161 token (base64 DER) when it has
one, and when it was signed. The file is opened ``O_APPEND`` (never rewritten,
never truncated) and fsynced before the call returns. Production puts the folder
on object-lock (WORM) storage, so a copy of every head outlives whatever happens
to the database (docs/audit-integrity.md, "Append-only export").

A head is appended once: a line is written only for a head larger than the
file's last one (a crash between the write and the next run repeats nothing,
and may leave a head out, which the next head's line covers by consistency).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

if TYPE_CHECKING:
    from .models import TreeHead

TAIL_BYTES = 256 * 1024


def export_path(tenant_id: object) -> Path:
    return Path(settings.PORTAL_AUDIT_EXPORT_DIR) / f"{tenant_id}.jsonl"


def last_exported_size(path: Path) -> int:
    """The size of the file's last complete line's head; -1 for none."""
    try:
        with open(path, "rb") as file:
            file.seek(0, os.SEEK_END)
            end = file.tell()
            file.seek(max(0, end - TAIL_BYTES))
            tail = file.read()
    except FileNotFoundError:
        return -1
    for line in reversed(tail.split(b"\n")):
        try:
            return int(json.loads(line)["size"])
        except (ValueError, KeyError, TypeError):
            continue
    return -1


def head_line(head: TreeHead) -> dict[str, Any]:
    from .models import HeadStamp

    stamps = list(HeadStamp.objects.filter(tree_head=head).order_by("kind", "signer"))
    cosignatures = "".join(
        s.stamp for s in stamps if s.kind == HeadStamp.Kind.COSIGNATURE
    )
    return {
        "tenant_id": str(head.tenant_id),
        "size": head.size,
        "root_hash": head.root_hash,
        "signed_at": head.signed_at.isoformat(),
        "note": head.note + cosignatures,
        "rfc3161": [
            {"tsa": s.signer, "token": s.stamp}
            for s in stamps
            if s.kind == HeadStamp.Kind.RFC3161
        ],
    }


def head_export(head: TreeHead) -> bool:
    """Append ``head`` to its tenant's export file (fsynced); False when the file
    already has it or a later head."""
    path = export_path(head.tenant_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    if last_exported_size(path) >= head.size:
        return False
    data = (json.dumps(head_line(head), sort_keys=True) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return True
