"""Export of a selection of events as CSV or JSON Lines, streamed, and audited.

Memory stays flat whatever the size: rows come from a server-side cursor in chunks
(``queryset.iterator``) inside one read transaction (a consistent snapshot, and no
``WITH HOLD`` cursor, which PostgreSQL would materialise whole before the first
row), and leave as encoded chunks of a ``StreamingHttpResponse``.

Each export is recorded as ``audit.exported``, one event per tenant in the
selection, naming the person, the filter and the number of rows. The event is
written when the stream ends, complete or cut off (the server closes the generator
when the client goes away): only then is the row count exact, and counting first
would mean a full ``COUNT(*)`` before the first byte. The one case without an event
is the process dying mid-stream.
"""

from __future__ import annotations

import csv
import io
import json
import uuid
from collections import Counter
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any, Final, cast

from django.db import transaction
from django.db.models import QuerySet

from audit import payloads
from audit import services as audit_services
from audit.models import Event, EventCode
from portal.actor_names import ActorNames
from portal.actors import Actor, ActorType
from portal.roles import Person

CHUNK_ROWS: Final = 2000
FORMATS: Final = {
    "csv": ("text/csv; charset=utf-8", "csv"),
    "jsonl": ("application/x-ndjson; charset=utf-8", "jsonl"),
}
COLUMNS: Final = (
    "id",
    "created_at",
    "tenant_id",
    "tenant__slug",
    "code",
    "actor_type",
    "actor_id",
    "reason_code",
    "task_id",
    "operation_id",
    "contract_key",
    "contract_version",
    "trace_id",
    "span_id",
    "chain_seq",
    "prev_hash",
    "hash",
    "payload_digest",
    "payload",
)
# What a row says, in this order: the stored columns with the actor's name (the
# agent's or the person's, as the pages show it) after its id, and the chain's
# sequence number and hashes, so a reader can place each row in its chain.
HEADER: Final = (
    *(
        name.replace("tenant__slug", "tenant")
        for name in COLUMNS[: COLUMNS.index("actor_id") + 1]
    ),
    "actor_name",
    *COLUMNS[COLUMNS.index("actor_id") + 1 :],
)
_TENANT_ID = COLUMNS.index("tenant_id")
_ACTOR = COLUMNS.index("actor_type")
# A spreadsheet runs a cell that starts with one of these as a formula.
_FORMULA_START: Final = ("=", "+", "-", "@", "\t", "\r")


def _plain(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def _csv_cell(value: Any) -> Any:
    if isinstance(value, dict | list):
        value = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    value = _plain(value)
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value  # shown as text, never evaluated
    return value


def _encode_csv(rows: Sequence[tuple[Any, ...]], *, header: bool) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out)
    if header:
        writer.writerow(HEADER)
    writer.writerows([_csv_cell(value) for value in row] for row in rows)
    return out.getvalue().encode()


def _encode_jsonl(rows: Sequence[tuple[Any, ...]]) -> bytes:
    return "".join(
        json.dumps(
            {name: _plain(value) for name, value in zip(HEADER, row, strict=True)},
            ensure_ascii=False,
            separators=(",", ":"),
        )
        + "\n"
        for row in rows
    ).encode()


class _ExportNames:
    """The actors' names for a whole export: each actor is looked up once (at most
    two queries for the chunk where it first appears), not again in every chunk.
    Names are read on the primary (portal's tables are not the record), so an
    export on a replica asks the primary for each actor once, not for each row."""

    def __init__(self) -> None:
        self.known: dict[tuple[str, str], str] = {}

    def named(self, rows: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """The rows with their actors' names after the actor's id."""
        unseen: set[tuple[str, str]] = set()
        tenant_ids: set[uuid.UUID] = set()
        for row in rows:
            actor = (row[_ACTOR], row[_ACTOR + 1])
            if actor not in self.known and actor not in unseen:
                unseen.add(actor)
                tenant_ids.add(row[_TENANT_ID])
        if unseen:
            names = ActorNames(unseen, tenant_ids=tenant_ids)
            for actor_type, actor_id in unseen:
                self.known[actor_type, actor_id] = names.name(actor_type, actor_id) or (
                    actor_id if actor_type == ActorType.SYSTEM else ""
                )
        known = self.known
        return [
            (
                *row[: _ACTOR + 2],
                known[row[_ACTOR], row[_ACTOR + 1]],
                *row[_ACTOR + 2 :],
            )
            for row in rows
        ]


def export_stream(
    *,
    queryset: QuerySet[Event],
    fmt: str,
    by: Person,
    tenants: Mapping[uuid.UUID, str],
    filters: Mapping[str, Any],
    chunk_rows: int = CHUNK_ROWS,
) -> Iterator[bytes]:
    """Encoded chunks of the selection; records the export when the stream ends.

    ``tenants`` are the tenants the selection may hold (id → slug), each already
    checked for the export permission; ``queryset`` must be limited to them.
    """
    counts: Counter[uuid.UUID] = Counter()
    complete = False
    names = _ExportNames()

    def encode(batch: Sequence[tuple[Any, ...]]) -> bytes:
        if fmt == "csv":
            return _encode_csv(names.named(batch), header=False)
        return _encode_jsonl(names.named(batch))

    try:
        if fmt == "csv":
            yield _encode_csv([], header=True)
        # One snapshot, no WITH HOLD cursor; where the queryset reads (a replica).
        with transaction.atomic(using=queryset.db):
            rows = cast(
                Generator[tuple[Any, ...], None, None],
                queryset.values_list(*COLUMNS).iterator(chunk_size=chunk_rows),
            )
            try:
                batch: list[tuple[Any, ...]] = []
                for row in rows:
                    counts[row[_TENANT_ID]] += 1
                    batch.append(row)
                    if len(batch) >= chunk_rows:
                        yield encode(batch)
                        batch = []
                if batch:
                    yield encode(batch)
            finally:
                rows.close()  # the server-side cursor, before its transaction ends
        complete = True
    finally:
        export_record(
            by=by,
            tenants=tenants,
            counts=counts,
            fmt=fmt,
            filters=filters,
            complete=complete,
        )


@transaction.atomic(durable=True)
def export_record(
    *,
    by: Person,
    tenants: Mapping[uuid.UUID, str],
    counts: Mapping[uuid.UUID, int],
    fmt: str,
    filters: Mapping[str, Any],
    complete: bool,
) -> None:
    """Write one ``audit.exported`` event per tenant of the selection.

    Guarantee: the events of one export commit together, each with the person as
    actor, the filter, its own tenant's row count and the total.
    """
    total = sum(counts.values())
    for tenant_id in sorted(tenants, key=str):
        audit_services.event_append(
            tenant_id=tenant_id,
            code=EventCode.AUDIT_EXPORTED,
            actor=Actor.of_user(by),
            data=payloads.AuditExported(
                {
                    "format": fmt,
                    "rows": counts.get(tenant_id, 0),
                    "rows_total": total,
                    "tenants": sorted(tenants.values()),
                    "filters": dict(filters),
                    "complete": complete,
                }
            ),
        )
