"""Retention (docs/retention.md): month partitions, purges with tombstones, payload
drops, the owner-only path, outbox and idempotency cleanup, pruned plans.

Each test runs in the test case's transaction: the partition layout a test builds
(whole months, three back) is rolled back with it. Building it (partition DDL) and
tampering (triggers off) are a superuser's, so this module's connection is the
superuser's session (``superuser_session``); the tests themselves run as the app
role (``SET ROLE``, ``app_role``) once their data is in place, and step out of it
only to tamper.
"""

from __future__ import annotations

import datetime as dt
import importlib
import io
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import ProgrammingError, connection, transaction

from audit import chain, checkpoints, retention
from audit import selectors as audit_selectors
from audit import services as audit_services
from audit.models import (
    Event,
    EventCode,
    LogEntry,
    Outbox,
    RetentionAnchor,
    RetentionPolicy,
    RetentionPurge,
)
from portal import db_roles, ids, scope
from portal.actors import Actor
from portal.jobs import purge_idempotent_requests_job
from portal.models import (
    Agent,
    IdempotentRequest,
    IdempotentRequestState,
    Tenant,
)
from tests.db.conftest import refused_by
from tests.support.audit_events import append_at
from tests.support.db import conninfo

pytestmark = pytest.mark.django_db

ACTOR = Actor.system("retention-test")


