"""The action gateway: decide, call at most once per key, prove, or hand to a person.

One module per step (docs/gateway.md has the whole flow):

- ``execute``: the entry points (``operation_execute``, ``operation_run_queued``);
  the ordered checks run as a loop, then the call;
- ``checks``: the checks of docs/gateway.md, one function each, in order (``CHECKS``);
- ``call``: the credential, the last-moment checks, the call with no transaction
  open, under the operation's own idempotency key;
- ``results``: what an execution comes to, and the record of the call's answer;
- ``recovery``: an answer in doubt is settled by looking the receipt up by key,
  never by a new key (``operation_recover``);
- ``common``: the lock order, the database clock, the evidence of a plan.

Any refusal hands the task to a person through ``tasks.escalation.escalate``; what the
person then does is ``tasks.takeover``.
"""

from __future__ import annotations

from .checks import FieldValue
from .execute import operation_execute, operation_run_queued
from .recovery import operation_recover, unscoped_operations_due
from .results import GatewayResult, Outcome

__all__ = [
    "FieldValue",
    "GatewayResult",
    "Outcome",
    "operation_execute",
    "operation_recover",
    "operation_run_queued",
    "unscoped_operations_due",
]
