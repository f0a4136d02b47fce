"""The reason codes as the domain ``portal_reason_code`` (portal/domains.py says why).

The list is this migration's frozen copy of ``ReasonCode``; the tasks and audit
migrations that follow move every ``reason_code`` column onto the domain.
"""

from __future__ import annotations

from django.db import migrations

from portal.domains import create_domain_sql

REASON_CODES = (
    "FIELD_MISSING",
    "FIELD_SOURCE_MISMATCH",
    "FIELD_STALE",
    "CONTRACT_RETIRED",
    "VERSION_CONFLICT",
    "TARGET_FORBIDDEN",
    "PERMISSION_REVOKED",
    "CREDENTIAL_EXPIRED",
    "RESULT_UNKNOWN",
    "MULTIPLE_RECEIPTS",
    "LEASE_EXPIRED",
    "IDEMPOTENCY_KEY_REUSED",
    "STALE_STATE",
    "APPROVAL_REQUIRED",
    "POLICY_DENIED",
    "POLICY_ERROR",
    "AGENT_FROZEN",
    "TENANT_FROZEN",
    "RATE_LIMITED",
    "BUDGET_EXCEEDED",
)


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0013_auth_failure_window"),
    ]

    operations = [
        migrations.RunSQL(
            *create_domain_sql(
                "portal_reason_code",
                "portal_reason_code_check",
                "varchar(40)",
                REASON_CODES,
            )
        ),
    ]
