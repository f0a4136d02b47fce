"""The figures on the admin's front page and the outbox monitor, per person.

Every figure is read for a list of tenant ids the caller has already scoped to the
person's role (``console.admin.base.tenant_ids``): tasks and events for the tenants
where they hold ``view_trail``, the outbox for ``manage_outbox``. Nothing here counts
a whole big table. Each read is a range of an index, and where a range could still
grow without bound (a backlog, a busy hour) the count stops at ``COUNT_CAP`` and the
page says "10,000+":

- tasks by state: ``tasks_task_state_idx`` (tenant, state, updated_at). Open states
  are counted whole; finished ones (succeeded, failed, cancelled) only for the last
  24 hours, a range on ``updated_at`` (when the task finished): all-time totals of
  finished tasks grow for ever and are what the task list is for.
- the takeover queue: the same index, ``human_required`` / ``human_claimed``; the
  desk items past their SLA deadline: ``routing_assignment_due_idx`` (tenant,
  escalate_at) over open items (``routing.selectors.overdue_counts``).
- events per hour: ``audit_event_created_idx`` (tenant, created_at, id), the event
  browser's time-range index.
- the outbox: ``audit_outbox_unsent_state_idx`` (pending and dead rows only) and
  ``audit_outbox_sent_idx`` (sent rows by ``sent_at``); see ``outbox_health``.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from django.db import connection
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from portal.models import Tenant
from routing import selectors as routing_selectors
from tasks.models import TaskState

# A count that reaches this is shown as "10,000+": the page never walks further.
COUNT_CAP: Final = 10_000
# The delivery lag percentiles are taken over this many most recently sent rows.
LAG_SAMPLE: Final = 1_000
OPEN_STATES: Final = (
    TaskState.PENDING,
    TaskState.RUNNING,
    TaskState.WAITING,
    TaskState.HUMAN_REQUIRED,
    TaskState.HUMAN_CLAIMED,
)
FINISHED_STATES: Final = (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED)
TAKEOVER_STATES: Final = (TaskState.HUMAN_REQUIRED, TaskState.HUMAN_CLAIMED)
HOURS: Final = 24


@dataclass(frozen=True, kw_only=True)
class Count:
    """A count that stopped at ``COUNT_CAP`` if ``capped``."""

    value: int
    capped: bool = False

    @classmethod
    def of(cls, value: int) -> Count:
        return cls(value=min(value, COUNT_CAP), capped=value > COUNT_CAP)

    def __str__(self) -> str:
        return f"{self.value:,}+" if self.capped else f"{self.value:,}"


# --- Tasks ---------------------------------------------------------------------------

# One statement for every (tenant, state): each count is a capped range of
# tasks_task_state_idx, ordered by updated_at so that the capped rows are the oldest
# and min(updated_at) is the true oldest.
_TASK_STATES = """
SELECT t.tenant_id, s.state, c.n, c.oldest
FROM unnest(%(tenants)s::uuid[]) AS t(tenant_id)
CROSS JOIN unnest(%(states)s::text[]) AS s(state)
CROSS JOIN LATERAL (
    SELECT count(*) AS n, min(k.updated_at) AS oldest
    FROM (
        SELECT updated_at FROM tasks_task
        WHERE tenant_id = t.tenant_id AND state = s.state
          AND updated_at >= CASE WHEN s.state = ANY(%(finished)s::text[])
                                 THEN app_now() - make_interval(hours => %(hours)s)
                                 ELSE '-infinity'::timestamptz END
        ORDER BY updated_at
        LIMIT %(cap)s + 1
    ) AS k
) AS c
"""

# Reasons of the tasks waiting for a person (all of them) and of the tasks that
# failed or were cancelled in the last 24 hours; each (tenant, state) range capped.
_TASK_REASONS = """
SELECT t.tenant_id, k.reason_code, count(*)
FROM unnest(%(tenants)s::uuid[]) AS t(tenant_id)
CROSS JOIN unnest(%(states)s::text[]) AS s(state)
CROSS JOIN LATERAL (
    SELECT reason_code FROM tasks_task
    WHERE tenant_id = t.tenant_id AND state = s.state
      AND updated_at >= CASE WHEN s.state = ANY(%(finished)s::text[])
                             THEN app_now() - make_interval(hours => %(hours)s)
                             ELSE '-infinity'::timestamptz END
    ORDER BY updated_at DESC
    LIMIT %(cap)s
) AS k
WHERE k.reason_code IS NOT NULL
GROUP BY t.tenant_id, k.reason_code
ORDER BY t.tenant_id, count(*) DESC, k.reason_code
"""


@dataclass(frozen=True, kw_only=True)
class TenantTasks:
    tenant: Tenant
    by_state: dict[str, Count]
    takeover_waiting: Count
    takeover_claimed: Count
    takeover_oldest_at: dt.datetime | None
    # Open desk items past their SLA deadline (routing/, docs/routing.md).
    sla_overdue: Count = field(default_factory=lambda: Count(value=0))
    reasons: list[tuple[str, int]] = field(default_factory=list)

    @property
    def states(self) -> list[tuple[str, Count]]:
        """(state, count) in the order of ``TaskState``."""
        return [(state, self.by_state[state]) for state in TaskState.values]


def task_figures(*, tenants: Sequence[Tenant]) -> list[TenantTasks]:
    """Tasks by state and by reason, and the takeover queue, for each tenant."""
    if not tenants:
        return []
    params: dict[str, Any] = {
        "tenants": [tenant.pk for tenant in tenants],
        "states": list(TaskState.values),
        "finished": list(FINISHED_STATES),
        "hours": HOURS,
        "cap": COUNT_CAP,
    }
    counts: dict[tuple[uuid.UUID, str], tuple[int, dt.datetime | None]] = {}
    reasons: dict[uuid.UUID, list[tuple[str, int]]] = {}
    with connection.cursor() as cursor:
        cursor.execute(_TASK_STATES, params)
        for tenant_id, state, n, oldest in cursor.fetchall():
            counts[(tenant_id, state)] = (n, oldest)
        cursor.execute(
            _TASK_REASONS,
            {**params, "states": [*TAKEOVER_STATES, *FINISHED_STATES]},
        )
        for tenant_id, reason, n in cursor.fetchall():
            reasons.setdefault(tenant_id, []).append((reason, n))
    overdue = routing_selectors.overdue_counts(
        tenant_ids=params["tenants"], cap=COUNT_CAP
    )
    figures = []
    for tenant in tenants:
        by_state = {
            state: Count.of(counts[(tenant.pk, state)][0]) for state in TaskState.values
        }
        figures.append(
            TenantTasks(
                tenant=tenant,
                by_state=by_state,
                takeover_waiting=by_state[TaskState.HUMAN_REQUIRED],
                takeover_claimed=by_state[TaskState.HUMAN_CLAIMED],
                # When the longest-waiting task entered the queue (its last change).
                takeover_oldest_at=counts[(tenant.pk, TaskState.HUMAN_REQUIRED)][1],
                sla_overdue=Count.of(overdue.get(tenant.pk, 0)),
                reasons=reasons.get(tenant.pk, []),
            )
        )
    return figures


# --- The outbox ----------------------------------------------------------------------

# Per tenant, four bounded reads:
# - pending and dead: a count over audit_outbox_unsent_state_idx, a partial index
#   holding only those rows (few in a healthy system; capped for a broker outage);
# - the oldest pending row: min(created_at), the first entry of that index's range;
# - sent: never a full count (sent rows are nearly the whole table, millions), but
#   the rows sent in the last hour, a range of audit_outbox_sent_idx, capped;
# - delivery lag: p50/p95 of sent_at - created_at over the LAG_SAMPLE most recently
#   sent rows, a backward scan of audit_outbox_sent_idx (created_at is INCLUDEd, so
#   it is an index-only read).
_OUTBOX_HEALTH = """
SELECT t.tenant_id,
    (SELECT count(*) FROM (
        SELECT 1 FROM audit_outbox WHERE tenant_id = t.tenant_id AND state = 'pending'
        LIMIT %(cap)s + 1) AS p),
    (SELECT count(*) FROM (
        SELECT 1 FROM audit_outbox WHERE tenant_id = t.tenant_id AND state = 'dead'
        LIMIT %(cap)s + 1) AS d),
    (SELECT min(created_at) FROM audit_outbox
        WHERE tenant_id = t.tenant_id AND state = 'pending'),
    (SELECT count(*) FROM (
        SELECT 1 FROM audit_outbox
        WHERE tenant_id = t.tenant_id AND state = 'sent'
          AND sent_at >= app_now() - interval '1 hour'
        LIMIT %(cap)s + 1) AS s),
    lag.n, lag.p50, lag.p95,
    app_now()
