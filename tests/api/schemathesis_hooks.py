"""Schemathesis hooks for tests/api/test_schema.py (loaded by SCHEMATHESIS_HOOKS).

Three rules of the API are about history, not shape, so no schema can state them:
a key belongs to the first request that used it, and the same key with other
details answers 422 (each description says so): the ``Idempotency-Key`` header, a
task's ``client_task_id`` and an operation's ``idempotency_key``. A generator
reuses short values ("0") across unrelated requests; here every valid key is made
unique per call, as a client that follows the documented rules would send it. An
invalid key (a negative case) is sent as generated, so its 400 is still checked.

The staff endpoints take the session cookie through the schema's ``cookieAuth``
(schemathesis's auth config, so its auth checks can drop it); Django's CSRF check
also wants the ``csrftoken`` cookie echoed in ``X-CSRFToken``, added here to every
call from ``PORTAL_SCHEMATHESIS_CSRF``.
"""

from __future__ import annotations

import itertools
import os
import re
import uuid
from typing import Any

import schemathesis

_VALID_KEY = re.compile(r"[!-~]{1,200}")  # the schema's pattern, leaving room
_BUSINESS_KEYS = ("client_task_id", "idempotency_key")  # body members, ≤ 200 chars
_RUN = uuid.uuid4().hex[:8]
_COUNTER = itertools.count()


# TEMPORARY, remove both filters once issue 10 §3 (branch `nofivexx`) is merged:
# until then TRACE on an API route answers 500 ('Trace' object is not callable) and
# `Allow` advertises it, defects that branch fixes in portal/api.py. Only TRACE is
# spared; every other method and every other Allow mismatch is still checked.
@schemathesis.hook
def filter_case(context: schemathesis.HookContext, case: schemathesis.Case) -> bool:
    return case.method.upper() != "TRACE"


@schemathesis.hook
def filter_failure(
    context: schemathesis.HookContext,
    failure: Any,
    case: schemathesis.Case,
    response: schemathesis.Response,
) -> bool:
    return not (
        getattr(failure, "code", "") == "ST205"
        and failure.undocumented_methods == ["TRACE"]
        and not failure.missing_methods
    )


@schemathesis.hook
def before_call(
    context: schemathesis.HookContext,
    case: schemathesis.Case,
    kwargs: dict[str, Any],
) -> None:
    key = case.headers.get("Idempotency-Key")
    if isinstance(key, str) and _VALID_KEY.fullmatch(key):
        case.headers["Idempotency-Key"] = f"{key}.{_RUN}{next(_COUNTER)}"
    if case.method.upper() == "POST" and isinstance(case.body, dict):
        for member in _BUSINESS_KEYS:
            value = case.body.get(member)
            if isinstance(value, str) and 1 <= len(value) <= 180 and "\0" not in value:
                case.body = {**case.body, member: f"{value}.{_RUN}{next(_COUNTER)}"}
    csrf = os.environ.get("PORTAL_SCHEMATHESIS_CSRF")
    if csrf:
        case.cookies = {**case.cookies, "csrftoken": csrf}
        case.headers["X-CSRFToken"] = csrf
