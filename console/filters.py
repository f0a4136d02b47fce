"""List filters the big changelists need: typed values, not lists of every value.

Django's field filters list every distinct value (a ``DISTINCT`` over the table);
these take what the person types (a task id, an actor, a time range), parse it, and
filter on indexed columns. A value that does not parse selects nothing: never a 500.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import get_user_model
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from audit import selectors as audit_selectors
from audit.models import Event
from portal.actors import ActorType
from portal.models import Agent, TenantPerm

from .admin.base import tenant_ids

IGNORED_PARAMS = ("p", "e")


class InputFilter(admin.ListFilter):
    """A filter with text boxes; ``fields`` are ``(parameter, label, input type)``."""

    template = "admin/console/input_filter.html"
    fields: ClassVar[tuple[tuple[str, str, str], ...]] = ()

    def __init__(
        self,
        request: HttpRequest,
        params: dict[str, Any],
        model: type[Model],
        model_admin: admin.ModelAdmin[Any],
    ) -> None:
        super().__init__(request, params, model, model_admin)
        self.request = request
        self.model_admin = model_admin
        self.values: dict[str, str] = {}
        for name, _label, _kind in self.fields:
            if name in params:
                raw = params.pop(name)
                value = raw[-1] if isinstance(raw, list) else raw
                if str(value).strip():
                    self.values[name] = str(value).strip()
                self.used_parameters[name] = value

    def has_output(self) -> bool:
        return True

    def expected_parameters(self) -> list[str | None]:
        return [name for name, _label, _kind in self.fields]

    def _own(self) -> set[str]:
        return {name for name, _label, _kind in self.fields}

    def choices(self, changelist: ChangeList) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        own = self._own()
        hidden = [
            (key, value)
            for key, values in self.request.GET.lists()
            if key not in own and key not in IGNORED_PARAMS
            for value in values
        ]
        inputs = [
            {
                "name": name,
                "label": label,
                "type": kind,
                "value": self.shown(name, self.values[name])
                if name in self.values
                else "",
            }
            for name, label, kind in self.fields
        ]
        clear = changelist.get_query_string(remove=[*own, "p"])
        yield {
            "inputs": inputs,
            "hidden": hidden,
            "clear": clear,
            "selected": bool(self.values),
        }

    def shown(self, name: str, value: str) -> str:
        """The value as its input shows it."""
        return value

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not self.values:
            return queryset
        return self.filter(queryset)

    def filter(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        raise NotImplementedError


class TaskIdFilter(InputFilter):
    """Events of one task (its id)."""

    title = "task"
    fields = (("task", "task id", "text"),)

    def filter(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        try:
            return queryset.filter(task_id=uuid.UUID(self.values["task"]))
        except ValueError:
            return queryset.none()


class ActorFilter(InputFilter):
    """Events by one actor: ``agent name``, ``username``, a component or ``type:id``."""

    title = "actor"
    fields = (("actor", "agent, username, component or type:id", "text"),)

    def filter(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.values["actor"][:200]
        kind, _, rest = value.partition(":")
        if rest and kind in ActorType.values:
            return queryset.filter(actor_type=kind, actor_id=rest)
        readable = tenant_ids(
            self.request, getattr(self.model_admin, "view_perm", TenantPerm.VIEW_TRAIL)
        )
        agents = [
            str(pk)
            for pk in Agent.objects.filter(
                tenant_id__in=readable, name=value
            ).values_list("pk", flat=True)
        ]
        users = [
            str(pk)
            for pk in get_user_model()
            ._default_manager.filter(**{get_user_model().USERNAME_FIELD: value})
            .values_list("pk", flat=True)
        ]
        # One kind of actor, so the page is one range of audit_event_actor_idx:
        # an agent of that name, else a person, else a system component.
        if agents:
            return queryset.filter(actor_type=ActorType.AGENT, actor_id__in=agents)
        if users:
            return queryset.filter(actor_type=ActorType.USER, actor_id__in=users)
        return queryset.filter(actor_type=ActorType.SYSTEM, actor_id=value)


def parse_moment(text: str, *, end: bool) -> dt.datetime | None:
    """``2026-12-01`` or ``2026-12-01T15:04[:05]``, in the site's time zone.

    A bare date as the end of a range means the end of that day.
    """
    try:
        moment = parse_datetime(text)
        if moment is None:
            day = parse_date(text)
            if day is None:
                return None
            moment = dt.datetime.combine(day, dt.time.min)
            if end:
                moment += dt.timedelta(days=1)
    except ValueError:
        return None
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment)
    return moment


class CreatedRangeFilter(InputFilter):
    """Rows created from (inclusive) / until (exclusive) a time: an index range.

    The inputs are the browser's own date and time pickers (``datetime-local``, in
    the site's time zone, no script); a bare date typed into the URL still works.
    """

    title = "created"
    fields = (
        ("created_from", "from", "datetime-local"),
        ("created_to", "until", "datetime-local"),
    )

    def shown(self, name: str, value: str) -> str:
        """What the picker can show: ``YYYY-MM-DDTHH:MM`` in the site's time zone
        (a bare date or seconds in the URL would leave it blank)."""
        moment = parse_moment(value, end=name == "created_to")
        if moment is None:
            return value
        return f"{timezone.localtime(moment):%Y-%m-%dT%H:%M}"

    def filter(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        bounds: dict[str, dt.datetime] = {}
        for name, end in (("created_from", False), ("created_to", True)):
            if name in self.values:
                moment = parse_moment(self.values[name], end=end)
                if moment is None:
                    return queryset.none()
                bounds[name] = moment
        if queryset.model is Event:
            # Plus id bounds: the event table is partitioned by month on its id.
            return queryset.filter(audit_selectors.event_created_range(**bounds))
        if "created_from" in bounds:
            queryset = queryset.filter(created_at__gte=bounds["created_from"])
        if "created_to" in bounds:
            queryset = queryset.filter(created_at__lt=bounds["created_to"])
        return queryset


class CodeChoicesFilter(admin.ChoicesFieldListFilter):
    """A choices field's filter whose entries read as the stored codes
    (``task.registered``, ``FIELD_STALE``): what the list's columns and the exports
    show, not Django's labels ("Task Registered"). Same parameters (``code__exact``)."""

    def choices(self, changelist: ChangeList) -> Iterator[Any]:
        labels = {str(label): str(value) for value, label in self.field.flatchoices}
        for choice in super().choices(changelist):
            choice["display"] = labels.get(str(choice["display"]), choice["display"])
            yield choice
