"""A purged tenant's transparency log ends in a signed tombstone (issue 19 §2).

``manage.py delete_tenant`` under ``purge`` deletes the tenant's events,
checkpoints and row, but keeps its log's leaves and signed heads and ends them in a
tombstone note signed by the audit key (tenant_deletion). ``verify_audit`` reports
the tenant as purged at its size with a valid tombstone, and exits 1 when the
tombstone is forged, the kept log was cut, changed or extended, or a tenant's trail
is gone without a tombstone. Tampering plays the superuser with triggers off.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction

from audit import checkpoints, merkle, tlog
from audit import services as audit_services
from audit.models import Event, EventCode, LogEntry, TreeHead
from portal import scope
from portal.actors import Actor
from portal.models import EventsOnDelete, Tenant
from tasks.models import Task
from tenant_deletion.models import Tombstone
from tests.support.db import connect_as

pytestmark = pytest.mark.django_db(transaction=True)

ACTOR = Actor.system("tombstone-test")


def append(tenant: Tenant, task: Task | None, n: int) -> None:
    with transaction.atomic():
        audit_services.event_append(
            tenant_id=tenant.pk,
            task_id=task.pk if task else None,
            code=EventCode.TASK_TRANSITIONED if task else EventCode.TENANT_CHANGED,
            actor=ACTOR,
            data={"n": n},
        )


def verify(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("verify_audit", *args, stdout=out, stderr=out)
    except SystemExit as stop:
        return int(stop.code or 0), out.getvalue()
    return 0, out.getvalue()


def broken(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("BROKEN"))


def superuser(*statements: tuple[str, Any]) -> None:
    with connect_as("admin") as admin, admin.transaction():
        admin.execute("SET LOCAL session_replication_role = replica")
        for sql, params in statements:
            admin.execute(sql, params)


@pytest.fixture
def acme(make_tenant: Callable[..., Tenant], make_task: Callable[..., Task]) -> Tenant:
    """A purge tenant: 5 events under a signed head, then 2 no run has placed."""
    acme = make_tenant(slug="acme", events_on_delete=EventsOnDelete.PURGE)
    task = make_task(tenant=acme)
    for n in range(4):
        append(acme, task, n)
    append(acme, None, 0)
    call_command("checkpoint_audit", stdout=io.StringIO())
    append(acme, task, 4)
    append(acme, None, 1)
    Task.objects.filter(pk=task.pk).delete()  # tasks go first in a deletion anyway
    return acme


@pytest.fixture
def purged(acme: Tenant) -> dict[str, Any]:
    """acme purged by the operator's command, with what a bundle holder kept from
    before: the head of 5 and an event's inclusion proof in it."""
    with scope.tenant_scope([acme.pk]):
        head = TreeHead.objects.get(tenant=acme, size=5)
        tree = tlog.log_tree(tenant_id=acme.pk)
        leaf = tree.leaf_hashes[2]
        proof = tree.inclusion_proof(2, 5)
    call_command("delete_tenant", "acme", "--yes", stdout=io.StringIO())
    return {"id": acme.pk, "head": head, "leaf": leaf, "proof": proof}


def test_a_purge_ends_the_log_in_a_signed_tombstone(purged):
    tenant_id = purged["id"]
    # then the tenant and its events are gone, its log is not
    assert not Tenant.objects.filter(pk=tenant_id).exists()
    assert not Event.objects.filter(tenant_id=tenant_id).exists()
    with scope.tenant_scope([tenant_id]):
        assert LogEntry.objects.filter(tenant_id=tenant_id).count() == 7
        # the two unplaced events got their places under one more head first
        assert [h.size for h in TreeHead.objects.order_by("size")] == [5, 7]
        tree = tlog.log_tree(tenant_id=tenant_id)
    # and the tombstone is a stock checkpoint note of the last head, with the
    # tombstone line, signed by the audit key for the tenant's origin
    tombstone = Tombstone.objects.get(tenant_id=tenant_id)
    key = checkpoints.signing_key()
    body = tlog.note_open(
        tombstone.note, name=tlog.origin_of(tenant_id), public=key.public
    )
    assert body == tlog.checkpoint_body(
        origin=tlog.origin_of(tenant_id),
        size=7,
        root=tree.root(),
        extensions=["tombstone: tenant purged"],
    )
    assert tlog.checkpoint_parse(body).tombstone
    assert (tombstone.slug, tombstone.size, tombstone.key_id) == ("acme", 7, key.key_id)
    # and a proof given out before the purge still checks: the event in the old
    # head, and the old head extended by the tombstone
    old_root = bytes.fromhex(purged["head"].root_hash)
    merkle.verify_inclusion(
        leaf=purged["leaf"], index=2, size=5, proof=purged["proof"], root=old_root
    )
    merkle.verify_consistency(
        old_size=5,
        new_size=7,
        old_root=old_root,
        new_root=bytes.fromhex(tombstone.root_hash),
        proof=tree.consistency_proof(5, 7),
    )
    # and verify_audit says so, for all tenants and for this slug
    for args in ((), ("--tenant", "acme")):
        code, output = verify(*args)
        assert code == 0, output
        assert (
            f"ok purged tenant acme ({tenant_id}): purged at size 7, tombstone "
            "valid; log of 7 events under 2 signed tree heads"
        ) in output


