"""``config.wsgi`` with one armed fault at a named point of the agent API.

The points are ``portal.api.FAULT_POINTS`` (the service has committed; the answer is
not stored yet, or not sent yet). A test arms one by writing ``{"point", "action"}``
as JSON to the file ``PORTAL_FAULT_ARM_FILE``; the first request of any worker
process that passes that point takes the file (a rename: one winner, even across a
worker that was killed and started again), then waits on the PostgreSQL advisory
lock ``PORTAL_FAULT_LOCK`` (a number) that the test holds, so that the test sees the request parked
there (``pg_stat_activity``: a session waiting for a lock). The test then acts:

- ``raise``: it releases the lock and the request raises (an unexpected error after
  the commit);
- ``terminate``: it ends the request's session (``pg_terminate_backend``); the
  request carries on over the dead connection, as the portal would;
- ``sigkill``: it SIGKILLs the gunicorn worker process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from config.wsgi import application  # isort: skip  (sets Django up first)

from django.db import DatabaseError, connection

from portal import api

__all__ = ["application"]


def _fault(point: str) -> None:
    arm_file = Path(os.environ["PORTAL_FAULT_ARM_FILE"])
    try:
        armed = json.loads(arm_file.read_text())
    except (FileNotFoundError, ValueError):
        return
    if armed["point"] != point:
        return
    try:
        arm_file.rename(arm_file.with_suffix(".fired"))
    except FileNotFoundError:
        return  # another request fired it
    lock = int(os.environ["PORTAL_FAULT_LOCK"])
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [lock])
            cursor.execute("SELECT pg_advisory_unlock(%s)", [lock])
    except DatabaseError:
        if armed["action"] != "terminate":
            raise
        return  # the session is gone; what the portal does next is under test
    if armed["action"] == "raise":
        raise RuntimeError(f"fault point {point}")


api.fault_hook = _fault
