"""Stable reason codes: in events, API errors and the takeover queue.

Append only; never rename or reuse a code. A migration copies the list into the
PostgreSQL domain ``portal_reason_code`` (``portal/domains.py``; docs/style.md R7),
the type of every ``reason_code`` column; ``tests/db/test_constraints.py``
(``test_database_enums_equal_the_python_enums``) checks the copy.
"""

from __future__ import annotations

from django.db import models

# The domain that holds the list, and its CHECK's name.
REASON_CODE_DOMAIN = "portal_reason_code"
REASON_CODE_CHECK = "portal_reason_code_check"


class ReasonCode(models.TextChoices):
    FIELD_MISSING = "FIELD_MISSING"
    FIELD_SOURCE_MISMATCH = "FIELD_SOURCE_MISMATCH"
    FIELD_STALE = "FIELD_STALE"
    CONTRACT_RETIRED = "CONTRACT_RETIRED"
    VERSION_CONFLICT = "VERSION_CONFLICT"
    TARGET_FORBIDDEN = "TARGET_FORBIDDEN"
    PERMISSION_REVOKED = "PERMISSION_REVOKED"
    CREDENTIAL_EXPIRED = "CREDENTIAL_EXPIRED"
    RESULT_UNKNOWN = "RESULT_UNKNOWN"
    MULTIPLE_RECEIPTS = "MULTIPLE_RECEIPTS"
    LEASE_EXPIRED = "LEASE_EXPIRED"
    IDEMPOTENCY_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"
    STALE_STATE = "STALE_STATE"
    # The connector supports neither idempotency keys nor lookup: a person approves
    # the exact input once before any automatic write.
    APPROVAL_REQUIRED = "APPROVAL_REQUIRED"
    # A tenant's Cedar policy set (policies/, docs/policies.md): no policy permits
    # the call or a ``forbid`` matched; or the set could not be read or evaluated,
    # which refuses too (fail closed). An ``@approval`` annotation asks for a
    # person with APPROVAL_REQUIRED above.
    POLICY_DENIED = "POLICY_DENIED"
    POLICY_ERROR = "POLICY_ERROR"
    # The kill switch and the per-agent limits (limits/, docs/limits.md): a frozen
    # agent or tenant is refused everything; a limit's window or a budget is spent.
    AGENT_FROZEN = "AGENT_FROZEN"
    TENANT_FROZEN = "TENANT_FROZEN"
    RATE_LIMITED = "RATE_LIMITED"
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"
