"""The transparency log in the database: written by the checkpoint job, append-only
for the app role and the owner's triggers alike, scoped by row-level security, and
checked by ``verify_audit`` (issue 19 §2).

Tamper tests play the superuser with triggers off, as tests/db/test_audit_chain.py
does; the verdict is ``verify_audit``'s exit code and kind.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from psycopg.errors import InsufficientPrivilege, IntegrityConstraintViolation

from audit import checkpoints, merkle, tlog
from audit import services as audit_services
from audit.models import Event, EventCode, LogEntry, TreeHead
from portal import scope
from portal.actors import Actor
from portal.models import Tenant
from tests.support.db import connect_as

pytestmark = pytest.mark.django_db(transaction=True)

ACTOR = Actor.system("tlog-test")


def append(tenant: Tenant, task_id: uuid.UUID | None, n: int) -> None:
    with transaction.atomic():
        audit_services.event_append(
            tenant_id=tenant.pk,
            task_id=task_id,
            code=EventCode.TASK_TRANSITIONED if task_id else EventCode.TENANT_CHANGED,
            actor=ACTOR,
            data={"n": n},
        )


def checkpoint() -> None:
    call_command("checkpoint_audit", stdout=io.StringIO())


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
def logged(tenant: Tenant) -> Tenant:
    """Two runs of the checkpoint job: heads of 4 and then 7 events."""
    task = uuid.uuid4()
    for n in range(3):
        append(tenant, task, n)
    append(tenant, None, 0)
    checkpoint()
    for n in range(3):
        append(tenant, uuid.uuid4(), n)
    checkpoint()
    return tenant


@pytest.fixture
def superuser() -> Iterator[Callable[..., None]]:
    raw = connect_as("admin")

    def run(*statements: tuple[str, list[Any]]) -> None:
        with raw.transaction():
            raw.execute("SET LOCAL session_replication_role = replica")
            for sql, params in statements:
                raw.execute(sql, params)

    yield run
    raw.close()


def test_the_job_logs_every_event_in_id_order_and_signs_each_new_head(logged):
    # then the log holds the tenant's events in id order, hashes copied
    entries = list(LogEntry.objects.filter(tenant=logged).order_by("position"))
    events = list(Event.objects.filter(tenant=logged).order_by("id"))
    assert [(e.event_id, e.event_hash) for e in entries] == [
        (e.pk, e.hash) for e in events
    ]
    assert [e.position for e in entries] == list(range(7))
    # and each run signed one head, a stock checkpoint note for the tenant's origin
    heads = list(TreeHead.objects.filter(tenant=logged).order_by("size"))
    assert [h.size for h in heads] == [4, 7]
    key = checkpoints.signing_key()
    tree = merkle.Tree([merkle.leaf_hash(bytes.fromhex(e.hash)) for e in events])
    for head in heads:
        body = tlog.note_open(
            head.note, name=tlog.origin_of(logged.pk), public=key.public
        )
        assert body == tlog.checkpoint_body(
            origin=f"agent-governance-portal/tenants/{logged.pk}",
            size=head.size,
            root=tree.root(head.size),
        )
    # and a run with nothing new signs nothing
    checkpoint()
    assert TreeHead.objects.filter(tenant=logged).count() == 2
    code, output = verify(logged)
    assert code == 0, output
    assert "log of 7 events under 2 signed tree heads" in output


@pytest.mark.parametrize("table", ["audit_logentry", "audit_treehead"])
def test_the_app_role_can_neither_update_nor_delete_the_log(logged, table):
    column = "position" if table == "audit_logentry" else "size"
    with connection.cursor() as cursor:
        for sql in (
            f"UPDATE {table} SET {column} = {column} + 100",
            f"DELETE FROM {table}",
            f"TRUNCATE {table}",
        ):
            with pytest.raises(Exception) as caught, transaction.atomic():
                cursor.execute(sql)
            assert isinstance(caught.value.__cause__, InsufficientPrivilege), sql


@pytest.mark.parametrize("table", ["audit_logentry", "audit_treehead"])
def test_the_owner_is_refused_by_the_append_only_trigger_on_update(logged, table):
    column = "position" if table == "audit_logentry" else "size"
    with connect_as("owner") as owner, owner.transaction():
        owner.execute(
            "SELECT set_config(%s, %s, true)", [scope.SETTING, str(logged.pk)]
        )
        with pytest.raises(IntegrityConstraintViolation) as caught:
            owner.execute(f"UPDATE {table} SET {column} = {column} + 100")
    assert caught.value.diag.constraint_name == f"{table}_append_only_trg"


def test_another_tenants_scope_sees_no_log(logged, make_tenant):
    other = make_tenant()
    with scope.tenant_scope([other.pk]):
        assert LogEntry.objects.count() == 0
        assert TreeHead.objects.count() == 0
    with scope.tenant_scope([logged.pk]):
        assert LogEntry.objects.count() == 7


def test_a_tail_cut_after_a_head_is_deleted(logged, superuser):
    superuser(("DELETE FROM audit_logentry WHERE position >= 5", []))
    code, output = verify(logged)
    assert (code, kind_of(output)) == (1, "deleted"), output
    assert "the log has 5 leaves, signed up to 7" in output


def test_a_changed_leaf_is_altered(logged, superuser):
    superuser(
        (
            "UPDATE audit_logentry SET event_hash = repeat('0', 64) WHERE position = 2",
            [],
        )
    )
    code, output = verify(logged)
    assert (code, kind_of(output)) == (1, "altered"), output


def test_an_edited_head_note_is_a_forged_checkpoint(logged, superuser):
    superuser(("UPDATE audit_treehead SET note = replace(note, '\n7\n', '\n8\n')", []))
    code, output = verify(logged)
    assert (code, kind_of(output)) == (1, "forged checkpoint"), output


def test_an_event_nobody_logged_is_inserted(logged, superuser):
    # given the newest event's leaf and the heads over it gone, with a signed head
    # of the rest that is older than the grace
    superuser(
        ("DELETE FROM audit_treehead WHERE size = 7", []),
        ("DELETE FROM audit_logentry WHERE position >= 4", []),
        ("UPDATE audit_treehead SET signed_at = signed_at + interval '1 hour'", []),
    )
    code, output = verify(logged)
    assert code == 1
    # the head's signed_at is not in the note, so only the unlogged events show
    assert kind_of(output) == "inserted", output
