"""Run one gateway execution in a separate process, crashing or pausing at a named point.

Used by fault tests to kill the process for real (SIGKILL) after the remote system
acted and before the portal recorded it, or to stop it (SIGSTOP, sent to itself)
while it holds the task's lease; the test resumes it with SIGCONT.
``--lease-ttl`` renews the lease for that many seconds first, as a worker's heartbeat
does, so the lease lapses while the process is stopped. The first line printed is the
process's own clock (``time.time()``: a test running it under ``faketime`` checks the
skew took); the last is the outcome, or the refusal's code (exit status 3).
``DATABASE_URL`` must name the test database.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--operation", required=True)
    parser.add_argument("--lease-token", type=int, required=True)
    parser.add_argument("--agent", required=True)
    parser.add_argument("--fields", required=True, help="JSON list of field values")
    parser.add_argument("--crash-at", default="", help="hook point to SIGKILL at")
    parser.add_argument("--stop-at", default="", help="hook point to SIGSTOP at")
    parser.add_argument("--lease-ttl", type=float, help="renew the lease first (s)")
    args = parser.parse_args()

    print(json.dumps({"clock": time.time()}))
    sys.stdout.flush()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from portal import scope
    from portal import selectors as portal_selectors
    from portal.actors import Actor, ActorType
    from portal.exceptions import PortalError
    from tasks import gateway
    from tasks import services as task_services
    from tasks.models import Operation

    def hook(point: str) -> None:
        if point == args.crash_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if point == args.stop_at:
            os.kill(os.getpid(), signal.SIGSTOP)  # until the test sends SIGCONT

    fields = [
        gateway.FieldValue(
            name=item["name"],
            value=item["value"],
            source=item["source"],
            observed_at=dt.datetime.fromisoformat(item["observed_at"]),
        )
        for item in json.loads(args.fields)
    ]
    # The agent's request would work in its tenant's scope (portal/scope.py).
    with scope.tenant_scope([args.tenant]):
        tenant = portal_selectors.tenant_get(tenant_id=args.tenant)
        try:
            if args.lease_ttl is not None:
                task_services.task_lease_renew(
                    tenant=tenant,
                    task_id=Operation.objects.get(
                        tenant=tenant, pk=args.operation
                    ).task_id,
                    lease_token=args.lease_token,
                    ttl_s=args.lease_ttl,
                )
            result = gateway.operation_execute(
                tenant=tenant,
                operation_id=args.operation,
                lease_token=args.lease_token,
                fields=fields,
                actor=Actor(type=ActorType.AGENT, id=args.agent),
                _test_hook=hook,
            )
        except PortalError as error:  # a fenced write: refused, nothing written
            print(json.dumps({"refused": error.code}))
            sys.stdout.flush()
            sys.exit(3)
    print(json.dumps({"outcome": result.outcome, "reason": result.reason}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
