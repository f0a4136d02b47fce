"""The event code tenant.created (console/tenants.py: the operator made a tenant),
added to the audit_event_code domain (portal/domains.py)."""

from __future__ import annotations

import importlib

from django.db import migrations

import portal.domains
from portal.domains import replace_domain_values_sql

# The list as the previous migration froze it.
PREVIOUS: tuple[str, ...] = importlib.import_module(
    "audit.migrations.0028_invitation_event_codes"
).EVENT_CODES
EVENT_CODES = (*PREVIOUS, "tenant.created")


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0030_outbox_key_is_the_event_id"),
    ]

    operations = [
        migrations.AlterField(
            model_name="event",
            name="code",
            field=portal.domains.DomainCharField(
                choices=[
                    ("task.registered", "Task Registered"),
                    ("task.transitioned", "Task Transitioned"),
                    ("task.claimed", "Task Claimed"),
                    ("task.lease_acquired", "Task Lease Acquired"),
                    ("task.lease_released", "Task Lease Released"),
                    ("operation.reserved", "Operation Reserved"),
                    ("operation.executing", "Operation Executing"),
                    ("operation.verified", "Operation Verified"),
                    ("operation.failed", "Operation Failed"),
                    ("operation.unknown", "Operation Unknown"),
                    ("tenant.deleted", "Tenant Deleted"),
                    ("gateway.checked", "Gateway Checked"),
                    ("credential.issued", "Credential Issued"),
                    ("connector.called", "Connector Called"),
                    ("receipt.queried", "Receipt Queried"),
                    ("operation.conflicted", "Operation Conflicted"),
                    ("operation.escalated", "Operation Escalated"),
                    ("operation.approved", "Operation Approved"),
                    ("task.escalated", "Task Escalated"),
                    ("task.human_claimed", "Task Human Claimed"),
                    ("task.human_released", "Task Human Released"),
                    ("task.resolved", "Task Resolved"),
                    ("task.lease_expired", "Task Lease Expired"),
                    ("task.woken", "Task Woken"),
                    ("tenant.changed", "Tenant Changed"),
                    ("agent.created", "Agent Created"),
                    ("agent.changed", "Agent Changed"),
                    ("agent_key.issued", "Agent Key Issued"),
                    ("agent_key.revoked", "Agent Key Revoked"),
                    ("agent_key.refused", "Agent Key Refused"),
                    ("agent_grant.added", "Agent Grant Added"),
                    ("agent_grant.revoked", "Agent Grant Revoked"),
                    ("membership.granted", "Membership Granted"),
                    ("membership.revoked", "Membership Revoked"),
                    ("contract.created", "Contract Created"),
                    ("contract.published", "Contract Published"),
                    ("contract.retired", "Contract Retired"),
                    ("connector.created", "Connector Created"),
                    ("connector.changed", "Connector Changed"),
                    ("audit.exported", "Audit Exported"),
                    ("outbox.retried", "Outbox Retried"),
                    ("outbox.dismissed", "Outbox Dismissed"),
                    ("operation.fields_edited", "Operation Fields Edited"),
                    ("audit.purged", "Audit Purged"),
                    ("audit.payloads_dropped", "Audit Payloads Dropped"),
                    ("policy_set.created", "Policy Set Created"),
                    ("policy_set.changed", "Policy Set Changed"),
                    ("policy_set.published", "Policy Set Published"),
                    ("policy_set.retired", "Policy Set Retired"),
                    ("desk.item_assigned", "Desk Item Assigned"),
                    ("desk.item_reassigned", "Desk Item Reassigned"),
                    ("desk.item_reminded", "Desk Item Reminded"),
                    ("desk.item_escalated", "Desk Item Escalated"),
                    ("approval.requested", "Approval Requested"),
                    ("approval.decided", "Approval Decided"),
                    ("approval.approved", "Approval Approved"),
                    ("approval.rejected", "Approval Rejected"),
                    ("approval.expired", "Approval Expired"),
                    ("approval.consumed", "Approval Consumed"),
                    ("approval.superseded", "Approval Superseded"),
                    ("task.commented", "Task Commented"),
                    ("invitation.sent", "Invitation Sent"),
                    ("invitation.accepted", "Invitation Accepted"),
                    ("tenant.created", "Tenant Created"),
                ],
                domain="audit_event_code",
                max_length=60,
            ),
        ),
        migrations.RunSQL(
            *replace_domain_values_sql(
                "audit_event_code",
                "audit_event_code_check",
                values=EVENT_CODES,
                previous=PREVIOUS,
            )
        ),
    ]
