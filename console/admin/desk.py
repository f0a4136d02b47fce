"""The takeover desk: tasks handed to a person, their evidence, and the buttons.

Everyone with ``view_trail`` on a tenant reads its desk (reviewers read-only);
the Claim, Release, Resolve, Edit, Take over and Reassign buttons appear, and
their POSTs are accepted, only for people with ``work_takeover`` there. Each
button calls one wrapper in ``console/takeover_desk/actions.py``, which calls the
takeover (or routing) service with the person as the actor; a refusal is an admin
message, never a 500, and changes nothing.

"Edit the fields and execute" makes a network call (the gateway calls the remote
system), so its view opens no transaction: ``ATOMIC_REQUESTS`` is off project-wide
and the view is marked ``non_atomic_requests`` as well, so turning it on later
cannot wrap the call.

The list pages by keyset on ``(updated_at, id)`` — newest first, or oldest first
with ``?dir=oldest`` — following ``?after=<cursor>`` links; it never counts the
table and never uses OFFSET.
"""

from __future__ import annotations

import uuid
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet, Subquery
from django.db.models.functions import Now
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.views.decorators.http import require_POST

from portal.exceptions import PermissionDenied, PortalError, TenantNotVisible
from portal.models import TenantPerm
from tasks import keyset, takeover
from tasks.exceptions import (
    AlreadyClaimed,
    ApprovalRepeatsRefusal,
    InvalidCursor,
    NotYourClaim,
)
from tasks.gateway import FieldValue
from tasks.models import Escalation, Operation, TaskState

from .. import display
from ..filters import CodeChoicesFilter
from ..models import COMMENT_MAX_CHARS, TakeoverItem
from ..story import events_of_task_url as story_events_url
from ..takeover_desk import actions as desk_actions
from ..takeover_desk import comments as desk_comments
from ..takeover_desk import evidence as desk_evidence
from ..takeover_desk import forms as desk_forms
from ..takeover_desk import names as desk_names
from .base import TenantScopedAdmin, tenant_ids

DIR_VAR: Final = "dir"
AFTER_VAR: Final = "after"
WAITING_STATES: Final = (TaskState.HUMAN_REQUIRED, TaskState.HUMAN_CLAIMED)


class DeskStateFilter(admin.SimpleListFilter):
    """Waiting for a person (the default), claimed, or already settled."""

    title = "state"
    parameter_name = "state"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        return [
            (TaskState.HUMAN_REQUIRED, "waiting for a person"),
            (TaskState.HUMAN_CLAIMED, "claimed"),
            ("settled", "settled (history)"),
        ]

    def choices(self, changelist: Any) -> Any:
        for choice in super().choices(changelist):
            if choice["display"] == "All":
                choice["display"] = "open (waiting or claimed)"
            yield choice

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value in WAITING_STATES:
            return queryset.filter(state=value)
        if value == "settled":
            return queryset.exclude(state__in=WAITING_STATES)
        return queryset.filter(state__in=WAITING_STATES)


# A row's act and the item URL it posts to (the item page's own buttons).
_ACT_URLS: Final = {
    "claim": "claim",
    "hand_back": "resolve",
    "release": "release",
    "reassign": "reassign",
}