TOMBSTONE = "tenant_deletion_tombstone"
LOG = "audit_logentry"


@pytest.mark.parametrize(
    ("tampering", "kind", "detail"),
    [
        (
            f"UPDATE {TOMBSTONE} SET note = replace(note, '\n7\n', '\n6\n')",
            "forged checkpoint",
            "the tombstone of size 7 does not verify",
        ),
        (
            f"UPDATE {TOMBSTONE} SET size = 6",
            "forged checkpoint",
            "not a tombstone of the size and root it names",
        ),
        (
            f"UPDATE {TOMBSTONE} SET key_id = '0000000000000000'",
            "forged checkpoint",
            "no given key has the id",
        ),
        (
            f"DELETE FROM {LOG} WHERE tenant_id = %(t)s AND position = 6",
            "deleted",
            "the log has 6 leaves, signed up to 7",
        ),
        (
            f"UPDATE {LOG} SET event_hash = repeat('0', 64)"
            " WHERE tenant_id = %(t)s AND position = 3",
            "altered",
            "do not give the signed root",
        ),
        (
            f"INSERT INTO {LOG} (id, tenant_id, position, event_id, event_hash)"
            " VALUES (gen_random_uuid(), %(t)s, 7, gen_random_uuid(), repeat('a', 64))",
            "inserted",
            "the log goes on after its tombstone: 8 leaves, not 7",
        ),
        (
            "DELETE FROM audit_treehead WHERE tenant_id = %(t)s AND size = 7",
            None,  # the tombstone is the last head: still extends the one of 5
            None,
        ),
    ],
)
def test_a_changed_tombstone_or_kept_log_is_reported(purged, tampering, kind, detail):
    superuser((tampering, {"t": purged["id"]}))
    code, output = verify()
    if kind is None:
        assert code == 0, output
        return
    line = broken(output)
    assert code == 1, output
    assert line.startswith(f"BROKEN purged tenant acme ({purged['id']}): {kind}: ")
    assert detail in line, line


def test_a_tombstone_signed_by_another_key_is_forged(purged):
    other = checkpoints.SigningKey(private=Ed25519PrivateKey.generate(), key_id="")
    tombstone = Tombstone.objects.get(tenant_id=purged["id"])
    body = tombstone.note.partition("\n\n")[0] + "\n"
    forged = checkpoints.tree_note_sign(body=body, key=other)
    superuser(
        (
            f"UPDATE {TOMBSTONE} SET note = %s WHERE tenant_id = %s",
            [forged, purged["id"]],
        )
    )
    code, output = verify()
    assert code == 1
    assert "forged checkpoint" in broken(output), output


def test_a_trail_gone_without_a_tombstone_is_deleted(acme: Tenant):
    # given a tenant erased around the purge function: events, checkpoints, head
    # rows and the tenant row gone, triggers (and so foreign keys) off; its log's
    # heads outlive it
    call_command("checkpoint_audit", stdout=io.StringIO())
    superuser(
        *(
            (f"DELETE FROM {table} WHERE tenant_id = %s", [acme.pk])
            for table in (
                "audit_outbox",
                "audit_event",
                "audit_checkpoint",
                "audit_chainhead",
            )
        ),
        ("DELETE FROM portal_tenant WHERE id = %s", [acme.pk]),
    )
    # then verify_audit finds the log of a tenant that is neither live nor purged
    code, output = verify()
    assert code == 1, output
    assert broken(output) == (
        f"BROKEN tenant {acme.pk}: deleted: its log has signed heads, but the tenant "
        "and its events are gone without a tombstone"
    )