def add_months(day: dt.date, months: int) -> dt.date:
    index = day.year * 12 + day.month - 1 + months
    return dt.date(index // 12, index % 12 + 1, 1)


def at(month: dt.date, day: int = 5, hour: int = 12) -> dt.datetime:
    return dt.datetime(month.year, month.month, day, hour, tzinfo=dt.UTC)


def partition(month: dt.date) -> str:
    return f"audit_event_p{month:%Y%m}"


def partitions() -> list[str]:
    return [name for name, _, _ in retention.event_partitions()]


THIS_MONTH = dt.datetime.now(dt.UTC).date().replace(day=1)
APP = db_roles.APP_ROLE


@pytest.fixture(scope="module", autouse=True)
def superuser_session(django_db_setup: None) -> Iterator[None]:
    """This module's connection: the superuser of DATABASE_URL (see the docstring)."""
    db_roles.use_role("default", user=conninfo()["user"])
    try:
        yield
    finally:
        db_roles.use_role("default", user=APP)


def become(role: str | None) -> None:
    """The current role for the rest of the test's transaction (None: the
    superuser again); rolled back with it."""
    with connection.cursor() as cursor:
        cursor.execute(f'SET ROLE "{role}"' if role else "SET ROLE NONE")


@pytest.fixture
def app_role(db: None) -> str:
    """Run the rest of the test as the app role (after the fixtures before it)."""
    become(APP)
    return APP


@pytest.fixture
def months(db: None) -> list[dt.date]:
    """audit_event in whole months: three back to three ahead (the test database's
    legacy partition, which reaches to its creation, is replaced)."""
    with connection.cursor() as cursor:
        # The test case's one transaction: check the deferred foreign keys at once,
        # as separate transactions would, so no trigger event waits on a partition
        # that retention alters.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        for name in partitions():
            cursor.execute(f'ALTER TABLE audit_event DETACH PARTITION "{name}"')
            cursor.execute(f'DROP TABLE "{name}"')
        for k in range(-3, 4):
            cursor.execute(
                "SELECT audit_event_partition_create(%s)", [add_months(THIS_MONTH, k)]
            )
    return [add_months(THIS_MONTH, k) for k in range(-3, 1)]


def append_now(tenant: Tenant, task_id: uuid.UUID | None, n: int) -> uuid.UUID:
    with transaction.atomic():
        return audit_services.event_append(
            tenant_id=tenant.pk,
            task_id=task_id,
            code=EventCode.TASK_TRANSITIONED if task_id else EventCode.TENANT_CHANGED,
            actor=ACTOR,
            data={"n": n},
        )


def checkpoint(*tenants: Tenant) -> None:
    key = checkpoints.signing_key()
    for tenant in tenants:
        checkpoints.tenant_checkpoint(tenant_id=tenant.pk, key=key)


def verify(tenant: Tenant) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("verify_audit", tenant=tenant.slug, stdout=out, stderr=out)
    except SystemExit as stop:
        return int(stop.code or 0), out.getvalue()
    return 0, out.getvalue()


def kind_of(output: str) -> str:
    line = next(line for line in output.splitlines() if line.startswith("BROKEN"))
    return line.split(": ")[1]


@pytest.fixture
def tampering() -> Callable[..., None]:
    """Run statements as the superuser with triggers off (the attacker)."""

    def run(sql: str, params: list[Any]) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_user")
            (was,) = cursor.fetchone()
        become(None)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL session_replication_role = replica")
            cursor.execute(sql, params)
            cursor.execute("SET LOCAL session_replication_role = origin")
        become(was)

    return run


@pytest.fixture
def two_tenants(
    months: list[dt.date], make_tenant: Callable[..., Tenant], settings: Any
) -> dict[str, Any]:
    """A keeps one month, B two (the default); both wrote three months back, two
    back and now; A's task chain runs from three months back into this month."""
    settings.PORTAL_AUDIT_EVENT_RETENTION_MONTHS = 2
    m3, m2, _, _ = months
    a, b = make_tenant(), make_tenant()
    RetentionPolicy.objects.create(tenant=a, event_months=1, payload_days=7)
    task_a, task_b = uuid.uuid4(), uuid.uuid4()
    append_at(a, task_a, at(m3), 1)
    append_at(a, task_a, at(m3, 6), 2)
    append_at(a, None, at(m3, 7), 1)
    append_at(a, task_a, at(m2), 3)
    append_at(a, task_a, at(m2, 6), 4)
    append_now(a, task_a, 5)
    append_at(b, task_b, at(m3), 1)
    append_at(b, task_b, at(m2), 2)
    checkpoint(a, b)
    become(APP)  # what the tests do next, the app role does
    return {"a": a, "b": b, "task_a": task_a, "task_b": task_b, "months": months}


def test_retention_drops_the_expired_month_and_writes_a_tombstone(two_tenants):
    """The month every tenant expired goes as a partition; the shorter policy
    loses its rows in the still-shared month; each purge leaves a tombstone."""
    a, b = two_tenants["a"], two_tenants["b"]
    m3, m2, m1, m0 = two_tenants["months"]
    assert partition(m3) in partitions()

    # when retention runs
    report = retention.unscoped_retention_run()

    # then three months back went as a partition, without row deletes there
    assert partition(m3) not in partitions()
    assert report.dropped_partitions == [partition(m3)]
    assert partition(m2) in partitions()
    # A (one month) lost its rows of two months back too; B (two months) kept them
    facts = [EventCode.TASK_TRANSITIONED, EventCode.TENANT_CHANGED]
    a_events = Event.objects.filter(tenant=a, code__in=facts)
    assert [e.payload["n"] for e in a_events.order_by("chain_seq")] == [5]
    b_events = Event.objects.filter(tenant=b, code__in=facts)
    assert [e.payload["n"] for e in b_events] == [2]
    # and each has one tombstone with the purge's counts and range
    tomb_a = Event.objects.get(tenant=a, code=EventCode.AUDIT_PURGED)
    assert tomb_a.task_id is None
    assert tomb_a.payload["events"] == 5
    assert tomb_a.payload["before_id"] == str(ids.id_floor(at(m1, 1, 0)))
    assert tomb_a.payload["anchors"] == 2  # the task chain and the tenant chain
    tomb_b = Event.objects.get(tenant=b, code=EventCode.AUDIT_PURGED)
    assert tomb_b.payload["events"] == 1
    assert tomb_b.payload["before_id"] == str(ids.id_floor(at(m2, 1, 0)))
    # A's task chain goes on from its anchor
    anchor = RetentionAnchor.objects.get(tenant=a, task_id=two_tenants["task_a"])
    assert anchor.seq == 4
    assert report.purged_events == {str(a.pk): 5, str(b.pk): 1}
    assert partition(m0) in partitions()

    # and a second run finds nothing more to do
    again = retention.unscoped_retention_run()
    assert (again.purged_events, again.dropped_partitions) == ({}, [])


def test_verify_audit_passes_after_the_purge(two_tenants):
    a, b = two_tenants["a"], two_tenants["b"]
    with scope.tenant_scope([a.pk]):
        leaves = LogEntry.objects.filter(tenant=a).count()
    retention.unscoped_retention_run()

    # before the next checkpoint (heads purged under the old ones) and after it
    assert verify(a)[0] == 0, verify(a)[1]
    assert verify(b)[0] == 0, verify(b)[1]
    # the dropped partition's events keep their leaves: the log still verifies
    # whole, its root from the hashes the proofs need
    assert leaves == 6
    assert "log of 6 events under 1 signed tree heads" in verify(a)[1]
    append_now(a, two_tenants["task_a"], 6)
    checkpoint(a, b)
    assert verify(a)[0] == 0, verify(a)[1]
    assert verify(b)[0] == 0, verify(b)[1]


def test_a_purge_without_its_tombstone_is_a_deletion(two_tenants, tampering):
    a = two_tenants["a"]
    retention.unscoped_retention_run()
    tomb = Event.objects.get(tenant=a, code=EventCode.AUDIT_PURGED)
    tampering("DELETE FROM audit_event WHERE id = %s", [tomb.pk])
    code, output = verify(a)
    assert (code, kind_of(output)) == (1, "deleted")


@pytest.mark.parametrize(
    ("sql", "target"),
    [
        # the tombstone's payload says fewer events went
        (
            "UPDATE audit_event SET payload = jsonb_set(payload, '{events}', '1')"
            " WHERE id = %s",
            "tombstone",
        ),
        # the tombstone and its digest rewritten together: its hash then disagrees
        (
            "UPDATE audit_event SET payload = jsonb_set(payload, '{events}', '1'),"
            " payload_digest = repeat('0', 64) WHERE id = %s",
            "tombstone",
        ),
        # an anchor moved: the chain would restart elsewhere
        ("UPDATE audit_retentionanchor SET seq = seq - 1 WHERE purge_id = %s", "purge"),
        ("UPDATE audit_retentionpurge SET events = 1 WHERE id = %s", "purge"),
    ],
)
def test_verify_audit_fails_when_the_tombstone_is_tampered(
    two_tenants, tampering, sql, target
):
    a = two_tenants["a"]
    retention.unscoped_retention_run()
    tomb = Event.objects.get(tenant=a, code=EventCode.AUDIT_PURGED)
    assert verify(a)[0] == 0
    tampering(sql, [tomb.pk if target == "tombstone" else tomb.payload["purge_id"]])
    code, output = verify(a)
    assert (code, kind_of(output)) == (1, "altered"), output


def test_rows_deleted_beside_a_purge_are_still_caught(two_tenants, tampering):
    """A purge's record does not cover what it did not remove."""
    b = two_tenants["b"]
    retention.unscoped_retention_run()
    kept = Event.objects.get(tenant=b, task_id=two_tenants["task_b"])
    tampering("DELETE FROM audit_event WHERE id = %s", [kept.pk])
    code, output = verify(b)
    assert (code, kind_of(output)) == (1, "deleted"), output


def test_payload_drop_keeps_the_digest_and_the_chain_verifies(
    months, make_tenant, tampering
):
    _, m2, m1, _ = months
    tenant = make_tenant()
    RetentionPolicy.objects.create(tenant=tenant, event_months=12, payload_days=20)
    task = uuid.uuid4()
    old_v1 = append_at(tenant, task, at(m2), 1, v1=True)
    old_v2 = append_at(tenant, task, at(m1), 2)
    recent = append_now(tenant, task, 3)
    checkpoint(tenant)

    dropped = retention.tenant_payloads_drop(tenant_id=tenant.pk)

    # then the expired v2 payload is gone, its digest stays; v1 keeps its payload
    assert dropped == 1
    event = Event.objects.get(pk=old_v2)
    assert event.payload is None
    assert event.payload_digest == chain.payload_digest({"n": 2, "note": "fact 2"})
    assert Event.objects.get(pk=old_v1).payload == {"n": 1, "note": "fact 1"}
    assert Event.objects.get(pk=recent).payload == {"n": 3}
    record = Event.objects.get(tenant=tenant, code=EventCode.AUDIT_PAYLOADS_DROPPED)
    assert record.payload["events"] == 1
    assert verify(tenant)[0] == 0, verify(tenant)[1]
    # and a payload put back with other content does not match the digest
    tampering("UPDATE audit_event SET payload = '{\"n\": 9}' WHERE id = %s", [old_v2])
    code, output = verify(tenant)
    assert (code, kind_of(output)) == (1, "altered"), output


def test_partitions_are_created_ahead_with_the_parents_guards(months):
    ahead = [partition(add_months(THIS_MONTH, k)) for k in (2, 3)]
    with connection.cursor() as cursor:
        for name in ahead:
            cursor.execute(f'ALTER TABLE audit_event DETACH PARTITION "{name}"')
            cursor.execute(f'DROP TABLE "{name}"')
        # a parent under row-level security (the RLS work) passes it on
        cursor.execute("ALTER TABLE audit_event ENABLE ROW LEVEL SECURITY")
        cursor.execute("ALTER TABLE audit_event FORCE ROW LEVEL SECURITY")

    made = retention.event_partitions_ensure()

    assert made == ahead
    assert retention.event_partitions_ensure() == []  # idempotent
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname, relrowsecurity, relforcerowsecurity FROM pg_class"
            " WHERE relname = ANY(%s) ORDER BY relname",
            [ahead],
        )
        assert cursor.fetchall() == [(name, True, True) for name in ahead]
    # bounds: whole months on the UUIDv7 time
    bounds = {name: (low, high) for name, low, high in retention.event_partitions()}
    month = add_months(THIS_MONTH, 3)
    assert bounds[ahead[1]] == (
        ids.id_floor(at(month, 1, 0)),
        ids.id_floor(at(add_months(month, 1), 1, 0)),
    )


