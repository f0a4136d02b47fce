"""Run one gateway execution in a separate process, crashing at a named point.

Used by fault tests to kill the process for real (SIGKILL) after the remote system
acted and before the portal recorded it. ``DATABASE_URL`` must name the test database.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import sys


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--operation", required=True)
    parser.add_argument("--lease-token", type=int, required=True)
    parser.add_argument("--agent", required=True)
    parser.add_argument("--fields", required=True, help="JSON list of field values")
    parser.add_argument("--crash-at", default="", help="hook point to SIGKILL at")
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from portal import scope
    from portal import selectors as portal_selectors
    from portal.actors import Actor, ActorType
    from tasks import gateway

    def hook(point: str) -> None:
        if point == args.crash_at:
            os.kill(os.getpid(), signal.SIGKILL)

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
        result = gateway.operation_execute(
            tenant=portal_selectors.tenant_get(tenant_id=args.tenant),
            operation_id=args.operation,
            lease_token=args.lease_token,
            fields=fields,
            actor=Actor(type=ActorType.AGENT, id=args.agent),
            _test_hook=hook,
        )
    print(json.dumps({"outcome": result.outcome, "reason": result.reason}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