def refused(conn: psycopg.Connection, sql: str, params: list[Any]) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as caught, conn.transaction():
        conn.execute(sql, params)
    return caught.value


def test_the_purge_function_refuses_without_the_tombstone_of_the_log(acme: Tenant):
    """The operator's function purges only a log that ends in its tombstone."""
    call_command("checkpoint_audit", stdout=io.StringIO())  # 7 leaves, head of 7
    with connect_as("operator", autocommit=True) as operator:
        operator.execute(
            "SELECT set_config('portal.tenant_ids', %s, false)", [str(acme.pk)]
        )
        purge = "SELECT * FROM tenant_deletion_purge(%s)"
        error = refused(operator, purge, [acme.pk])
        assert error.sqlstate == "42501"
        assert "has no tombstone" in str(error)
        # a tombstone of another size (or root, or body) is refused too
        key = checkpoints.signing_key()
        with scope.tenant_scope([acme.pk]):
            root = tlog.log_tree(tenant_id=acme.pk).root(6)
        body = tlog.checkpoint_body(
            origin=tlog.origin_of(acme.pk),
            size=6,
            root=root,
            extensions=[tlog.TOMBSTONE_LINE],
        )
        note = checkpoints.tree_note_sign(body=body, key=key)
        operator.execute(
            f"INSERT INTO {TOMBSTONE} (tenant_id, slug, size, root_hash, note,"
            " key_id, signed_at) VALUES (%s, 'acme', 6, %s, %s, %s, now())",
            [acme.pk, root.hex(), note, key.key_id],
        )
        error = refused(operator, purge, [acme.pk])
        assert error.sqlstate == "42501"
        assert "tombstone is not its log's last head" in str(error)
    assert Event.objects.filter(tenant=acme).count() == 7


def test_only_the_operator_writes_a_tombstone_and_nobody_changes_one(purged):
    row = [uuid.uuid4(), "x", 0, "0" * 64, "n", "k"]
    insert = (
        f"INSERT INTO {TOMBSTONE} (tenant_id, slug, size, root_hash, note, key_id,"
        " signed_at) VALUES (%s, %s, %s, %s, %s, %s, now())"
    )
    with connect_as("app", autocommit=True) as app:
        for sql, params in (
            (insert, row),
            (f"UPDATE {TOMBSTONE} SET size = 1", []),
            (f"DELETE FROM {TOMBSTONE}", []),
            (f"TRUNCATE {TOMBSTONE}", []),
        ):
            assert refused(app, sql, params).sqlstate == "42501", sql
    with connect_as("owner", autocommit=True) as owner:
        owner.execute(
            "SELECT set_config('portal.tenant_ids', %s, false)", [str(purged["id"])]
        )
        error = refused(owner, f"UPDATE {TOMBSTONE} SET size = 1", [])
        assert error.diag.constraint_name == f"{TOMBSTONE}_append_only_trg"
    assert Tombstone.objects.get(tenant_id=purged["id"]).size == 7


def test_without_a_signing_key_a_purge_changes_nothing(acme: Tenant, settings):
    settings.PRODUCTION = True
    settings.PORTAL_AUDIT_SIGNING_KEY = ""
    settings.PORTAL_AUDIT_SIGNING_KEY_FILE = ""
    with pytest.raises(CommandError, match=r"AUDIT_SIGNING_KEY_MISSING|signing key"):
        call_command("delete_tenant", "acme", "--yes", stdout=io.StringIO())
    assert Tenant.objects.filter(pk=acme.pk).exists()
    assert Event.objects.filter(tenant=acme).count() == 7
    assert not Tombstone.objects.filter(tenant_id=acme.pk).exists()


def test_a_deleted_tombstone_leaves_a_log_without_one(purged):
    superuser((f"DELETE FROM {TOMBSTONE} WHERE tenant_id = %s", [purged["id"]]))
    code, output = verify()
    assert code == 1, output
    assert broken(output).startswith(f"BROKEN tenant {purged['id']}: deleted: ")
    assert "gone without a tombstone" in output
