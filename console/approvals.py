"""The desk's approvals page: waiting approvals, what each asks, its age, the time
left, the group and SLA clock (as on the desk), and Approve / Reject (a rejection
needs a reason).

The buttons call the same service as the staff API (``takeover.approval_decide``:
tasks/approvals.py), with the person as the approver; a refusal (not in the group,
the agent's sponsor, decided already, expired) is an admin message naming why, and
changes nothing. Mounted under the Approval admin (console/admin/domain.py).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from portal.db import db_now
from portal.exceptions import PortalError
from routing import selectors as routing_selectors
from routing.models import ItemKind
from tasks import approvals, takeover
from tasks.models import Approval

from .display import redacted_lines
from .takeover_desk.names import human_age


@dataclass(frozen=True, kw_only=True)
class WaitingRow:
    approval: Approval
    asked: list[tuple[str, Any]]
    age: str
    left: str
    approvals: int
    refusal: str | None  # why this person may not decide it (None: they may)
    sla: routing_selectors.SlaClock | None  # the group that has it and its clock


def waiting_rows(*, request: HttpRequest) -> list[WaitingRow]:
    """The person's waiting approvals, oldest first (expired ones recorded first)."""
    for tenant in takeover.takeover_tenants(user=request.user):
        approvals.approvals_expire(tenant=tenant)
    now = db_now()
    waiting = list(approvals.approvals_waiting_for(user=request.user)[:200])
    clocks = routing_selectors.sla_clocks_of_items(
        item_kind=ItemKind.APPROVAL,
        item_ids=[approval.pk for approval in waiting],
        tenant_ids={approval.tenant_id for approval in waiting},
        now=now,
    )
    rows = []
    for approval in waiting:
        left = approval.expires_at - now if approval.expires_at else None
        rows.append(
            WaitingRow(
                approval=approval,
                asked=list(
                    redacted_lines(approval.asked, tenant_id=approval.tenant_id)
                ),
                age=human_age(now - approval.requested_at),
                left=human_age(left) if left is not None else "no limit",
                approvals=getattr(approval, "approvals", 0),
                refusal=approvals.may_decide(approval=approval, user=request.user),
                sla=clocks.get(approval.pk),
            )
        )
    return rows


def waiting_page(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest
) -> TemplateResponse:
    return TemplateResponse(
        request,
        "admin/console/approvals/waiting.html",
        {
            **model_admin.admin_site.each_context(request),
            "opts": model_admin.opts,
            "title": "Approvals waiting",
            "rows": waiting_rows(request=request),
        },
    )


def decide_view(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, approval_id: uuid.UUID
) -> HttpResponse:
    """POST verdict (approve / reject) and reason; back to the list with a message."""
    verdict = request.POST.get("verdict", "")
    try:
        approval = takeover.approval_decide(
            approval_id=approval_id,
            user=request.user,
            verdict=verdict,
            reason=request.POST.get("reason", ""),
        )
    except PortalError as error:
        messages.error(request, f"Not recorded: {error.detail}")
    else:
        messages.success(
            request,
            f"Your {verdict} is recorded; the approval is {approval.state}"
            + (
                f" ({approval.decisions.filter(verdict='approve').count()} of "
                f"{approval.quorum})."
                if approval.state == "waiting"
                else "."
            ),
        )
    return HttpResponseRedirect(reverse("admin:tasks_approval_waiting"))
