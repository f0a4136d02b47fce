"""A business transaction that commits, then dies before any enqueue.

``python -m tests.worker.writer_process TENANT_ID COUNT``: appends COUNT events (one
outbox row each) in one transaction that also asks for a relay nudge; a commit hook
registered *before* the nudge SIGKILLs the process, so the commit happens and the
nudge is never sent. Prints the event ids (before the commit) as one JSON line.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import uuid

import django


def main(tenant_id: str, count: int) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from django.db import transaction

    from audit import relay
    from audit import services as audit_services
    from audit.models import EventCode
    from portal import scope
    from portal.actors import Actor
    from portal.tracing import Trace

    # As a request of this tenant would (row-level security).
    with scope.tenant_scope([tenant_id]), transaction.atomic(durable=True):
        event_ids = [
            str(
                audit_services.event_append(
                    tenant_id=uuid.UUID(tenant_id),
                    code=EventCode.TASK_REGISTERED,
                    actor=Actor.system("writer-process"),
                    task_id=uuid.uuid4(),
                    trace=Trace.new(),
                )
            )
            for _ in range(count)
        ]
        print(json.dumps({"event_ids": event_ids}), flush=True)
        # Commit hooks run in order: this one kills the process before the nudge.
        transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))
        relay.nudge_relay()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