def test_the_append_only_trigger_holds_on_every_partition_directly(months, make_tenant):
    tenant = make_tenant()
    old = append_at(tenant, uuid.uuid4(), at(months[0]), 1)
    name = partition(months[0])
    with refused_by("audit_event_append_only_trg"), connection.cursor() as cursor:
        cursor.execute(f'UPDATE "{name}" SET actor_id = %s WHERE id = %s', ["x", old])
    with refused_by("audit_event_append_only_trg"), connection.cursor() as cursor:
        cursor.execute(f'DELETE FROM "{name}" WHERE id = %s', [old])
    # a new partition has the trigger too
    new = partition(add_months(THIS_MONTH, 3))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass"
            " AND tgname = 'audit_event_append_only_trg' AND tgenabled = 'O'",
            [new],
        )
        assert cursor.fetchone()[0] == 1


def test_the_trigger_is_back_after_a_purge(two_tenants):
    retention.unscoped_retention_run()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, t.tgenabled FROM pg_trigger t"
            " JOIN pg_class c ON c.oid = t.tgrelid"
            " WHERE t.tgname = 'audit_event_append_only_trg'"
        )
        assert {mode for _, mode in cursor.fetchall()} == {"O"}
    become(None)  # past the app role's missing privilege, to the trigger
    with refused_by("audit_event_append_only_trg"), connection.cursor() as cursor:
        cursor.execute("DELETE FROM audit_event")