FROM unnest(%(tenants)s::uuid[]) AS t(tenant_id)
CROSS JOIN LATERAL (
    SELECT count(*) AS n,
        percentile_cont(0.5) WITHIN GROUP (ORDER BY r.lag_s) AS p50,
        percentile_cont(0.95) WITHIN GROUP (ORDER BY r.lag_s) AS p95
    FROM (
        SELECT EXTRACT(EPOCH FROM sent_at - created_at)::float8 AS lag_s
        FROM audit_outbox
        WHERE tenant_id = t.tenant_id AND state = 'sent' AND sent_at IS NOT NULL
        ORDER BY sent_at DESC
        LIMIT %(sample)s
    ) AS r
) AS lag
"""


@dataclass(frozen=True, kw_only=True)
class OutboxHealth:
    tenant: Tenant
    pending: Count
    dead: Count
    oldest_pending_at: dt.datetime | None
    sent_last_hour: Count
    lag_sample: int  # how many recently sent rows the percentiles cover
    lag_p50_s: float | None
    lag_p95_s: float | None
    now: dt.datetime

    @property
    def relay_lag_s(self) -> float | None:
        """How long the oldest pending row has waited (None when none is pending)."""
        if self.oldest_pending_at is None:
            return None
        return max(0.0, (self.now - self.oldest_pending_at).total_seconds())


def outbox_health(*, tenants: Sequence[Tenant]) -> list[OutboxHealth]:
    """The outbox of each tenant: backlog, dead rows, recent throughput and lag."""
    if not tenants:
        return []
    by_id = {tenant.pk: tenant for tenant in tenants}
    with connection.cursor() as cursor:
        cursor.execute(
            _OUTBOX_HEALTH,
            {"tenants": list(by_id), "cap": COUNT_CAP, "sample": LAG_SAMPLE},
        )
        rows = cursor.fetchall()
    health = {
        row[0]: OutboxHealth(
            tenant=by_id[row[0]],
            pending=Count.of(row[1]),
            dead=Count.of(row[2]),
            oldest_pending_at=row[3],
            sent_last_hour=Count.of(row[4]),
            lag_sample=row[5],
            lag_p50_s=row[6],
            lag_p95_s=row[7],
            now=row[8],
        )
        for row in rows
    }
    return [health[tenant.pk] for tenant in tenants]


# --- Events per hour -----------------------------------------------------------------

# The last 24 clock hours, the current one included: one range of
# audit_event_created_idx per tenant (an index-only count).
_EVENTS_PER_HOUR = """
WITH counted AS (
    SELECT date_trunc('hour', created_at) AS hour, count(*) AS n
    FROM audit_event
    WHERE tenant_id = ANY(%(tenants)s::uuid[])
      AND created_at >= date_trunc('hour', app_now())
                        - make_interval(hours => %(hours)s - 1)
    GROUP BY 1
)
SELECT h.hour, COALESCE(counted.n, 0)
FROM generate_series(
    date_trunc('hour', app_now()) - make_interval(hours => %(hours)s - 1),
    date_trunc('hour', app_now()),
    interval '1 hour'
) AS h(hour)
LEFT JOIN counted ON counted.hour = h.hour
ORDER BY h.hour
"""


def events_per_hour(*, tenants: Sequence[Tenant]) -> list[tuple[dt.datetime, int]]:
    """(hour, events) for each of the last 24 clock hours, oldest first."""
    if not tenants:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            _EVENTS_PER_HOUR,
            {"tenants": [tenant.pk for tenant in tenants], "hours": HOURS},
        )
        return [(hour, n) for hour, n in cursor.fetchall()]


# Bar chart geometry, in SVG user units (the <svg> scales to its container).
_BAR_W: Final = 24
_GAP: Final = 4
_PLOT_H: Final = 120
_TOP: Final = 16
_AXIS_H: Final = 20


def events_chart_svg(buckets: Sequence[tuple[dt.datetime, int]]) -> SafeString:
    """An inline SVG bar chart of ``buckets``, drawn here: no script, no CDN.

    Each bar carries a ``<title>`` (the hour and its count) for hover, and every
    third hour is labelled under the axis in the site's time zone.
    """
    if not buckets:
        return mark_safe("")
    peak = max(n for _, n in buckets) or 1
    width = len(buckets) * (_BAR_W + _GAP) + _GAP
    height = _TOP + _PLOT_H + _AXIS_H
    bars = []
    labels = []
    for i, (hour, n) in enumerate(buckets):
        x = _GAP + i * (_BAR_W + _GAP)
        h = round(_PLOT_H * n / peak) if n else 0
        local = timezone.localtime(hour)
        bars.append(
            (
                x,
                _TOP + _PLOT_H - h,
                _BAR_W,
                h,
                f"{local:%Y-%m-%d %H}:00 to {local:%H}:59: {n:,} events",
            )
        )
        if i % 3 == 0 or i == len(buckets) - 1:
            labels.append((x + _BAR_W / 2, height - 5, f"{local:%H}:00"))
    bar_markup = format_html_join(
        "",
        '<rect class="bar" x="{}" y="{}" width="{}" height="{}">'
        "<title>{}</title></rect>",
        bars,
    )
    label_markup = format_html_join(
        "", '<text x="{}" y="{}" text-anchor="middle">{}</text>', labels
    )
    total = sum(n for _, n in buckets)
    return format_html(
        '<svg class="events-chart" viewBox="0 0 {w} {h}" width="100%" '
        'preserveAspectRatio="xMinYMid meet" '
        'role="img" aria-label="{aria}" xmlns="http://www.w3.org/2000/svg">'
        '<text class="peak" x="{gap}" y="11">peak {peak} / hour</text>'
        '<line class="axis" x1="0" y1="{base}" x2="{w}" y2="{base}"/>'
        "{bars}{labels}</svg>",
        w=width,
        h=height,
        aria=f"Events per hour over the last {len(buckets)} hours: {total:,} in all",
        gap=_GAP,
        peak=f"{peak:,}",
        base=_TOP + _PLOT_H,
        bars=bar_markup,
        labels=label_markup,
    )


# --- The whole page ------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Dashboard:
    """What the admin index shows a person; empty lists where their role shows none."""

    tasks: list[TenantTasks]
    outbox: list[OutboxHealth]
    events_per_hour: list[tuple[dt.datetime, int]]
    events_chart: SafeString
    # False: the person holds no role in any live tenant (the page says whom to ask).
    has_tenants: bool

    @property
    def events_last_24h(self) -> int:
        return sum(n for _, n in self.events_per_hour)

    @property
    def state_columns(self) -> list[tuple[str, str]]:
        """(state, label) in the order of ``TaskState``: the task table's columns."""
        return list(TaskState.choices)

    @property
    def has_reasons(self) -> bool:
        return any(figures.reasons for figures in self.tasks)

    @property
    def lag_sample(self) -> int:
        return LAG_SAMPLE


def dashboard_get(
    *, view_tenant_ids: Sequence[uuid.UUID], outbox_tenant_ids: Sequence[uuid.UUID]
) -> Dashboard:
    """The dashboard of a person who reads ``view_tenant_ids`` and manages the
    outboxes of ``outbox_tenant_ids`` (both already scoped to their roles).

    Guarantee: a fixed number of statements (tenants, three for tasks and the desk's
    SLA, one for the outbox, one for events), whatever the number of tenants or rows.
    """
    view_ids, outbox_ids = set(view_tenant_ids), set(outbox_tenant_ids)
    tenants = list(Tenant.objects.filter(pk__in=view_ids | outbox_ids).order_by("slug"))
    viewed = [tenant for tenant in tenants if tenant.pk in view_ids]
    managed = [tenant for tenant in tenants if tenant.pk in outbox_ids]
    buckets = events_per_hour(tenants=viewed)
    return Dashboard(
        tasks=task_figures(tenants=viewed),
        outbox=outbox_health(tenants=managed),
        events_per_hour=buckets,
        events_chart=events_chart_svg(buckets),
        has_tenants=bool(tenants),
    )
