"""Tasks, operations, contracts, connectors and the rest of the governed domain."""

from __future__ import annotations

import json
import uuid
from functools import partial
from typing import Any, Final

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.views.decorators.http import require_POST

from portal import exceptions as portal_exceptions
from portal import replica
from portal.actors import Actor
from portal.exceptions import PortalError
from portal.models import TenantPerm
from tasks import credentials as task_credentials
from tasks import evidence as task_evidence
from tasks import outbound
from tasks import services as task_services
from tasks.contracts import contract_spec_validate
from tasks.exceptions import ContractInvalid
from tasks.models import (
    Approval,
    Connector,
    Contract,
    Credential,
    Escalation,
    ObjectVersion,
    Operation,
    Task,
)

from .. import approvals as approvals_page
from .. import display, search, story
from ..paginator import CappedPaginator
from .base import TenantScopedAdmin, tenant_ids


@admin.register(Task)
class TaskAdmin(TenantScopedAdmin):
    """Tasks, read-only; a task's page tells its whole story (console/story.py)."""

    change_form_template = "admin/console/task_change_form.html"
    tenant_column_if_several = True
    list_display = [
        "task_id",
        "tenant",
        "state",
        "reason_code",
        "object",
        "lease_owner",
        "updated",
        "trace",
    ]
    list_display_links = ["task_id"]
    # The page's own fields; times to the millisecond, the lease in the story below.
    fields = [
        "tenant",
        "client_task_id",
        "workflow",
        "contract",
        "object",
        "state",
        "state_version",
        "current_step",
        "reason_code",
        "wake",
        "trace_full",
        "span_id",
        "created",
        "updated",
    ]
    readonly_fields = [
        "workflow",
        "contract",
        "wake",
        "trace_full",
        "created",
        "updated",
    ]
    list_filter = ["state", "reason_code", "tenant"]
    search_fields = ["trace_id"]  # shows the box; get_search_results does the work
    search_help_text = "Exact: a trace id, an object id, a client task id or a task id."
    list_select_related = ["tenant"]
    ordering = ["-id"]  # time-ordered ids; served by UNIQUE (tenant_id, id)
    sortable_by = ()
    paginator = CappedPaginator
    list_per_page = 100
    actions = ["export_evidence"]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Task], search_term: str
    ) -> tuple[QuerySet[Task], bool]:
        return search.task_search(queryset, term=search_term), False

    @replica.reviewer_reads
    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        task = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if task is not None and self.has_view_permission(request, task):
            context.update(story.story_context(story.task_story(task=task)))
            if task.tenant_id in tenant_ids(request, TenantPerm.EXPORT_TRAIL):
                context["evidence_url"] = reverse(
                    "admin:tasks_task_evidence", args=[task.pk]
                )
        return super().change_view(request, object_id, form_url, context)

    # --- evidence bundle (tasks/evidence.py) -------------------------------------

    def get_urls(self) -> list[URLPattern]:
        evidence_url = path(
            "<path:object_id>/evidence/",
            self.admin_site.admin_view(self.evidence_view),
            name="tasks_task_evidence",
        )
        return [evidence_url, *super().get_urls()]

    def has_export_permission(self, request: HttpRequest) -> bool:
        return bool(tenant_ids(request, TenantPerm.EXPORT_TRAIL))

    def _evidence_download(self, request: HttpRequest, task: Task) -> HttpResponse:
        """The bundle as a file; the person's right to export was checked."""
        try:
            bundle = task_evidence.task_evidence_bundle(
                task=task, by=Actor.of_user(request.user)
            )
        except PortalError as error:  # e.g. no signing key configured
            self.message_user(request, error.detail, messages.ERROR)
            return HttpResponseRedirect(
                reverse("admin:tasks_task_change", args=[task.pk])
            )
        response = HttpResponse(
            task_evidence.evidence_json(bundle), content_type="application/json"
        )
        filename = task_evidence.evidence_filename(task)
        response["Content-Disposition"] = f'attachment; filename="{filename}"'
        response["Cache-Control"] = "no-store"
        return response

    def evidence_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: the task's evidence bundle, for people with ``export_trail`` there.

        A task outside the person's tenants is 404, as everywhere in the admin; a
        tenant they read without the export permission is 403.
        """
        if request.method != "GET":
            return HttpResponse(status=405, headers={"Allow": "GET"})
        try:
            task_id = uuid.UUID(object_id)
        except ValueError:
            raise Http404("No such task.") from None
        try:
            task = task_evidence.task_get_for_exporter(
                user=request.user, task_id=task_id
            )
        except portal_exceptions.PermissionDenied:
            raise PermissionDenied from None
        except PortalError:
            raise Http404("No such task.") from None
        return self._evidence_download(request, task)

    @admin.action(
        description="Export the evidence bundle of the selected task",
        permissions=["export"],
    )
    def export_evidence(
        self, request: HttpRequest, queryset: QuerySet[Task]
    ) -> HttpResponse | None:
        allowed = queryset.filter(
            tenant_id__in=tenant_ids(request, TenantPerm.EXPORT_TRAIL)
        )
        tasks = list(allowed.select_related("tenant")[:2])
        if len(tasks) != 1 or queryset.count() != 1:
            self.message_user(
                request,
                "Select exactly one task of a tenant where your role may export: "
                "a bundle holds one task's chain.",
                messages.WARNING,
            )
            return None
        return self._evidence_download(request, tasks[0])

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Task | None:
        # change_view asks twice (the story, then the form): read the row once.
        cache = request.__dict__.setdefault("_console_objects", {})
        if object_id not in cache:
            cache[object_id] = super().get_object(request, object_id, from_field)
        return cache[object_id]

    @admin.display(description="task (client id)")
    def task_id(self, task: Task) -> SafeString:
        # One column, as the event list shows a task: two links to the same page
        # took the width the trace needed at 1,400 px.
        return format_html(
            '<code title="{}">{}</code><br>{}',
            task.pk,
            display.short_id(task.pk),
            task.client_task_id,
        )

    @admin.display(description="object")
    def object(self, task: Task) -> SafeString:
        # A line may break after the type (<wbr>): the list keeps its width.
        return format_html(
            "{}/<wbr>{} @ {}", task.object_type, task.object_id, task.object_version
        )

    @admin.display(description="updated (ms)")
    def updated(self, task: Task) -> SafeString:
        # May break between date and time (not within the date: UAX #14 LB25); on
        # one line it pushed the trace out of the list's box at 1,400 px.
        return format_html("<code>{}</code>", display.when(task.updated_at))

    @admin.display(description="trace")
    def trace(self, task: Task) -> SafeString | str:
        return display.trace_link(task.trace_id)

    @admin.display(description="trace id")
    def trace_full(self, task: Task) -> SafeString | str:
        return display.trace_link(task.trace_id, short=False)

    @admin.display(description="workflow")
    def workflow(self, task: Task) -> str:
        return f"{task.workflow_key} v{task.workflow_version}"

    @admin.display(description="contract")
    def contract(self, task: Task) -> str:
        if not task.contract_key:
            return display.EMPTY
        return f"{task.contract_key} v{task.contract_version}"

    @admin.display(description="wake at (ms)")
    def wake(self, task: Task) -> str:
        return display.when(task.wake_at)

    @admin.display(description="created (ms)")
    def created(self, task: Task) -> str:
        return display.when(task.created_at)


@admin.register(Operation)
class OperationAdmin(TenantScopedAdmin):
    """Operations, read-only; their input is shown through the event redaction."""

    list_display = [
        "operation_id",
        "idempotency_key",
        "tenant",
        "task_link",
        "action",
        "target",
        "state",
        "attempts",
        "provider_reference",
        "updated",
    ]
    tenant_column_if_several = True
    list_display_links = ["operation_id", "idempotency_key"]
    list_filter = ["state", "reason_code", "tenant"]
    search_fields = ["idempotency_key"]  # get_search_results does the work
    search_help_text = (
        "Exact: an idempotency key, an operation id or a task id; "
        "value:<e-mail, card number or declared field value> finds redacted values."
    )
    list_select_related = ["tenant"]
    ordering = ["-id"]  # served by UNIQUE (tenant_id, id)
    sortable_by = ()
    paginator = CappedPaginator
    list_per_page = 100
    exclude = ["input", "call_fields", "field_provenance", "result", "sealed"]
    readonly_fields = [
        "task_link",
        "input_redacted",
        "call_fields_redacted",
        "result_redacted",
    ]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Operation], search_term: str
    ) -> tuple[QuerySet[Operation], bool]:
        found = search.operation_search(
            queryset, term=search_term, tenant_ids=tenant_ids(request, self.view_perm)
        )
        return found, False

    @admin.display(description="operation")
    def operation_id(self, operation: Operation) -> SafeString:
        return format_html(
            '<code title="{}">{}</code>', operation.pk, display.short_id(operation.pk)
        )

    # Not named "task": a list column named like a model field shows the field, so
    # "task" loaded each row's task, one query (and its own transaction) per row:
    # 100 of the page's 114 statements on the scale data set
    # (tests/console/test_registry.py).
    @admin.display(description="task")
    def task_link(self, operation: Operation) -> SafeString | str:
        return display.model_link("tasks.task", operation.task_id)

    @admin.display(description="updated (ms)")
    def updated(self, operation: Operation) -> SafeString:
        return format_html(
            '<code class="nowrap">{}</code>', display.when(operation.updated_at)
        )

    @staticmethod
    def _redacted(value: Any, operation: Operation) -> SafeString:
        lines = display.redacted_lines(value, tenant_id=operation.tenant_id)
        return format_html(
            '<dl class="payload">{}</dl>',
            format_html_join("", "<dt>{}</dt><dd>{}</dd>", lines),
        )

    @admin.display(description="input (redacted)")
    def input_redacted(self, operation: Operation) -> SafeString:
        return self._redacted(operation.input, operation)

    @admin.display(description="call fields (redacted)")
    def call_fields_redacted(self, operation: Operation) -> SafeString:
        return self._redacted(operation.call_fields, operation)

    @admin.display(description="result (redacted)")
    def result_redacted(self, operation: Operation) -> SafeString:
        return self._redacted(operation.result, operation)


# The contract form's example: the README demo's customer-issue contract.
SPEC_EXAMPLE: Final[dict[str, Any]] = {
    "object_type": "customer_issue",
    "required_fields": [
        {"name": "email", "source": "crm", "max_age_s": 300},
        {"name": "plan", "source": "billing", "max_age_s": 3600},
    ],
    "policy": {
        "read_fields": ["email"],
        "write_targets": ["ticket-desk"],
        "credential_ttl_s": 60,
    },
    "receipt": {"required": True, "type": "ticket_id"},
    "sensitive_fields": {"email": "personal"},
}
SPEC_HELP: Final = format_html(
    "The contract as JSON. <b>required_fields</b>: what the agent must read, each "
    "with the system it comes from (<code>source</code>) and how old it may be "
    "(<code>max_age_s</code>); <b>policy</b>: the fields the call may carry "
    "(<code>read_fields</code>), the connectors it may write to "
    "(<code>write_targets</code>) and the credential's lifetime "
    "(<code>credential_ttl_s</code>, 1 to 3600 s); <b>receipt</b>: whether the target "
    "must answer with a receipt id, and its kind. Optional: "
    "<code>sensitive_fields</code> (name → personal | secret: stored as a keyed "
    "hash), <code>amount_fields</code>, <code>risk_class</code> (low, medium, high, "
    "critical). A problem is named by its JSON path (e.g. "
    "<code>/policy/credential_ttl_s</code>). docs/gateway.md has the rest. "
    'Example:<pre id="spec-example">{}</pre>',
    json.dumps(SPEC_EXAMPLE, indent=2),
)


class SpecField(forms.JSONField):
    """The admin's JSON field, saying where the JSON breaks, not only that it does."""

    def to_python(self, value: Any) -> Any:
        if isinstance(value, str) and value.strip():
            try:
                json.loads(value)
            except json.JSONDecodeError as error:
                raise forms.ValidationError(
                    f"not JSON: {error.msg} at line {error.lineno}, column "
                    f"{error.colno}",
                    code="invalid",
                ) from None
        return super().to_python(value)


