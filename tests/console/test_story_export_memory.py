"""An export's memory stays flat however many rows it streams.

``EXPORT_MEMORY_ROWS`` sets the size (200,000 by default; 1,000,000 by hand).
Run with ``-s`` to see the figures.
"""

from __future__ import annotations

import os
import time

import psutil
import pytest
from django.db import connection

from audit.models import Event, EventCode

pytestmark = pytest.mark.django_db

ROWS = int(os.environ.get("EXPORT_MEMORY_ROWS", "200000"))
MB = 1024 * 1024


def _bulk_events(task, rows: int, batch: int = 50_000) -> None:
    """Realistic rows fast: INSERT … SELECT in batches (each within the statement
    timeout), the bench loader's way rather than one service call per row."""
    for start in range(0, rows, batch):
        _insert(task, start + 1, min(start + batch, rows))


def _insert(task, first: int, last: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO audit_event (
                id, tenant_id, task_id, operation_id, code, actor_type, actor_id,
                reason_code, contract_key, contract_version, payload, trace_id, span_id
            )
            SELECT audit_uuid7_at(now()), %s, %s, NULL, %s, 'system', 'bench', NULL,
                   'customer-issue', 3,
                   jsonb_build_object('i', i, 'from', 'running', 'to', 'waiting',
                                      'note', repeat('x', 120)),
                   md5(i::text), substr(md5((i + 1)::text), 1, 16)
            FROM generate_series(%s, %s) AS i
            """,
            [task.tenant_id, task.pk, EventCode.TASK_TRANSITIONED, first, last],
        )


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_exporting_many_rows_keeps_memory_flat(
    make_task, tenant, make_person, login, fmt
):
    # given many events of one tenant
    task = make_task()
    _bulk_events(task, ROWS)
    client = login(make_person("rita", tenant=tenant, role="reviewer"))
    process = psutil.Process()
    # when they are exported and read chunk by chunk
    started = time.monotonic()
    response = client.get(f"/admin/audit/event/export/{fmt}/")
    first_byte = None
    samples: list[int] = []
    size = lines = 0
    for chunk in response.streaming_content:
        if first_byte is None:
            first_byte = time.monotonic() - started
        size += len(chunk)
        lines += chunk.count(b"\n")
        samples.append(process.memory_info().rss)
    elapsed = time.monotonic() - started
    # then every row went out, and the process grew by no more than a few MB after
    # the first tenth (the warm-up: imports, the first chunks' buffers)
    assert lines == ROWS + (1 if fmt == "csv" else 0)
    settled = samples[len(samples) // 10 :]
    growth = (max(settled) - min(settled)) / MB
    print(
        f"\n{fmt}: {ROWS} rows, {size / MB:.0f} MB out in {elapsed:.1f} s "
        f"(first chunk {first_byte:.3f} s); RSS {samples[0] / MB:.0f} MB at the first "
        f"chunk, {min(settled) / MB:.0f}-{max(settled) / MB:.0f} MB after the first "
        f"tenth (growth {growth:.1f} MB), {max(samples) / MB:.0f} MB peak"
    )
    assert growth < 16, f"{growth:.1f} MB"
    assert size > 50 * ROWS  # far more bytes went out than the process ever held
    exported = Event.objects.get(tenant=tenant, code=EventCode.AUDIT_EXPORTED)
    assert exported.payload["rows"] == ROWS