class DeskChangeList(ChangeList):
    """Keyset pages instead of numbered ones; no count of the table."""

    def __init__(self, request: HttpRequest, *args: Any, **kwargs: Any) -> None:
        super().__init__(request, *args, **kwargs)
        # Filter and direction links start again from the first page.
        self.params.pop(AFTER_VAR, None)
        self.filter_params.pop(AFTER_VAR, None)

    def get_filters_params(self, params: Any = None) -> Any:
        lookup_params = super().get_filters_params(params)
        for own in (DIR_VAR, AFTER_VAR):
            lookup_params.pop(own, None)
        return lookup_params

    def get_results(self, request: HttpRequest) -> None:
        self.newest_first = request.GET.get(DIR_VAR) != "oldest"
        after: keyset.Cursor | None = None
        if request.GET.get(AFTER_VAR):
            try:
                after = keyset.Cursor.decode(request.GET[AFTER_VAR])
            except InvalidCursor as error:
                messages.warning(request, error.detail)
        page = keyset.keyset_page(
            self.queryset,
            newest_first=self.newest_first,
            after=after,
            limit=self.list_per_page,
        )
        names = desk_names.owner_names(
            [row.lease_owner for row in page.items]
            + [row.desk_owner for row in page.items],
            tenant_ids={row.tenant_id for row in page.items},
        )
        clocks = desk_evidence.desk_clocks(tasks=page.items)
        # What the person may do from the list (the same POSTs as the item page's
        # buttons): claim a waiting item, hand back or release their own claim.
        workable = set(tenant_ids(request, TenantPerm.WORK_TAKEOVER))
        me = f"user:{request.user.pk}"
        back = request.GET.urlencode()
        # Reassign: rows whose item is routed and open, in tenants the person
        # works; the choices are loaded once for the page, by tenant.
        movable = {
            row.pk
            for row in page.items
            if row.tenant_id in workable
            and (clock := clocks.get(row.pk)) is not None
            and not clock.closed
        }
        targets = (
            desk_actions.desk_list_targets(
                tenant_ids={row.tenant_id for row in page.items if row.pk in movable}
            )
            if movable
            else {}
        )
        for row in page.items:
            row.desk_names = names
            row.desk_sla = clocks.get(row.pk)
            row.desk_row_acts = (
                ()
                if row.tenant_id not in workable
                else ("claim",)
                if row.state == TaskState.HUMAN_REQUIRED
                else ("hand_back", "release")
                if row.state == TaskState.HUMAN_CLAIMED and row.lease_owner == me
                else ()
            )
            row.desk_targets = targets.get(row.tenant_id, [])
            if row.pk in movable and row.desk_targets:
                row.desk_row_acts += ("reassign",)
            row.desk_forms = [
                (
                    f"desk-{row.pk}-{act}",
                    reverse(
                        f"admin:console_takeoveritem_{_ACT_URLS[act]}", args=[row.pk]
                    ),
                    "hand_back" if act == "hand_back" else "",
                )
                for act in row.desk_row_acts
            ]
        self.desk_back = back
        self.result_list = page.items
        self.result_count = len(page.items)
        self.full_result_count = None
        self.show_full_result_count = False
        self.show_admin_actions = False
        self.can_show_all = False
        self.multi_page = page.next_cursor is not None or after is not None
        self.paginator = None
        self.is_first_page = after is None
        self.next_link = (
            self.get_query_string({AFTER_VAR: page.next_cursor.encode()}, remove=["p"])
            if page.next_cursor
            else None
        )
        self.first_link = self.get_query_string(remove=[AFTER_VAR, "p"])
        self.newest_link = self.get_query_string(
            {DIR_VAR: "newest"}, remove=[AFTER_VAR, "p"]
        )
        self.oldest_link = self.get_query_string(
            {DIR_VAR: "oldest"}, remove=[AFTER_VAR, "p"]
        )


class ResolveForm(forms.Form):
    # Every resolution the service knows is accepted here; the page offers fewer
    # (desk_forms.resolution_choices) and the service refuses what does not apply.
    resolution = forms.ChoiceField(
        choices=[(r, r.replace("_", " ")) for r in takeover.RESOLUTIONS]
    )
    operation_id = forms.UUIDField(required=False)
    provider_reference = forms.CharField(max_length=200, required=False)
    note = forms.CharField(max_length=2000, required=False)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("resolution") == "hand_back" and not data.get("note"):
            self.add_error(
                "note", f"hand back needs a note: {desk_forms.HAND_BACK_NOTE}"
            )
        return data


class EditFieldForm(forms.Form):
    """One field's fresh value, with where and when the person read it."""

    name = forms.CharField(max_length=200, widget=forms.HiddenInput)
    # Required unless the row is kept (the view decides, from the sealed values).
    value = forms.CharField(
        max_length=2000, error_messages={"required": "give the fresh value"}
    )
    source = forms.CharField(
        max_length=200, error_messages={"required": "say where you read it"}
    )
    # ISO 8601 with or without an offset, or a datetime-local input's value; a
    # time without an offset is in the portal's time zone (UTC).
    observed_at = forms.DateTimeField(
        error_messages={
            "required": "say when you read it",
            "invalid": "read at is not a date and time (e.g. 2025-01-31T14:05:00Z)",
        }
    )


class EditForm(forms.Form):
    operation_id = forms.UUIDField(
        error_messages={"required": "choose the operation to execute"}
    )
    note = forms.CharField(max_length=2000, required=False)


def _form_problems(form: forms.Form, label: str = "") -> list[str]:
    return [
        f"{label}{'' if name == '__all__' else name}: "
        + " ".join(str(e) for e in errors)
        for name, errors in form.errors.items()
    ]


