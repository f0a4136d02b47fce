"""A relay in its own process, for crash tests: ``python -m tests.worker.relay_process``.

Runs ``outbox_relay_drain`` once against the database in ``DATABASE_URL`` and the
broker in ``PORTAL_EVENTS_BROKER_URL``, then prints its report as JSON. Fault point:
with ``PORTAL_FAULT_POINT=after_publish`` (any of ``relay.FAULT_POINTS``) the process
SIGKILLs itself the ``PORTAL_FAULT_AFTER``-th time (default 1) it passes that point
(``after_publish`` and ``after_record`` are passed once per wave), so nothing after
it runs: no ``sent`` mark, no cleanup. ``PORTAL_TEST_CLAIM_LEASE_S``
shortens the claim lease so a test need not wait 30 s for it to lapse.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import django


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from django.conf import settings

    from audit import relay
    from audit.broker import broker_publisher

    if lease := os.environ.get("PORTAL_TEST_CLAIM_LEASE_S"):
        settings.PORTAL_OUTBOX_CLAIM_LEASE_S = float(lease)
    fault_point = os.environ.get("PORTAL_FAULT_POINT", "")
    if fault_point and fault_point not in relay.FAULT_POINTS:
        raise SystemExit(f"unknown fault point {fault_point!r}")
    remaining = int(os.environ.get("PORTAL_FAULT_AFTER", "1"))

    def hook(point: str) -> None:
        nonlocal remaining
        if point == fault_point:
            remaining -= 1
            if remaining == 0:
                print(json.dumps({"killed_at": point}), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    with broker_publisher() as publisher:
        report = relay.outbox_relay_drain(publisher=publisher, _test_hook=hook)
    print(json.dumps(report.as_json()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