def as_role(role: str, sql: str, params: list[Any]) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f'SET LOCAL ROLE "{role}"')
        cursor.execute(sql, params)


def test_the_app_role_cannot_take_the_owner_path(two_tenants, app_role):
    """It may call the four retention entry points (test_privileges.py), and do
    nothing they do by itself."""
    a = two_tenants["a"]
    attempts = [
        ("SELECT audit_event_partition_create('2031-01-01')", []),
        ("SELECT audit_retention_unguarded('audit_event_legacy', 'SELECT 1')", []),
        ("ALTER TABLE audit_event DISABLE TRIGGER audit_event_append_only_trg", []),
        (f'DROP TABLE "{partition(two_tenants["months"][0])}"', []),
        (f'DELETE FROM "{partition(two_tenants["months"][0])}"', []),
        ("DELETE FROM audit_event WHERE tenant_id = %s", [a.pk]),
        ("TRUNCATE audit_event", []),
        ("UPDATE audit_retentionpurge SET events = 0", []),
        ("DELETE FROM audit_retentionanchor", []),
        ("INSERT INTO audit_retentionpurge (id, tenant_id, before_id, events,"
         " first_event_id, last_event_id, purged_at) VALUES (gen_random_uuid(), %s,"
         " gen_random_uuid(), 0, gen_random_uuid(), gen_random_uuid(), now())",
         [a.pk]),
    ]  # fmt: skip
    for sql, params in attempts:
        with pytest.raises(ProgrammingError) as caught:
            as_role(app_role, sql, params)
        assert caught.value.__cause__.sqlstate == "42501", sql
    assert Event.objects.filter(tenant=a).count() == 6


