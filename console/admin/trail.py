"""The audit trail: events (append-only) and the outbox that carries them out."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    StreamingHttpResponse,
)
from django.http.response import HttpResponseBase
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from audit import outbox_admin
from audit.models import Event, Outbox, RetentionPolicy
from portal import replica
from portal.actor_names import ActorNames
from portal.exceptions import PortalError
from portal.models import Tenant, TenantPerm
from tasks.models import Task

from .. import dashboard, display, export, saved_searches, search, services
from ..filters import ActorFilter, CodeChoicesFilter, CreatedRangeFilter, TaskIdFilter
from ..paginator import CappedPaginator
from .base import TenantListFilter, TenantScopedAdmin, tenant_ids


class EventChangeList(ChangeList):
    """Names the actors of the page shown: two queries for the page, not per row."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        names = ActorNames(
            [(event.actor_type, event.actor_id) for event in self.result_list],
            tenant_ids={event.tenant_id for event in self.result_list},
        )
        # The client's own id of each task on the page, shown beside the short id
        # (one query for the page: the task's primary key).
        client_ids = dict(
            Task.objects.filter(
                tenant_id__in={event.tenant_id for event in self.result_list},
                pk__in={event.task_id for event in self.result_list if event.task_id},
            ).values_list("pk", "client_task_id")
        )
        for event in self.result_list:
            event.actor_html = names.actor_html(event.actor_type, event.actor_id)
            event.client_task_id = client_ids.get(event.task_id, "")


class EventExportChangeList(EventChangeList):
    """The changelist's selection only: no page of results, no count."""

    def get_results(self, request: HttpRequest) -> None:
        self.result_list = []
        self.result_count = self.full_result_count = 0
        self.can_show_all = self.multi_page = False


