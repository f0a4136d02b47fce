"""Tenant policy sets in the admin: the editor, its problems, the what-if, publish.

Tenant admins add and edit drafts, publish and retire (``manage_tenant``);
reviewers read (``export_trail``); support sees nothing. Every change goes through
``policies.services`` (one event naming the person). A draft's page lists what
would stop it being published, with line numbers, and what it would have changed
over the tenant's last N days of operations (docs/policies.md).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Final

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from policies import engine as policy_engine
from policies import selectors as policy_selectors
from policies import services as policy_services
from policies.models import PolicySet, PolicySetState
from policies.validation import Problem, policy_problems
from policies.whatif import WhatIf, what_if
from portal.models import Tenant, TenantPerm
from tasks.contracts import contract_amount_fields, contract_risk_class
from tasks.models import Contract, ContractStatus, Operation

from .base import TenantScopedAdmin

WHATIF_DAYS: Final = 7
WHATIF_MAX_DAYS: Final = 90
# The newest operations the what-if reads: bounds one page's work.
WHATIF_LIMIT: Final = 5000


def published_contract_specs(*, tenant: Tenant) -> list[dict[str, Any]]:
    """The specs of the tenant's published contracts (the schema's fields)."""
    return list(
        Contract.objects.filter(
            tenant=tenant, status=ContractStatus.PUBLISHED
        ).values_list("spec", flat=True)
    )


def draft_problems(*, policy_set: PolicySet) -> list[Problem]:
    """What would stop ``policy_set`` being published now."""
    schema = policy_services.tenant_policy_schema(
        tenant=policy_set.tenant,
        contract_specs=published_contract_specs(tenant=policy_set.tenant),
    )
    return policy_problems(text=policy_set.text, schema=schema)


def policy_what_if(
    *, policy_set: PolicySet, days: int = WHATIF_DAYS, now: dt.datetime | None = None
) -> WhatIf:
    """``policy_set`` against the set in force over the tenant's operations of the
    last ``days`` (their stored, redacted input and call fields; newest
    ``WHATIF_LIMIT``). Reads the database only; never calls a remote."""
    tenant = policy_set.tenant
    since = (now or timezone.now()) - dt.timedelta(days=days)
    operations = list(
        Operation.objects.filter(tenant=tenant, created_at__gte=since)
        .select_related("task")
        .order_by("-created_at")[:WHATIF_LIMIT]
    )
    agents = policy_engine.agent_facts(
        tenant=tenant,
        agent_ids={
            str(op.executed_by_agent_id or op.agent_id or "") for op in operations
        },
    )
    specs = {
        (key, version): spec
        for key, version, spec in Contract.objects.filter(tenant=tenant).values_list(
            "key", "version", "spec"
        )
    }
    requests = []
    for operation in operations:
        agent = str(operation.executed_by_agent_id or operation.agent_id or "")
        task = operation.task
        spec = specs.get((task.contract_key or "", task.contract_version or 0))
        requests.append(
            (
                str(operation.pk),
                policy_engine.request_for(
                    tenant=tenant,
                    agent_id=agent,
                    agent=agents.get(agent, policy_engine.AgentFacts()),
                    action=operation.action,
                    target=operation.target,
                    object_type=task.object_type,
                    object_id=task.object_id,
                    object_version=task.object_version,
                    arguments=operation.input,
                    fields=operation.call_fields or {},
                    contract_key=task.contract_key,
                    contract_version=task.contract_version,
                    amount_fields=contract_amount_fields(spec),
                    risk_class=contract_risk_class(spec),
                    phase="execute",
                    at=operation.created_at,
                ),
            )
        )
    in_force = policy_selectors.policy_set_in_force(tenant=tenant)
    return what_if(
        draft_text=policy_set.text,
        in_force_text=in_force.text if in_force is not None else None,
        requests=requests,
    )


class PolicySetForm(forms.ModelForm):
    """The editor: Cedar text and a note; the service numbers the version."""

    class Meta:
        model = PolicySet
        fields = ["tenant", "text", "note"]
        widgets = {
            "text": forms.Textarea(
                attrs={"rows": 24, "cols": 100, "class": "policy-editor"}
            )
        }


@admin.register(PolicySet)
class PolicySetAdmin(TenantScopedAdmin):
    """Drafts are edited here; published versions never change (a trigger)."""

    view_perm = TenantPerm.EXPORT_TRAIL  # reviewers and admins; not support
    manage_perm = TenantPerm.MANAGE_TENANT
    allow_add = True
    form = PolicySetForm
    list_display = ["version", "tenant", "state", "note", "created_at", "published_at"]
    list_filter = ["state", "tenant"]
    list_select_related = ["tenant"]
    actions = ["publish_versions", "retire_versions"]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ["tenant", "text", "note"]
        return ["tenant", "version", "state", "text", "note", "published_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return []
        if obj.state == PolicySetState.DRAFT and self.has_manage_permission(
            request, obj
        ):
            return ["tenant", "version", "state", "published_at"]
        return ["tenant", "version", "state", "text", "note", "published_at"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.state != PolicySetState.DRAFT:
            return False  # published and retired versions are fixed
        return super().has_change_permission(request, obj)

    def save_model(
        self, request: HttpRequest, obj: Any, form: Any, change: bool
    ) -> None:
        if change:
            saved = policy_services.policy_set_edit(
                tenant=obj.tenant,
                version=obj.version,
                text=form.cleaned_data["text"],
                note=form.cleaned_data["note"],
                by=request.user,
            )
        else:
            saved = policy_services.policy_set_draft(
                tenant=form.cleaned_data["tenant"],
                text=form.cleaned_data["text"],
                note=form.cleaned_data["note"],
                by=request.user,
            )
        self.adopt(obj, saved)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """A draft's page adds its problems and its what-if (``?days=N``)."""
        context = dict(extra_context or {})
        policy_set = self.get_queryset(request).filter(pk=object_id).first()
        if policy_set is not None and policy_set.state == PolicySetState.DRAFT:
            try:
                days = int(request.GET.get("days", WHATIF_DAYS))
            except ValueError:
                days = WHATIF_DAYS
            days = max(1, min(days, WHATIF_MAX_DAYS))
            context["policy_problems"] = draft_problems(policy_set=policy_set)
            context["what_if"] = policy_what_if(policy_set=policy_set, days=days)
            context["what_if_days"] = days
        return super().change_view(request, object_id, form_url, context)

    @admin.action(description="Publish selected drafts", permissions=["manage"])
    def publish_versions(
        self, request: HttpRequest, queryset: QuerySet[PolicySet]
    ) -> None:
        self.run_service(
            request,
            queryset.select_related("tenant"),
            lambda policy_set: policy_services.policy_set_publish(
                tenant=policy_set.tenant,
                version=policy_set.version,
                contract_specs=published_contract_specs(tenant=policy_set.tenant),
                by=request.user,
            ),
            "published",
        )

    @admin.action(
        description="Retire the selected version in force", permissions=["manage"]
    )
    def retire_versions(
        self, request: HttpRequest, queryset: QuerySet[PolicySet]
    ) -> None:
        self.run_service(
            request,
            queryset.select_related("tenant"),
            lambda policy_set: policy_services.policy_set_retire(
                tenant=policy_set.tenant, version=policy_set.version, by=request.user
            ),
            "retired",
        )