def test_the_purge_setting_opens_no_retention_record(two_tenants):
    """``portal.purge`` once opened the append-only triggers; now only the owner
    (inside its definer functions) passes them, and a superuser's session with the
    old setting meets the trigger."""
    retention.unscoped_retention_run()
    become(None)
    purge = RetentionPurge.objects.filter(tenant=two_tenants["a"]).get()
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL portal.purge = 'on'")
    with refused_by("audit_retention_append_only_trg"):
        RetentionAnchor.objects.filter(purge_id=purge.pk).delete()
    with refused_by("audit_retention_append_only_trg"):
        RetentionPurge.objects.filter(pk=purge.pk).delete()
    with refused_by("audit_event_append_only_trg"), connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM audit_event WHERE tenant_id = %s AND code = %s",
            [two_tenants["a"].pk, EventCode.AUDIT_PURGED],
        )


def test_every_partition_refuses_truncate(months):
    """The TRUNCATE guard is a statement trigger, which partitions do not inherit:
    the legacy partition kept its own, the new ones get a copy."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'audit_event'::regclass AND NOT EXISTS ("
            "  SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.oid"
            "  AND t.tgname = 'audit_event_truncate_trg')"
        )
        assert cursor.fetchall() == []
    for name in (partition(months[0]), partition(add_months(THIS_MONTH, 3))):
        with (
            pytest.raises(ProgrammingError) as caught,
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            # with the outbox, whose foreign key is checked before any trigger
            cursor.execute(f'TRUNCATE "{name}", audit_outbox')
        assert caught.value.__cause__.diag.constraint_name == "audit_event_truncate_trg"


def test_explain_prunes_the_browsers_created_range_to_its_month(two_tenants):
    """The admin's event browser, filtered on created, reads one month partition."""
    a = two_tenants["a"]
    _, m2, _, _ = two_tenants["months"]
    events = (
        Event.objects.filter(tenant=a)
        .filter(
            audit_selectors.event_created_range(
                created_from=at(m2, 5, 0), created_to=at(m2, 12, 0)
            )
        )
        .order_by("-created_at", "-id")
    )
    plan = events[:100].explain()
    named = {name for name in partitions() if name in plan}
    assert named == {partition(m2)}, plan
    assert [e.payload["n"] for e in events] == [4, 3]
    # without the range every partition is in the plan
    everything = Event.objects.filter(tenant=a).order_by("-created_at", "-id")
    assert {n for n in partitions() if n in everything[:100].explain()} == set(
        partitions()
    )


def test_sent_outbox_rows_are_cleaned_after_their_window(make_tenant):
    tenant = make_tenant()
    rows = {}
    for name in ("old_sent", "new_sent", "old_pending", "old_dead", "old_dismissed"):
        append_now(tenant, uuid.uuid4(), 1)
        rows[name] = Outbox.objects.filter(tenant=tenant).latest("id")
    with connection.cursor() as cursor:
        for name, state, age in [
            ("old_sent", "sent", "8 days"),
            ("new_sent", "sent", "1 hour"),
            ("old_pending", "pending", "8 days"),
            ("old_dead", "dead", "8 days"),
            ("old_dismissed", "dismissed", "8 days"),
        ]:
            cursor.execute(
                "UPDATE audit_outbox SET state = %s, sent_at = CASE WHEN %s = 'sent'"
                " THEN app_now() - %s::interval END,"
                " created_at = app_now() - %s::interval WHERE id = %s",
                [state, state, age, age, rows[name].pk],
            )

    deleted = retention.outbox_sent_purge(older_than=dt.timedelta(days=7))

    assert deleted == 2
    left = set(Outbox.objects.filter(tenant=tenant).values_list("id", flat=True))
    assert left == {rows[n].pk for n in ("new_sent", "old_pending", "old_dead")}


