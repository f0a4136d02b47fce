"""Reason codes checked by the domain ``portal_reason_code`` (portal/domains.py),
not by a CHECK on each table, which every write parsed again."""
from __future__ import annotations

from django.db import migrations

import portal.domains


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0014_reason_code_domain"),
        ("tasks", "0022_operation_no_single_column_indexes"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="escalation",
            name="tasks_escalation_reason_code_check",
        ),
        migrations.RemoveConstraint(
            model_name="operation",
            name="tasks_operation_reason_code_check",
        ),
        migrations.RemoveConstraint(
            model_name="task",
            name="tasks_task_reason_code_check",
        ),
        migrations.AlterField(
            model_name="escalation",
            name="reason_code",
            field=portal.domains.DomainCharField(
                choices=[
                    ("FIELD_MISSING", "Field Missing"),
                    ("FIELD_SOURCE_MISMATCH", "Field Source Mismatch"),
                    ("FIELD_STALE", "Field Stale"),
                    ("CONTRACT_RETIRED", "Contract Retired"),
                    ("VERSION_CONFLICT", "Version Conflict"),
                    ("TARGET_FORBIDDEN", "Target Forbidden"),
                    ("PERMISSION_REVOKED", "Permission Revoked"),
                    ("CREDENTIAL_EXPIRED", "Credential Expired"),
                    ("RESULT_UNKNOWN", "Result Unknown"),
                    ("MULTIPLE_RECEIPTS", "Multiple Receipts"),
                    ("LEASE_EXPIRED", "Lease Expired"),
                    ("IDEMPOTENCY_KEY_REUSED", "Idempotency Key Reused"),
                    ("STALE_STATE", "Stale State"),
                    ("APPROVAL_REQUIRED", "Approval Required"),
                    ("POLICY_DENIED", "Policy Denied"),
                    ("POLICY_ERROR", "Policy Error"),
                    ("AGENT_FROZEN", "Agent Frozen"),
                    ("TENANT_FROZEN", "Tenant Frozen"),
                    ("RATE_LIMITED", "Rate Limited"),
                    ("BUDGET_EXCEEDED", "Budget Exceeded"),
                ],
                domain="portal_reason_code",
                max_length=40,
            ),
        ),
        migrations.AlterField(
            model_name="operation",
            name="reason_code",
            field=portal.domains.DomainCharField(
                blank=True,
                choices=[
                    ("FIELD_MISSING", "Field Missing"),
                    ("FIELD_SOURCE_MISMATCH", "Field Source Mismatch"),
                    ("FIELD_STALE", "Field Stale"),
                    ("CONTRACT_RETIRED", "Contract Retired"),
                    ("VERSION_CONFLICT", "Version Conflict"),
                    ("TARGET_FORBIDDEN", "Target Forbidden"),
                    ("PERMISSION_REVOKED", "Permission Revoked"),
                    ("CREDENTIAL_EXPIRED", "Credential Expired"),
                    ("RESULT_UNKNOWN", "Result Unknown"),
                    ("MULTIPLE_RECEIPTS", "Multiple Receipts"),
                    ("LEASE_EXPIRED", "Lease Expired"),
                    ("IDEMPOTENCY_KEY_REUSED", "Idempotency Key Reused"),
                    ("STALE_STATE", "Stale State"),
                    ("APPROVAL_REQUIRED", "Approval Required"),
                    ("POLICY_DENIED", "Policy Denied"),
                    ("POLICY_ERROR", "Policy Error"),
                    ("AGENT_FROZEN", "Agent Frozen"),
                    ("TENANT_FROZEN", "Tenant Frozen"),
                    ("RATE_LIMITED", "Rate Limited"),
                    ("BUDGET_EXCEEDED", "Budget Exceeded"),
                ],
                domain="portal_reason_code",
                max_length=40,
                null=True,
            ),
        ),
        migrations.AlterField(
            model_name="task",
            name="reason_code",
            field=portal.domains.DomainCharField(
                blank=True,
                choices=[
                    ("FIELD_MISSING", "Field Missing"),
                    ("FIELD_SOURCE_MISMATCH", "Field Source Mismatch"),
                    ("FIELD_STALE", "Field Stale"),
                    ("CONTRACT_RETIRED", "Contract Retired"),
                    ("VERSION_CONFLICT", "Version Conflict"),
                    ("TARGET_FORBIDDEN", "Target Forbidden"),
                    ("PERMISSION_REVOKED", "Permission Revoked"),
                    ("CREDENTIAL_EXPIRED", "Credential Expired"),
                    ("RESULT_UNKNOWN", "Result Unknown"),
                    ("MULTIPLE_RECEIPTS", "Multiple Receipts"),
                    ("LEASE_EXPIRED", "Lease Expired"),
                    ("IDEMPOTENCY_KEY_REUSED", "Idempotency Key Reused"),
                    ("STALE_STATE", "Stale State"),
                    ("APPROVAL_REQUIRED", "Approval Required"),
                    ("POLICY_DENIED", "Policy Denied"),
                    ("POLICY_ERROR", "Policy Error"),
                    ("AGENT_FROZEN", "Agent Frozen"),
                    ("TENANT_FROZEN", "Tenant Frozen"),
                    ("RATE_LIMITED", "Rate Limited"),
                    ("BUDGET_EXCEEDED", "Budget Exceeded"),
                ],
                domain="portal_reason_code",
                max_length=40,
                null=True,
            ),
        ),
    ]