@admin.register(Event)
class EventAdmin(TenantScopedAdmin):
    """The event browser: filter, search by exact id, read, export (reviewers)."""

    change_list_template = "admin/console/event_change_list.html"
    tenant_column_if_several = True
    list_display = [
        "when",
        "event_code",
        "tenant",
        "actor",
        "reason",
        "task",
        "operation",
        "trace",
        "event_id",
    ]
    list_display_links = None
    list_filter = [
        TenantListFilter,
        TaskIdFilter,
        ("code", CodeChoicesFilter),
        ActorFilter,
        ("actor_type", CodeChoicesFilter),
        ("reason_code", CodeChoicesFilter),
        CreatedRangeFilter,
    ]
    search_fields = ["trace_id"]  # shows the box; get_search_results does the work
    search_help_text = (
        "Exact: a trace id (also finds the events of tasks on that trace), an object "
        "id, a client task id, an idempotency key, or a task / operation / event id."
    )
    list_select_related = ["tenant"]
    ordering = ["-created_at", "-id"]  # audit_event_created_idx
    sortable_by = ()
    paginator = CappedPaginator
    list_per_page = 100
    fields = (
        "id",
        "created",
        "tenant",
        "event_code",
        "actor",
        "reason",
        "contract",
        "task",
        "operation",
        "trace_full",
        "span_id",
        "payload_readable",
    )
    readonly_fields = fields

    class Media:
        css = {"all": ["console/story.css"]}

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        if request.__dict__.get("_console_export"):
            return EventExportChangeList
        return EventChangeList

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Event], search_term: str
    ) -> tuple[QuerySet[Event], bool]:
        found = search.event_search(
            queryset, tenant_ids=tenant_ids(request, self.view_perm), term=search_term
        )
        return found, False

    # --- columns and fields -------------------------------------------------------

    @admin.display(description="time (ms)")
    def when(self, event: Event) -> SafeString:
        return format_html(
            '<code class="nowrap">{}</code>', display.when(event.created_at)
        )

    @admin.display(description="created (ms)")
    def created(self, event: Event) -> str:
        return display.when(event.created_at)

    @admin.display(description="code")
    def event_code(self, event: Event) -> str:
        """The stable code itself (what exports and filters use), not its label."""
        return event.code

    @admin.display(description="reason")
    def reason(self, event: Event) -> str:
        return event.reason_code or display.EMPTY

    @admin.display(description="actor")
    def actor(self, event: Event) -> SafeString:
        shown = getattr(event, "actor_html", None)
        if shown is None:  # the change page: one event
            names = ActorNames(
                [(event.actor_type, event.actor_id)], tenant_ids=[event.tenant_id]
            )
            shown = names.actor_html(event.actor_type, event.actor_id)
        return shown

    @admin.display(description="task (client id)")
    def task(self, event: Event) -> SafeString | str:
        link = display.model_link("tasks.task", event.task_id)
        if not link or event.task_id is None:
            return display.EMPTY
        client = getattr(event, "client_task_id", None)
        if client is None:  # the change page: one event
            client = (
                Task.objects.filter(tenant_id=event.tenant_id, pk=event.task_id)
                .values_list("client_task_id", flat=True)
                .first()
            )
        if not client:
            return link
        return format_html(
            '{} <span class="client-id" title="the client\'s task id">{}</span>',
            link,
            client,
        )

    @admin.display(description="operation")
    def operation(self, event: Event) -> SafeString | str:
        return (
            display.model_link("tasks.operation", event.operation_id) or display.EMPTY
        )

    @admin.display(description="trace")
    def trace(self, event: Event) -> SafeString | str:
        return display.trace_link(event.trace_id)

    @admin.display(description="trace id")
    def trace_full(self, event: Event) -> SafeString | str:
        return display.trace_link(event.trace_id, short=False)

    @admin.display(description="event")
    def event_id(self, event: Event) -> SafeString | str:
        return display.model_link("audit.event", event.pk)

    @admin.display(description="contract")
    def contract(self, event: Event) -> str:
        if not event.contract_key:
            return display.EMPTY
        return f"{event.contract_key} v{event.contract_version}"

    @admin.display(description="payload (redacted when written)")
    def payload_readable(self, event: Event) -> SafeString:
        if event.payload is None:  # docs/retention.md: the digest stays
            return format_html(
                '<p class="payload">Dropped by retention; digest {}</p>',
                event.payload_digest,
            )
        lines = display.payload_lines(event.payload)
        return format_html(
            '<dl class="payload">{}</dl>',
            format_html_join("", "<dt>{}</dt><dd>{}</dd>", lines),
        )

    # --- export --------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        export_url = path(
            "export/<str:fmt>/",
            self.admin_site.admin_view(self.export_view),
            name="audit_event_export",
        )
        wrap = self.admin_site.admin_view
        saved = [
            path("saved/", wrap(self.save_search_view), name="audit_event_save"),
            path(
                "saved/<uuid:search_id>/delete/",
                wrap(self.delete_search_view),
                name="audit_event_saved_delete",
            ),
        ]
        return [export_url, *saved, *super().get_urls()]

    # --- saved searches (the person's own: console/saved_searches.py) -------------

    def _list_url(self, query: str = "") -> str:
        url = reverse("admin:audit_event_changelist")
        return f"{url}?{query}" if query else url

    def save_search_view(self, request: HttpRequest) -> HttpResponse:
        """POST ``name`` and ``query``: saved for the person, then the search."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        query = request.POST.get("query", "")[: saved_searches.MAX_QUERY * 2]
        try:
            search = saved_searches.saved_search_save(
                user=request.user, name=request.POST.get("name", ""), query=query
            )
        except PortalError as error:
            self.message_user(request, error.detail, messages.ERROR)
            return HttpResponseRedirect(
                self._list_url(saved_searches.clean_query(query))
            )
        self.message_user(request, f"Saved as “{search.name}”.")
        return HttpResponseRedirect(self._list_url(search.query))

    def delete_search_view(
        self, request: HttpRequest, search_id: uuid.UUID
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        try:
            saved_searches.saved_search_delete(user=request.user, search_id=search_id)
        except PortalError as error:
            raise Http404(error.detail) from None
        self.message_user(request, "Saved search deleted.")
        return HttpResponseRedirect(self._list_url())

    @replica.reviewer_reads
    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = {
            "replica_lag": replica.replica_lag(),
            "can_export": bool(tenant_ids(request, TenantPerm.EXPORT_TRAIL)),
            "saved_searches": saved_searches.saved_search_list(user=request.user),
            "current_query": saved_searches.clean_query(request.GET.urlencode()),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra_context=context)

    @replica.reviewer_reads
    def export_view(self, request: HttpRequest, fmt: str) -> HttpResponseBase:
        """The changelist's selection (filters and search) as a streamed file.

        Only the tenants where the person holds ``export_trail`` are exported; a
        tenant filter naming any other tenant is refused.
        """
        if fmt not in export.FORMATS:
            raise Http404("No such export format.")
        if request.method != "GET":
            return HttpResponseNotAllowed(["GET"])
        allowed = tenant_ids(request, TenantPerm.EXPORT_TRAIL)
        if not allowed:
            raise PermissionDenied
        wanted = request.GET.get(TenantListFilter.parameter_name)
        if wanted:
            try:
                wanted_id = uuid.UUID(wanted)
            except ValueError:
                raise PermissionDenied from None
            if wanted_id not in allowed:
                raise PermissionDenied
            scope = [wanted_id]
        else:
            scope = list(allowed)
        request._console_export = True  # type: ignore[attr-defined]
        try:
            changelist = self.get_changelist_instance(request)
        except IncorrectLookupParameters:
            return HttpResponseBadRequest("These filters do not apply to events.")
        # Bound now: the stream is read after this view returns.
        queryset = changelist.queryset.filter(tenant_id__in=scope).using(
            replica.read_alias()
        )
        tenants = dict(Tenant.objects.filter(pk__in=scope).values_list("pk", "slug"))
        filters = {
            key: value
            for key, value in request.GET.items()
            if key not in ("p", "o", "e")
        }
        content_type, extension = export.FORMATS[fmt]
        response = StreamingHttpResponse(
            export.export_stream(
                queryset=queryset,
                fmt=fmt,
                by=request.user,
                tenants=tenants,
                filters=filters,
            ),
            content_type=content_type,
        )
        response["Content-Disposition"] = f'attachment; filename="events.{extension}"'
        response["Cache-Control"] = "no-store"
        return response


@admin.register(Outbox)
class OutboxAdmin(TenantScopedAdmin):
    """The outbox monitor: per-tenant figures above the rows; dead rows retried or
    dismissed through audited services (audit/outbox_admin.py), never edited."""

    view_perm = TenantPerm.MANAGE_OUTBOX
    manage_perm = TenantPerm.MANAGE_OUTBOX
    # The key (the event id) is searchable and on the row's page; as a column it
    # pushed last_error, what an operator reads first on a dead row, off the screen.
    list_display = [
        "created_at",
        "topic",
        "tenant",
        "state",
        "attempts",
        "sent_at",
        "last_error",
    ]
    # "state" has fixed choices (no query). No topic filter: offering topics would
    # take a DISTINCT over the whole table on every page load; no facet counts
    # either (a COUNT per choice over the whole outbox).
    list_filter = ["state", "tenant"]
    show_facets = admin.ShowFacets.NEVER
    # The list's own count stops at COUNT_CAP: the outbox holds millions of rows.
    paginator = CappedPaginator
    search_fields = ["key"]  # shows the box; get_search_results does the work
    search_help_text = "An event id (the message id consumers see)."
    list_select_related = ["tenant"]
    actions = ["retry_dead", "dismiss_dead"]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Outbox], search_term: str
    ) -> tuple[QuerySet[Outbox], bool]:
        """The row of one message: the key is the event id (a CHECK holds it so),
        looked up through audit_outbox_event_uniq; anything else finds nothing."""
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            event_id = uuid.UUID(term)
        except ValueError:
            return queryset.none(), False
        return queryset.filter(event_id=event_id), False

    def has_change_permission(
        self, request: HttpRequest, obj: Model | None = None
    ) -> bool:
        return False  # rows change only through the two actions below

    def has_manage_outbox_permission(self, request: HttpRequest) -> bool:
        """Whether the person may retry or dismiss rows in one of their tenants."""
        return self.has_manage_permission(request)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if self.has_view_permission(request):
            tenants = Tenant.objects.filter(
                pk__in=tenant_ids(request, self.view_perm)
            ).order_by("slug")
            extra_context = {
                "outbox_health": dashboard.outbox_health(tenants=list(tenants)),
                "lag_sample": dashboard.LAG_SAMPLE,
                **(extra_context or {}),
            }
        return super().changelist_view(request, extra_context)

    @admin.action(description="Retry selected dead rows", permissions=["manage_outbox"])
    def retry_dead(self, request: HttpRequest, queryset: QuerySet[Outbox]) -> None:
        self.run_service(
            request,
            queryset.select_related("tenant"),
            lambda row: outbox_admin.outbox_retry(
                tenant=row.tenant, by=request.user, outbox_id=row.pk
            ),
            "back in line (pending), due now",
        )

    @admin.action(
        description="Dismiss selected dead rows", permissions=["manage_outbox"]
    )
    def dismiss_dead(self, request: HttpRequest, queryset: QuerySet[Outbox]) -> None:
        self.run_service(
            request,
            queryset.select_related("tenant"),
            lambda row: outbox_admin.outbox_dismiss(
                tenant=row.tenant, by=request.user, outbox_id=row.pk
            ),
            "dismissed; it will not be published",
        )


@admin.register(RetentionPolicy)
class RetentionPolicyAdmin(TenantScopedAdmin):
    """How long your tenants keep their events and payloads (docs/retention.md).

    Every member reads it; a tenant admin sets it (``console.services.
    retention_policy_set``: one ``tenant.changed`` event per change). A tenant
    without a row keeps the defaults, which the add form starts from.
    """

    view_perm = TenantPerm.VIEW_TRAIL
    manage_perm = TenantPerm.MANAGE_TENANT
    allow_add = True
    list_display = ["tenant", "event_months", "payload_days"]
    list_filter = ["tenant"]
    fields = ["tenant", "event_months", "payload_days"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return [] if obj is None else ["tenant"]  # no change permission: all

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        return {
            "event_months": settings.PORTAL_AUDIT_EVENT_RETENTION_MONTHS,
            "payload_days": settings.PORTAL_AUDIT_PAYLOAD_RETENTION_DAYS,
            **super().get_changeform_initial_data(request),
        }

    def save_model(
        self, request: HttpRequest, obj: RetentionPolicy, form: Any, change: bool
    ) -> None:
        saved = services.retention_policy_set(
            tenant=obj.tenant,
            by=request.user,
            event_months=form.cleaned_data["event_months"],
            payload_days=form.cleaned_data["payload_days"],
        )
        self.adopt(obj, saved)