@admin.register(TakeoverItem)
class TakeoverDeskAdmin(TenantScopedAdmin):
    view_perm = TenantPerm.VIEW_TRAIL
    manage_perm = TenantPerm.WORK_TAKEOVER
    list_display = [
        "desk_task",
        "desk_acts",
        "desk_reason",
        "desk_age",
        "desk_object",
        "desk_responsible",
        "desk_claimed_by",
        "desk_sla",
        "tenant",
    ]
    list_display_links = ["desk_task"]
    list_filter = [("reason_code", CodeChoicesFilter), DeskStateFilter, "tenant"]
    list_select_related = ["tenant"]
    list_per_page = 50
    sortable_by = ()
    actions = None
    change_list_template = "admin/console/takeover_desk/change_list.html"
    change_form_template = "admin/console/takeover_desk/change_form.html"
    readonly_fields = (
        "client_task_id",
        "tenant",
        "state",
        "reason_code",
        "object_type",
        "object_id",
        "object_version",
        "workflow_key",
        "contract_key",
        "contract_version",
        "desk_lease_owner",
        "lease_token",
        "lease_expires_at",
        "trace_id",
        "created_at",
        "updated_at",
    )
    fields = readonly_fields

    # --- rows ---------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        escalations = Escalation.objects.filter(
            tenant_id=OuterRef("tenant_id"), task_id=OuterRef("pk")
        )
        latest_open = escalations.filter(resolved_at__isnull=True).order_by(
            "-created_at"
        )
        return (
            super()
            .get_queryset(request)
            .filter(Exists(escalations))
            .annotate(
                desk_owner=Subquery(latest_open.values("responsible_owner")[:1]),
                desk_since=Subquery(latest_open.values("created_at")[:1]),
                desk_now=Now(),
            )
        )

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return DeskChangeList

    # Read-only form; the buttons are the only changes (docs/style.md R13).
    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="task")
    def desk_task(self, task: TakeoverItem) -> str:
        return task.client_task_id

    @admin.display(description="reason")
    def desk_reason(self, task: TakeoverItem) -> str:
        """The stored code (``FIELD_STALE``), as the story, the exports and the filter
        show it, not Django's label ("Field Stale")."""
        return task.reason_code or display.EMPTY

    @admin.display(description="age")
    def desk_age(self, task: TakeoverItem) -> str:
        since = getattr(task, "desk_since", None) or task.updated_at
        now = getattr(task, "desk_now", None) or timezone.now()
        return desk_names.human_age(now - since)

    @admin.display(description="object")
    def desk_object(self, task: TakeoverItem) -> str:
        return f"{task.object_type}/{task.object_id} @ {task.object_version}"

    @admin.display(description="responsible owner")
    def desk_responsible(self, task: TakeoverItem) -> str:
        owner = getattr(task, "desk_owner", None)
        if not owner:
            return "—"
        return getattr(task, "desk_names", {}).get(owner, owner)

    @admin.display(description="claimed by")
    def desk_claimed_by(self, task: TakeoverItem) -> str:
        if task.state != TaskState.HUMAN_CLAIMED or not task.lease_owner:
            return "—"
        names = getattr(task, "desk_names", {})
        return names.get(task.lease_owner, task.lease_owner)

    @admin.display(description="group / SLA")
    def desk_sla(self, task: TakeoverItem) -> str:
        clock = getattr(task, "desk_sla", None)
        if clock is None:
            return "—"
        return clock.label

    @admin.display(description="act")
    def desk_acts(self, task: TakeoverItem) -> SafeString | str:
        """Claim, or hand back / release one's own claim, without opening the item.

        The controls name their forms (``form=``): the forms themselves stand
        outside the changelist's own form (HTML has no nested forms), in the desk
        list's template, and post to the item's own button URLs, back to this list.
        """
        acts = getattr(task, "desk_row_acts", ())
        if not acts:
            return "—"
        parts = []
        if "claim" in acts:
            parts.append(
                format_html(
                    '<button type="submit" form="desk-{}-claim" '
                    'class="desk-row-claim">Claim</button>',
                    task.pk,
                )
            )
        if "hand_back" in acts:
            parts.append(
                format_html(
                    '<input type="text" name="note" form="desk-{0}-hand_back" '
                    'required maxlength="2000" placeholder="why (for the agent)" '
                    'aria-label="hand-back note"> '
                    '<button type="submit" form="desk-{0}-hand_back" '
                    'class="desk-row-hand-back">Hand back</button>',
                    task.pk,
                )
            )
        if "release" in acts:
            parts.append(
                format_html(
                    '<button type="submit" form="desk-{}-release" '
                    'class="desk-row-release">Release</button>',
                    task.pk,
                )
            )
        if "reassign" in acts:
            parts.append(self._reassign_control(task))
        return format_html(
            '<span class="desk-row-act">{}</span>',
            format_html_join(" ", "{}", ((part,) for part in parts)),
        )

    @staticmethod
    def _reassign_control(task: TakeoverItem) -> SafeString:
        """A row's "Reassign to" choice (the page's targets for its tenant, the
        current group or person marked) and its button."""
        clock = getattr(task, "desk_sla", None)
        current = (clock.group_id, clock.person_id) if clock else (None, None)
        options = format_html_join(
            "",
            '<option value="{}"{}>{}{}</option>',
            (
                (
                    target.value,
                    " selected" if here else "",
                    target.label,
                    " (has it now)" if here else "",
                )
                for target in getattr(task, "desk_targets", [])
                for here in [(target.group_id, target.user_id) == current]
            ),
        )
        return format_html(
            '<select name="to" form="desk-{0}-reassign" class="desk-row-to" '
            'aria-label="reassign to">{1}</select> '
            '<button type="submit" form="desk-{0}-reassign" '
            'class="desk-row-reassign">Reassign</button>',
            task.pk,
            options,
        )

    @admin.display(description="lease owner")
    def desk_lease_owner(self, task: TakeoverItem) -> str:
        if not task.lease_owner:
            return "—"
        names = desk_names.owner_names([task.lease_owner], tenant_ids=[task.tenant_id])
        return names.get(task.lease_owner, task.lease_owner)

    # --- the evidence page --------------------------------------------------------

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        task = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if task is not None:
            evidence = desk_evidence.desk_evidence(task=task)
            may_act = self.has_manage_permission(request, task)
            mine = task.lease_owner == f"user:{request.user.pk}"
            claimed = task.state == TaskState.HUMAN_CLAIMED
            context.update(
                evidence=evidence,
                events_url=story_events_url(task.pk),
                may_act=may_act,
                can_claim=may_act and task.state == TaskState.HUMAN_REQUIRED,
                can_settle=may_act and claimed and mine,
                claimed_by=(
                    evidence.names.get(task.lease_owner or "", task.lease_owner)
                    if claimed
                    else None
                ),
                can_release_any=(
                    claimed
                    and not mine
                    and task.tenant_id
                    in tenant_ids(request, TenantPerm.RELEASE_ANY_CLAIM)
                ),
                routing=(
                    desk_actions.desk_routing(task=task, user=request.user)
                    if may_act
                    else None
                ),
                resolve_form=ResolveForm(),
                resolutions=desk_forms.resolution_choices(task=task),
                approvable=task.reason_code in takeover.APPROVABLE_REASONS,
                hand_back_note=desk_forms.HAND_BACK_NOTE,
                comment_max_chars=COMMENT_MAX_CHARS,
                edit_help=desk_forms.EDIT_HELP,
                open_operations=[
                    o.operation
                    for o in evidence.operations
                    if o.operation.state in ("human_required", "unknown", "conflict")
                ],
            )
            edit_operations = desk_forms.edit_operations(
                operations=[o.operation for o in evidence.operations]
            )
            if context["can_settle"] and edit_operations:
                context.update(
                    # Kept and asked rows for the first operation (the one the
                    # form executes when there is one; the usual case).
                    edit_rows=desk_forms.desk_edit_rows(
                        task=task, operation=edit_operations[0]
                    ),
                    edit_operations=edit_operations,
                    edit_now=timezone.localtime(desk_forms.desk_now()).strftime(
                        "%Y-%m-%dT%H:%M:%S"
                    ),
                    edit_tz=timezone.get_current_timezone_name(),
                )
        return super().change_view(request, object_id, form_url, context)

    # --- the buttons --------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        wrap = self.admin_site.admin_view
        return [
            path(
                "<uuid:task_id>/claim/",
                wrap(require_POST(self.claim_view)),
                name="{}_{}_claim".format(*info),
            ),
            path(
                "<uuid:task_id>/release/",
                wrap(require_POST(self.release_view)),
                name="{}_{}_release".format(*info),
            ),
            path(
                "<uuid:task_id>/release-any/",
                wrap(require_POST(self.release_any_view)),
                name="{}_{}_release_any".format(*info),
            ),
            path(
                "<uuid:task_id>/take-over/",
                wrap(require_POST(self.take_over_view)),
                name="{}_{}_take_over".format(*info),
            ),
            path(
                "<uuid:task_id>/reassign/",
                wrap(require_POST(self.reassign_view)),
                name="{}_{}_reassign".format(*info),
            ),
            path(
                "<uuid:task_id>/comment/",
                wrap(require_POST(self.comment_view)),
                name="{}_{}_comment".format(*info),
            ),
            path(
                "<uuid:task_id>/resolve/",
                wrap(require_POST(self.resolve_view)),
                name="{}_{}_resolve".format(*info),
            ),
            path(
                "<uuid:task_id>/edit/",
                # The gateway calls out: no request-wide transaction, ever.
                transaction.non_atomic_requests(wrap(require_POST(self.edit_view))),
                name="{}_{}_edit".format(*info),
            ),
            *super().get_urls(),
        ]

    def _desk_task(self, request: HttpRequest, task_id: uuid.UUID) -> TakeoverItem:
        task = self.get_queryset(request).select_related("tenant").filter(pk=task_id)
        found = task.first()
        if found is None:
            raise Http404("No such task on your desk.")
        return found

    def _run(
        self, request: HttpRequest, task_id: uuid.UUID, change: Any, done: str
    ) -> HttpResponse:
        task = self._desk_task(request, task_id)
        try:
            change(task)
        except PermissionDenied as error:
            raise DjangoPermissionDenied(error.detail) from None
        except TenantNotVisible:
            raise Http404("No such task on your desk.") from None
        except PortalError as error:
            self.message_user(
                request,
                self._named(request, task, self._explain(error)),
                messages.ERROR,
            )
        else:
            self.message_user(
                request, self._named(request, task, done), messages.SUCCESS
            )
        return self._back(request, task)

    @staticmethod
    def _from_list(request: HttpRequest) -> bool:
        return request.POST.get("back") == "list"

    def _named(self, request: HttpRequest, task: TakeoverItem, text: str) -> str:
        """From the list, a message names its row's task."""
        return f"{task.client_task_id}: {text}" if self._from_list(request) else text

    def _back(self, request: HttpRequest, task: TakeoverItem) -> HttpResponse:
        """To the list the person acted from (its filters kept), else the item."""
        if self._from_list(request):
            query = urlencode(parse_qsl(request.POST.get("list_query", "")[:2000]))
            url = reverse("admin:console_takeoveritem_changelist")
            return HttpResponseRedirect(f"{url}?{query}" if query else url)
        return HttpResponseRedirect(
            reverse("admin:console_takeoveritem_change", args=[task.pk])
        )

    def _explain(self, error: PortalError) -> str:
        """The refusal in words a person acts on."""
        context = error.context
        if isinstance(error, AlreadyClaimed):
            owner = str(context.get("claimed_by") or "")
            name = desk_names.owner_names([owner]).get(owner, owner or "someone")
            return f"Someone else claimed this task first: {name}."
        if isinstance(error, NotYourClaim):
            owner = str(context.get("claimed_by") or "")
            name = desk_names.owner_names([owner]).get(owner, owner or "someone")
            return f"{error.detail} It is claimed by {name}."
        if isinstance(error, ApprovalRepeatsRefusal):
            reason = context.get("reason_code") or "this reason"
            return (
                f"Not approved: for {reason} the same input would be refused "
                "again. Edit the fields (fresh values with their source and read "
                "time) or hand the task back for a fresh read."
            )
        if "current" in context and "requested" in context:
            return (
                f"{error.detail} (it is {context['current']}; "
                f"asked for {context['requested']})"
            )
        if "field" in context:
            return f"{error.detail} ({context['field']})"
        return error.detail

    def claim_view(self, request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
        return self._run(
            request,
            task_id,
            lambda task: desk_actions.desk_claim(task=task, user=request.user),
            "You claimed this task; nobody else can act on it until you release "
            "or resolve it.",
        )

    def release_view(self, request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
        return self._run(
            request,
            task_id,
            lambda task: desk_actions.desk_release(task=task, user=request.user),
            "Released: the task is back in the queue.",
        )

    def release_any_view(
        self, request: HttpRequest, task_id: uuid.UUID
    ) -> HttpResponse:
        note = request.POST.get("note", "")[:2000]
        return self._run(
            request,
            task_id,
            lambda task: desk_actions.desk_release_any(
                task=task, user=request.user, note=note
            ),
            "Released the other person's claim: the task is back in the queue.",
        )

    def take_over_view(self, request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
        return self._run(
            request,
            task_id,
            lambda task: desk_actions.desk_take_over(task=task, user=request.user),
            "You took this item over: it is yours on the desk (the SLA clock runs on).",
        )

    def reassign_view(self, request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
        to = request.POST.get("to", "")[:200]
        return self._run(
            request,
            task_id,
            lambda task: desk_actions.desk_reassign(
                task=task, user=request.user, to=to
            ),
            "Moved: the item's new group (or person) is told by e-mail and webhook.",
        )

    def comment_view(self, request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
        """Add a comment; back on the item page (the form's text is not kept: a
        reload shows the page, it does not post the comment again)."""
        body = request.POST.get("body", "")[: COMMENT_MAX_CHARS * 2]
        return self._run(
            request,
            task_id,
            lambda task: desk_comments.desk_comment_add(
                task=task, user=request.user, body=body
            ),
            "Comment added to the timeline.",
        )

    def resolve_view(self, request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
        form = ResolveForm(request.POST)
        if not form.is_valid():
            task = self._desk_task(request, task_id)
            problems = "; ".join(_form_problems(form))
            self.message_user(
                request,
                self._named(request, task, f"Not resolved: {problems}"),
                messages.ERROR,
            )
            return self._back(request, task)
        data = form.cleaned_data
        return self._run(
            request,
            task_id,
            lambda task: desk_actions.desk_resolve(
                task=task,
                user=request.user,
                resolution=data["resolution"],
                operation_id=data["operation_id"],
                provider_reference=data["provider_reference"],
                note=data["note"],
            ),
            f"Resolved: {data['resolution'].replace('_', ' ')}."
            + (
                " The agent reads again and executes under the same key."
                if data["resolution"] == "hand_back"
                else ""
            ),
        )

    def edit_view(self, request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
        """Execute with the fresh field values a person gives.

        The rows come from the task's pinned contract, not from the POST: a value
        for a field the contract does not require is ignored, a missing one is a
        message. A kept row left empty executes with the value sealed with the
        operation at its refused execute (desk_forms.edit_fields), never one posted.
        Bad input is a message and changes nothing.
        """
        task = self._desk_task(request, task_id)
        back = HttpResponseRedirect(
            reverse("admin:console_takeoveritem_change", args=[task.pk])
        )
        form = EditForm(request.POST)
        operation = (
            Operation.objects.filter(
                tenant_id=task.tenant_id,
                task_id=task.pk,
                pk=form.cleaned_data["operation_id"],
            ).first()
            if form.is_valid()
            else None
        )
        rows = desk_forms.desk_edit_rows(task=task, operation=operation) or []
        problems = [] if rows else ["the task pins no contract with fields to give"]
        problems += _form_problems(form)
        given: list[FieldValue] = []
        for index, row in enumerate(rows):
            prefix = f"field-{index}"
            if row.kept and not request.POST.get(f"{prefix}-value", "").strip():
                continue  # kept: the sealed value, never one posted
            field_form = EditFieldForm(request.POST, prefix=prefix)
            if not field_form.is_valid():
                problems += _form_problems(field_form, label=f"{row.name} ")
                continue
            data = field_form.cleaned_data
            if data["name"] != row.name:
                problems.append(f"{row.name}: the form is out of date; reload it")
                continue
            given.append(
                FieldValue(
                    name=row.name,
                    value=data["value"],
                    source=data["source"],
                    observed_at=data["observed_at"],
                )
            )
        fields = (
            desk_forms.edit_fields(rows=rows, operation=operation, given=given)
            if operation is not None
            else given
        )
        if problems:
            self.message_user(
                request, "Not executed: " + "; ".join(problems), messages.ERROR
            )
            return back
        try:
            outcome = desk_actions.desk_edit(
                task=task,
                user=request.user,
                operation_id=form.cleaned_data["operation_id"],
                fields=fields,
                note=form.cleaned_data["note"],
            )
        except PermissionDenied as error:
            raise DjangoPermissionDenied(error.detail) from None
        except TenantNotVisible:
            raise Http404("No such task on your desk.") from None
        except PortalError as error:
            self.message_user(request, self._explain(error), messages.ERROR)
            return back
        report = desk_forms.edit_report(task=task, outcome=outcome)
        self.message_user(
            request, report.text, messages.SUCCESS if report.ok else messages.ERROR
        )
        return back