class ContractVersionForm(forms.ModelForm):
    """A new version: key, tenant and spec; the service numbers and validates it."""

    publish = forms.BooleanField(required=False, help_text="Publish at once.")
    spec = SpecField(
        help_text=SPEC_HELP,
        widget=forms.Textarea(
            attrs={
                "rows": 18,
                "cols": 80,
                "class": "vLargeTextField mono",
                "placeholder": json.dumps(SPEC_EXAMPLE, indent=2),
            }
        ),
    )

    class Meta:
        model = Contract
        fields = ["tenant", "key", "spec"]

    def clean_spec(self) -> Any:
        spec = self.cleaned_data["spec"]
        try:
            contract_spec_validate(spec)
        except ContractInvalid as error:
            raise forms.ValidationError(
                [f"{p['path']}: {p['message']}" for p in error.context["problems"]]
            ) from error
        return spec


@admin.register(Contract)
class ContractAdmin(TenantScopedAdmin):
    """Versions are added through the validating service and never edited after."""

    manage_perm = TenantPerm.MANAGE_TENANT
    allow_add = True
    list_display = ["key", "version", "tenant", "status", "published_at", "retired_at"]
    list_filter = ["status", "tenant"]
    search_fields = ["key"]
    list_select_related = ["tenant"]
    actions = ["publish_versions", "retire_versions"]
    form = ContractVersionForm

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:  # adding: the form's fields, "publish" included
            return ["tenant", "key", "spec", "publish"]
        return ["tenant", "key", "version", "status", "spec", "published_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return []
        return ["tenant", "key", "version", "status", "spec", "published_at"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a version's content is fixed once it exists; add a new one

    def save_model(
        self, request: HttpRequest, obj: Any, form: Any, change: bool
    ) -> None:
        created = task_services.contract_create(  # numbers the version, validates
            tenant=form.cleaned_data["tenant"],
            key=form.cleaned_data["key"],
            spec=form.cleaned_data["spec"],
            publish=form.cleaned_data["publish"],
            by=request.user,
        )
        self.adopt(obj, created)

    def row_name(self, row: Model) -> str:
        # Without the status, read before the change ("(draft): published").
        return f"{row.key} v{row.version}"  # type: ignore[attr-defined]

    @admin.action(description="Publish selected draft versions", permissions=["manage"])
    def publish_versions(
        self, request: HttpRequest, queryset: QuerySet[Contract]
    ) -> None:
        self.run_service(
            request,
            queryset.select_related("tenant"),
            lambda contract: task_services.contract_publish(
                tenant=contract.tenant,
                key=contract.key,
                version=contract.version,
                by=request.user,
            ),
            "published",
        )

    @admin.action(
        description="Retire selected published versions", permissions=["manage"]
    )
    def retire_versions(
        self, request: HttpRequest, queryset: QuerySet[Contract]
    ) -> None:
        self.run_service(
            request,
            queryset.select_related("tenant"),
            lambda contract: task_services.contract_retire(
                tenant=contract.tenant,
                key=contract.key,
                version=contract.version,
                by=request.user,
            ),
            "retired",
        )


@admin.register(Credential)
class CredentialAdmin(TenantScopedAdmin):
    list_display = [
        "action",
        "target",
        "tenant",
        "issued_at",
        "expires_at",
        "revoked_at",
    ]
    list_select_related = ["tenant"]
    # Django's paginator counts the whole selection: 244-289 ms of this list for the
    # largest tenant's 400,000 credentials of the 10M-event data set.
    paginator = CappedPaginator
    exclude = ["secret_hash"]


@admin.register(ObjectVersion)
class ObjectVersionAdmin(TenantScopedAdmin):
    list_display = ["object_type", "object_id", "version", "tenant", "updated_at"]
    search_fields = ["object_id"]
    list_select_related = ["tenant"]


class ConnectorForm(forms.ModelForm):
    """The signing key is the portal's to make: nobody types one in or reads the
    private half back."""

    rotate_key = forms.BooleanField(
        required=False,
        label="Rotate signing key",
        help_text="Make a new Ed25519 key pair. The target refuses the gateway's "
        "credentials until it is given the new public key, shown here after "
        "saving.",
    )

    # A base URL typed without a scheme means https (Django 6's default).
    base_url = forms.URLField(max_length=500, assume_scheme="https")

    class Meta:
        model = Connector
        fields = ["tenant", "target", *task_services.CONNECTOR_SETTINGS]

    def clean(self) -> dict[str, Any] | None:
        """The outbound URL policy's refusals, each under its field (the service
        checks again, and so does every call)."""
        cleaned = super().clean() or {}
        given = {
            name: cleaned[name]
            for name in task_services.URL_SETTINGS
            if cleaned.get(name) is not None
        }
        for name, problem in outbound.connector_url_problems(given):
            self.add_error(name, problem)
        return cleaned


@admin.register(Connector)
class ConnectorAdmin(TenantScopedAdmin):
    """Targets the gateway may call. The portal makes each connector's Ed25519 key
    pair: the public key is shown, to install on the target; the private key is
    sealed and never shown (docs/gateway.md, "What a governed target must
    verify")."""

    view_perm = TenantPerm.MANAGE_TENANT
    manage_perm = TenantPerm.MANAGE_TENANT
    allow_add = True
    form = ConnectorForm
    list_display = [
        "target",
        "tenant",
        "connector_base_url",
        "supports_idempotency_keys",
        "supports_lookup",
        "max_attempts",
    ]
    list_filter = ["tenant"]
    list_select_related = ["tenant"]

    @admin.display(description="base URL", ordering="base_url")
    def connector_base_url(self, obj: Connector) -> str:
        # Text, not the admin's link for a URL field: the base is where the gateway
        # appends its paths, and its root is often a 404 (the ticket desk's is).
        return obj.base_url

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = ["tenant", "target", *task_services.CONNECTOR_SETTINGS]
        if obj is None:
            return fields
        return [*fields, "rotate_key", "key_id", "public_key_pem", "public_jwk"]

    @admin.display(description="Public key (PEM)")
    def public_key_pem(self, obj: Connector) -> str:
        return task_credentials.public_pem(obj.public_key)

    @admin.display(description="Public key (JWK, for the target's JWKS)")
    def public_jwk(self, obj: Connector) -> str:
        return json.dumps(task_credentials.public_jwk(obj.public_key))

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return []
        return ["tenant", "target", "key_id", "public_key_pem", "public_jwk"]

    def save_model(
        self, request: HttpRequest, obj: Connector, form: Any, change: bool
    ) -> None:
        saved = task_services.connector_save(
            tenant=obj.tenant if change else form.cleaned_data["tenant"],
            target=obj.target if change else form.cleaned_data["target"],
            values={
                name: form.cleaned_data[name]
                for name in task_services.CONNECTOR_SETTINGS
            },
            rotate_key=change and bool(form.cleaned_data.get("rotate_key")),
            by=request.user,
        )
        self.adopt(obj, saved)


@admin.register(Escalation)
class EscalationAdmin(TenantScopedAdmin):
    list_display = [
        "created_at",
        "reason_code",
        "tenant",
        "task",
        "responsible_owner",
        "resolution",
        "resolved_at",
    ]
    list_filter = ["reason_code", "resolution", "tenant"]
    list_select_related = ["tenant", "task"]


@admin.register(Approval)
class ApprovalAdmin(TenantScopedAdmin):
    list_display = [
        "operation",
        "tenant",
        "state",
        "quorum",
        "requested_at",
        "expires_at",
        "approved_by",
        "used_at",
    ]
    list_filter = ["state"]
    list_select_related = ["tenant", "operation", "approved_by"]

    def get_urls(self) -> list[URLPattern]:
        """The approvals page (waiting, with Approve / Reject): console/approvals.py."""
        wrap = self.admin_site.admin_view
        return [
            path(
                "waiting/",
                wrap(partial(approvals_page.waiting_page, self)),
                name="tasks_approval_waiting",
            ),
            path(
                "<uuid:approval_id>/decide/",
                wrap(require_POST(partial(approvals_page.decide_view, self))),
                name="tasks_approval_decide",
            ),
            *super().get_urls(),
        ]