def test_expired_idempotency_records_are_cleaned(make_tenant):
    tenant = make_tenant()
    agent = Agent.objects.create(tenant=tenant, name="cleaner")
    with connection.cursor() as cursor:
        cursor.execute("SELECT app_now()")
        now = cursor.fetchone()[0]
    for key, expires in (
        ("gone", now - dt.timedelta(seconds=1)),
        ("kept", now + dt.timedelta(hours=1)),
    ):
        IdempotentRequest.objects.create(
            tenant=tenant,
            agent=agent,
            key=key,
            fingerprint="0" * 64,
            state=IdempotentRequestState.COMPLETED,
            response_status=201,
            locked_until=expires,
            expires_at=expires,
        )

    assert purge_idempotent_requests_job() == 1

    keys = IdempotentRequest.objects.filter(tenant=tenant).values_list("key", flat=True)
    assert list(keys) == ["kept"]


def test_undelivered_messages_hold_their_events(two_tenants):
    """A pending outbox row keeps its event (and what follows) from the purge."""
    b = two_tenants["b"]
    m3 = two_tenants["months"][0]
    first = Event.objects.get(tenant=b, created_at=at(m3))
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO audit_outbox (id, tenant_id, event_id, topic, key, payload,"
            " state, attempts, available_at, last_error, created_at)"
            " VALUES (%s, %s, %s, 't', %s, '{}', 'pending', 0, now(), '', now())",
            [ids.new_id(), b.pk, first.pk, str(first.pk)],
        )

    report = retention.unscoped_retention_run()

    assert Event.objects.filter(pk=first.pk).exists()
    assert str(b.pk) not in report.purged_events
    assert partition(m3) in partitions()


def test_retention_policy_bounds_are_checked(make_tenant):
    tenant = make_tenant()
    with refused_by("audit_retentionpolicy_days_range_check"):
        RetentionPolicy.objects.create(tenant=tenant, event_months=1, payload_days=90)
    with refused_by("audit_retentionpolicy_months_range_check"):
        RetentionPolicy.objects.create(tenant=tenant, event_months=1201, payload_days=1)


def test_purge_records_are_append_only(two_tenants):
    retention.unscoped_retention_run()
    purge = RetentionPurge.objects.filter(tenant=two_tenants["a"]).get()
    become(None)  # the app role lacks the privilege; the trigger is the second wall
    with refused_by("audit_retention_append_only_trg"):
        RetentionPurge.objects.filter(pk=purge.pk).update(events=0)
    with refused_by("audit_retention_append_only_trg"):
        RetentionAnchor.objects.filter(purge_id=purge.pk).delete()


def test_verify_audit_passes_while_a_purged_partition_waits_for_its_drop(two_tenants):
    """Between the tenants' purges and the partition drop, the covered rows are
    still there: the purge records account for them."""
    a, b = two_tenants["a"], two_tenants["b"]
    m3 = two_tenants["months"][0]
    for tenant in (a, b):
        retention.tenant_events_purge(tenant_id=tenant.pk)
    assert partition(m3) in partitions()
    assert Event.objects.filter(tenant=b, created_at=at(m3)).exists()
    assert verify(a)[0] == 0, verify(a)[1]
    assert verify(b)[0] == 0, verify(b)[1]


def test_the_migrations_copy_of_the_id_time_tolerance_matches(db):
    migration = importlib.import_module("audit.migrations.0011_event_partitions")
    days = int(migration.ID_TIME_TOLERANCE.split()[0])
    assert dt.timedelta(days=days) == audit_selectors.ID_TIME_TOLERANCE
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = 'audit_event'::regclass"
            " AND conname = 'audit_event_id_time_check'"
        )
        assert f"'{migration.ID_TIME_TOLERANCE}'" in cursor.fetchone()[0]
