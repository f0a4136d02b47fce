"""A purged tenant's tombstone goes to its witnesses (issue 19, loose end 2).

Real parts: a ``manage.py witness`` process on 127.0.0.1, the operator's
``manage.py delete_tenant`` on PostgreSQL. After the purge commits, the tombstone
(the log's last checkpoint with the line ``tombstone: tenant purged``) is submitted
to each configured witness with a consistency proof from the last head it
cosigned; the witness's cosignature binds the tombstone line (C2SP
``cosignature/v1`` signs the whole checkpoint body), is stored by the operator,
and ``verify_audit`` checks it as it checks a head's. Whoever later deletes the
kept log and the tombstone leaves the witness's state: the purge, cosigned.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from django.core.management import call_command
from django.db import transaction
from django.test import override_settings

from audit import checkpoints, tlog, witness, witness_client
from audit import services as audit_services
from audit.models import EventCode, HeadStamp
from portal import scope
from portal.actors import Actor
from portal.models import EventsOnDelete, Tenant
from tenant_deletion import selectors as deletion_selectors
from tenant_deletion.models import Tombstone, TombstoneStamp
from tests.support.db import connect_as
from tests.support.witness import RunningWitness, running_witness

pytestmark = pytest.mark.django_db(transaction=True)

ACTOR = Actor.system("tombstone-witness-test")


def append(tenant: Tenant, n: int) -> None:
    with transaction.atomic():
        audit_services.event_append(
            tenant_id=tenant.pk,
            code=EventCode.TENANT_CHANGED,
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


@pytest.fixture(autouse=True)
def no_witness_marked_down() -> Iterator[None]:
    witness_client._down_until.clear()
    yield
    witness_client._down_until.clear()


@pytest.fixture
def w1(tmp_path: Path) -> Iterator[RunningWitness]:
    checkpoints.signing_key()  # the development key's public half, for the witness
    with (
        running_witness(tmp_path / "w1") as running,
        override_settings(PORTAL_AUDIT_WITNESSES=[running.entry]),
    ):
        yield running


@pytest.fixture
def acme(make_tenant: Callable[..., Tenant], w1: RunningWitness) -> Tenant:
    """A purge tenant: a head of 3 the witness cosigned, then 2 unplaced events."""
    acme = make_tenant(slug="acme", events_on_delete=EventsOnDelete.PURGE)
    for n in range(3):
        append(acme, n)
    call_command("checkpoint_audit", stdout=io.StringIO())
    append(acme, 3)
    append(acme, 4)
    return acme


def _purge(tenant: Tenant) -> tuple[uuid.UUID, str]:
    err = io.StringIO()
    call_command(
        "delete_tenant", tenant.slug, "--yes", stdout=io.StringIO(), stderr=err
    )
    return tenant.pk, err.getvalue()


def _witness_state(w1: RunningWitness, tenant_id: uuid.UUID) -> str:
    origin = tlog.origin_of(tenant_id)
    url = f"{w1.url}/{witness.origin_hash(origin)}/checkpoint"
    response = httpx.get(url, timeout=5)
    assert response.status_code == 200, response.text
    return response.text


def test_the_purge_has_its_tombstone_cosigned_and_verify_audit_checks_it(
    acme: Tenant, w1: RunningWitness
) -> None:
    # given a purge tenant whose last head (3) the witness cosigned
    config = witness_client.witness_parse(w1.entry)
    # when the operator purges it
    tenant_id, err = _purge(acme)
    assert err == ""
    # then the witness cosigned the tombstone of 5 (extending its head of 3), and
    # the operator stored the line
    tombstone = Tombstone.objects.get(tenant_id=tenant_id)
    assert tombstone.size == 5
    with scope.tenant_scope([tenant_id]):
        stamps = deletion_selectors.tombstone_stamps(tenant_id=tenant_id)
    assert [signer for signer, _ in stamps] == [w1.name]
    body = tombstone.note.rpartition("\n\n")[0] + "\n"
    assert tlog.TOMBSTONE_LINE in body
    witness.cosignature_open(
        stamps[0][1], body=body, name=config.name, public=config.public
    )
    # and the witness's own state (outside the database) is the tombstone
    state = _witness_state(w1, tenant_id)
    assert state.startswith(body)
    assert stamps[0][1] in state
    # and verify_audit checks the cosignature
    code, output = verify()
    assert code == 0, output
    assert f"tombstone witnessed by {w1.name}" in output
    # and a second submission asks nothing again (the stamp is stored)
    with scope.tenant_scope([tenant_id]):
        from tenant_deletion import services as deletion

        with override_settings(PORTAL_AUDIT_WITNESSES=[w1.entry]):
            assert deletion.tombstone_witness(tenant_id=tenant_id) == []
        assert TombstoneStamp.objects.filter(tombstone_id=tenant_id).count() == 1


def test_the_log_and_tombstone_deleted_leave_the_witnesss_cosigned_copy(
    acme: Tenant, w1: RunningWitness
) -> None:
    """What the owner can still do: delete the kept log, its heads, stamps and the
    tombstone. The database then agrees with itself; the witness does not."""
    tenant_id, _ = _purge(acme)
    superuser(
        (
            "DELETE FROM tenant_deletion_tombstonestamp WHERE tenant_id = %s",
            [tenant_id],
        ),
        ("DELETE FROM tenant_deletion_tombstone WHERE tenant_id = %s", [tenant_id]),
        ("DELETE FROM audit_headstamp WHERE tenant_id = %s", [tenant_id]),
        ("DELETE FROM audit_treehead WHERE tenant_id = %s", [tenant_id]),
        ("DELETE FROM audit_logentry WHERE tenant_id = %s", [tenant_id]),
    )
    with override_settings(PORTAL_AUDIT_WITNESSES=[]):
        code, output = verify()
    assert code == 0, output  # nothing left in the database to compare with
    # the witness still holds the tombstone, signed by the log's key and cosigned
    state = _witness_state(w1, tenant_id)
    body = tlog.note_open(
        state, name=tlog.origin_of(tenant_id), public=checkpoints.signing_key().public
    )
    assert tlog.checkpoint_parse(body).tombstone
    config = witness_client.witness_parse(w1.entry)
    lines = witness.cosignature_lines(state)
    assert any(
        witness.cosignature_open(
            line.line, body=body, name=config.name, public=config.public
        )
        for line in lines
    )


@pytest.mark.parametrize("change", ["forged", "replayed"])
def test_a_changed_tombstone_cosignature_is_caught(
    acme: Tenant, w1: RunningWitness, change: str
) -> None:
    tenant_id, _ = _purge(acme)
    with scope.tenant_scope([tenant_id]):
        head_line = HeadStamp.objects.get(tenant_id=tenant_id).stamp
        (_, line) = deletion_selectors.tombstone_stamps(tenant_id=tenant_id)[0]
    if change == "forged":  # a bit of the signature flipped
        dash, name, blob = line.rstrip("\n").split(" ")
        raw = bytearray(base64.b64decode(blob))
        raw[20] ^= 1
        changed = f"{dash} {name} {base64.b64encode(bytes(raw)).decode()}\n"
        kind = "forged cosignature"
    else:  # the witness's genuine cosignature of the head of 3
        changed, kind = head_line, "replayed cosignature"
    superuser(
        (
            "UPDATE tenant_deletion_tombstonestamp SET stamp = %s WHERE tenant_id = %s",
            [changed, tenant_id],
        )
    )
    code, output = verify()
    assert code == 1, output
    assert f": {kind}: " in broken(output), output
    assert "the tombstone" in broken(output), output


def test_a_witness_down_at_the_purge_is_said_and_not_witnessed_past_the_grace(
    acme: Tenant, w1: RunningWitness
) -> None:
    w1.stop()
    tenant_id, err = _purge(acme)
    assert f"not cosigned by witness(es) {w1.name}" in err
    code, output = verify()  # within the grace: not yet a break
    assert code == 0, output
    tombstone = Tombstone.objects.get(tenant_id=tenant_id)
    later = dt.datetime.now(dt.UTC) + witness_client.WITNESS_GRACE * 2
    with scope.tenant_scope([tenant_id]):
        found = witness_client.tombstone_stamps_verify(
            tenant_id=tenant_id,
            note=tombstone.note,
            size=tombstone.size,
            signed_at=tombstone.signed_at,
            stamps=[],
            witnesses=[witness_client.witness_parse(w1.entry)],
            now=later,
        )
    assert found is not None and found.kind == "not witnessed", found


def test_the_app_role_may_not_write_tombstone_stamps(
    acme: Tenant, w1: RunningWitness
) -> None:
    tenant_id, _ = _purge(acme)
    app = connect_as("app")
    try:
        app.execute(
            "SELECT set_config('portal.tenant_ids', %s, false)", [str(tenant_id)]
        )
        assert app.execute(
            "SELECT count(*) FROM tenant_deletion_tombstonestamp"
        ).fetchone() == (1,)
        for sql in (
            "UPDATE tenant_deletion_tombstonestamp SET stamp = 'x'",
            "DELETE FROM tenant_deletion_tombstonestamp",
            "INSERT INTO tenant_deletion_tombstonestamp (id, tenant_id, signer, stamp,"
            " stamped_at) VALUES (gen_random_uuid(), "
            f"'{tenant_id}', 'w', 'x', now())",
        ):
            with (
                pytest.raises(psycopg.errors.InsufficientPrivilege),
                app.transaction(),
            ):
                app.execute(sql)
    finally:
        app.close()
