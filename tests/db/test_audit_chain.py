"""The event hash chain and its signed checkpoints catch tampering (RELIABILITY S09).

Each tamper test plays someone with the database's superuser: a raw connection,
triggers off (``session_replication_role = replica``) inside one transaction. The
verdict comes from ``manage.py verify_audit`` itself: its exit code and first line.
"""

from __future__ import annotations

import datetime as dt
import importlib
import io
import itertools
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import call_command
from django.db import connection, transaction
from psycopg.errors import IntegrityConstraintViolation

from audit import chain, checkpoints
from audit import services as audit_services
from audit.jobs import checkpoint_audit_job
from audit.models import Checkpoint, Event, EventCode
from portal import db_roles, ids
from portal.actors import Actor
from portal.models import Tenant
from tests.support.concurrency import run_in_threads
from tests.support.db import connect_as

pytestmark = pytest.mark.django_db(transaction=True)

ACTOR = Actor.system("chain-test")


def append(tenant: Tenant, task_id: uuid.UUID | None, n: int) -> None:
    with transaction.atomic():
        audit_services.event_append(
            tenant_id=tenant.pk,
            task_id=task_id,
            code=EventCode.TASK_TRANSITIONED if task_id else EventCode.TENANT_CHANGED,
            actor=ACTOR,
            data={"n": n, "note": "ünïcode ✓", "big": 2**60, "ratio": 0.1},
        )


@pytest.fixture
def trail(tenant: Tenant) -> dict[str, Any]:
    """Chain A (5 events), chain B (3) and the tenant chain (2), all checkpointed."""
    task_a, task_b = uuid.uuid4(), uuid.uuid4()
    for n in range(1, 6):
        append(tenant, task_a, n)
    for n in range(1, 4):
        append(tenant, task_b, n)
    for n in range(1, 3):
        append(tenant, None, n)
    call_command("checkpoint_audit", stdout=io.StringIO())
    return {"tenant": tenant, "a": task_a, "b": task_b}


def verify(tenant: Tenant) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("verify_audit", tenant=tenant.slug, stdout=out, stderr=out)
    except SystemExit as stop:
        return int(stop.code or 0), out.getvalue()
    return 0, out.getvalue()


def kind_of(output: str) -> str:
    """The break's kind from ``BROKEN tenant <slug>: <kind>: …``."""
    line = next(line for line in output.splitlines() if line.startswith("BROKEN"))
    return line.split(": ")[1]


@pytest.fixture
def superuser() -> Iterator[Callable[..., None]]:
    """Run statements as the superuser with triggers off, in one transaction."""
    raw = connect_as("admin")  # the tests' own connection is the app role's

    def run(*statements: tuple[str, list[Any]]) -> None:
        with raw.transaction():
            raw.execute("SET LOCAL session_replication_role = replica")
            for sql, params in statements:
                raw.execute(sql, params)

    yield run
    raw.close()


def event_at(task_id: uuid.UUID, seq: int) -> Event:
    return Event.objects.get(task_id=task_id, chain_seq=seq)


def test_an_untouched_trail_verifies(trail: dict[str, Any]) -> None:
    # given a trail of three chains, checkpointed
    # when it is verified
    code, output = verify(trail["tenant"])
    # then it passes and says what the window holds
    assert code == 0, output
    assert "10 events in 3 chains" in output
    assert "0 events after the last checkpoint" in output


def test_each_chain_is_linked_in_order(trail: dict[str, Any]) -> None:
    events = list(Event.objects.filter(task_id=trail["a"]).order_by("chain_seq"))
    assert [e.chain_seq for e in events] == [1, 2, 3, 4, 5]
    assert events[0].prev_hash is None
    for before, after in itertools.pairwise(events):
        assert after.prev_hash == before.hash
    tenant_chain = Event.objects.filter(tenant=trail["tenant"], task_id=None)
    assert [e.chain_seq for e in tenant_chain.order_by("chain_seq")] == [1, 2]


def test_altered_payload_is_detected(trail: dict[str, Any], superuser: Any) -> None:
    target = event_at(trail["a"], 3)
    superuser(
        (
            "UPDATE audit_event SET payload = jsonb_set(payload, '{n}', '99')"
            " WHERE id = %s",
            [target.pk],
        )
    )
    code, output = verify(trail["tenant"])
    assert code == 1
    assert kind_of(output) == "altered"
    assert str(target.pk) in output


@pytest.mark.parametrize(
    "column", ["actor_id", "code", "created_at", "trace_id", "reason_code"]
)
def test_every_hashed_column_is_covered(
    trail: dict[str, Any], superuser: Any, column: str
) -> None:
    target = event_at(trail["b"], 2)
    value = {
        "actor_id": "'someone-else'",
        "code": "'task.claimed'",
        "created_at": "created_at - interval '1 second'",
        "trace_id": "'0af7651916cd43dd8448eb211c80319c'",
        "reason_code": "'STALE_STATE'",
    }[column]
    superuser((f"UPDATE audit_event SET {column} = {value} WHERE id = %s", [target.pk]))
    code, output = verify(trail["tenant"])
    assert (code, kind_of(output)) == (1, "altered")


def test_deleted_middle_event_is_detected(
    trail: dict[str, Any], superuser: Any
) -> None:
    superuser(("DELETE FROM audit_event WHERE id = %s", [event_at(trail["a"], 3).pk]))
    code, output = verify(trail["tenant"])
    assert (code, kind_of(output)) == (1, "deleted")


def test_deleted_and_renumbered_event_is_detected(
    trail: dict[str, Any], superuser: Any
) -> None:
    # the attacker closes the gap in the numbers too
    superuser(
        ("DELETE FROM audit_event WHERE id = %s", [event_at(trail["a"], 2).pk]),
        (
            "UPDATE audit_event SET chain_seq = chain_seq - 1"
            " WHERE task_id = %s AND chain_seq > 2",
            [trail["a"]],
        ),
    )
    code, output = verify(trail["tenant"])
    assert (code, kind_of(output)) == (1, "deleted")


def _forged_row(tenant: Tenant, task_id: uuid.UUID) -> tuple[str, list[Any]]:
    return (
        "INSERT INTO audit_event (id, tenant_id, task_id, code, actor_type, actor_id,"
        " payload, trace_id, span_id, created_at)"
        " VALUES (%s, %s, %s, 'task.resolved', 'system', 'forger', '{}', '', '',"
        " now() - interval '1 hour')",
        [ids.new_id(), tenant.pk, task_id],
    )


def test_forged_row_without_a_link_is_detected(
    trail: dict[str, Any], superuser: Any
) -> None:
    superuser(_forged_row(trail["tenant"], trail["a"]))
    code, output = verify(trail["tenant"])
    assert (code, kind_of(output)) == (1, "inserted")


def test_forged_event_spliced_in_with_a_valid_hash_is_detected(
    trail: dict[str, Any], superuser: Any
) -> None:
    # given a forger who knows the hash format: a valid event linked after #2,
    # and the later events renumbered to make room
    tenant, task_id = trail["tenant"], trail["a"]
    second = event_at(task_id, 2)
    forged_id = ids.id_at(dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    created = "2026-01-01T00:00:00.000000Z"
    content = chain.event_content(
        event_id=forged_id, tenant_id=tenant.pk, task_id=task_id, operation_id=None,
        code="task.resolved", actor_type="system", actor_id="forger",
        reason_code=None, contract_key=None, contract_version=None, payload={},
        trace_id="", span_id="", created_at=created,
    )  # fmt: skip
    forged_hash = chain.event_hash(prev_hash=second.hash, content=content)
    superuser(
        (
            "UPDATE audit_event SET chain_seq = -chain_seq"
            " WHERE task_id = %s AND chain_seq > 2",
            [task_id],
        ),
        (
            "UPDATE audit_event SET chain_seq = 1 - chain_seq"
            " WHERE task_id = %s AND chain_seq < 0",
            [task_id],
        ),
        (
            "INSERT INTO audit_event (id, tenant_id, task_id, code, actor_type,"
            " actor_id, payload, trace_id, span_id, created_at, chain_seq, prev_hash,"
            " hash) VALUES (%s, %s, %s, 'task.resolved', 'system', 'forger', '{}',"
            " '', '', %s, 3, %s, %s)",
            [forged_id, tenant.pk, task_id, created, second.hash, forged_hash],
        ),
    )
    numbers = Event.objects.filter(task_id=task_id).order_by("chain_seq")
    assert list(numbers.values_list("chain_seq", flat=True)) == [1, 2, 3, 4, 5, 6]
    code, output = verify(tenant)
    assert (code, kind_of(output)) == (1, "inserted")


def test_swapped_events_are_detected(trail: dict[str, Any], superuser: Any) -> None:
    two, three = event_at(trail["a"], 2), event_at(trail["a"], 3)
    superuser(
        ("UPDATE audit_event SET chain_seq = -1 WHERE id = %s", [two.pk]),
        ("UPDATE audit_event SET chain_seq = 2 WHERE id = %s", [three.pk]),
        ("UPDATE audit_event SET chain_seq = 3 WHERE id = %s", [two.pk]),
    )
    code, output = verify(trail["tenant"])
    assert (code, kind_of(output)) == (1, "reordered")


def test_tail_cut_after_a_checkpoint_is_detected(
    trail: dict[str, Any], superuser: Any
) -> None:
    superuser(("DELETE FROM audit_event WHERE id = %s", [event_at(trail["a"], 5).pk]))
    code, output = verify(trail["tenant"])
    assert (code, kind_of(output)) == (1, "deleted")
    assert "signed up to #5" in output


def test_the_next_checkpoint_does_not_sign_over_a_cut_tail(
    trail: dict[str, Any], superuser: Any
) -> None:
    # given a chain cut below its signed head
    superuser(("DELETE FROM audit_event WHERE id = %s", [event_at(trail["a"], 5).pk]))
    # when the minute job runs again, and again after the chain grows past the cut
    call_command("checkpoint_audit", stdout=io.StringIO())
    append(trail["tenant"], trail["a"], 5)
    append(trail["tenant"], trail["a"], 6)
    call_command("checkpoint_audit", stdout=io.StringIO())
    # then no checkpoint signed the cut chain, and the break is still reported
    signed = Checkpoint.objects.filter(tenant=trail["tenant"], task_id=trail["a"])
    assert max(signed.values_list("head_seq", flat=True)) == 5
    code, output = verify(trail["tenant"])
    assert code == 1, output


def test_an_altered_signed_head_is_not_signed_over(
    trail: dict[str, Any], superuser: Any
) -> None:
    # given the signed head rewritten with a hash of its own (as a consistent
    # rewrite does), and the chain grown after it
    head = event_at(trail["a"], 5)
    superuser(
        (
            "UPDATE audit_event SET actor_id = 'mallory', hash = %s WHERE id = %s",
            ["f" * 64, head.pk],
        )
    )
    append(trail["tenant"], trail["a"], 6)
    # when the minute job runs
    call_command("checkpoint_audit", stdout=io.StringIO())
    # then it never signs this chain past the change
    signed = Checkpoint.objects.filter(tenant=trail["tenant"], task_id=trail["a"])
    assert max(signed.values_list("head_seq", flat=True)) == 5
    assert verify(trail["tenant"])[0] == 1


def test_tail_cut_before_the_next_checkpoint_is_the_window(
    trail: dict[str, Any], superuser: Any
) -> None:
    # given an event appended after the last checkpoint
    append(trail["tenant"], trail["a"], 6)
    code, output = verify(trail["tenant"])
    assert code == 0
    assert "1 events after the last checkpoint" in output
    # when it is cut before the next checkpoint, its chain's head row tells
    cut = event_at(trail["a"], 6)
    superuser(("DELETE FROM audit_event WHERE id = %s", [cut.pk]))
    code, output = verify(trail["tenant"])
    assert (code, kind_of(output)) == (1, "deleted")
    assert "ends at #5, its head row says #6" in output
    # but when the head row is moved back too, nothing can tell (the window)
    five = event_at(trail["a"], 5)
    superuser(
        (
            "UPDATE audit_chainhead SET head_seq = 5, head_event_id = %s,"
            " head_hash = %s WHERE task_id = %s",
            [five.pk, five.hash, trail["a"]],
        )
    )
    assert verify(trail["tenant"])[0] == 0


def test_consistent_rewrite_of_a_chain_is_detected(
    trail: dict[str, Any], superuser: Any
) -> None:
    # given an attacker who alters #3 and recomputes every hash after it (and the
    # payload digest of format v2)
    task_id = trail["a"]
    statements: list[tuple[str, list[Any]]] = []
    prev = event_at(task_id, 2).hash
    for seq in (3, 4, 5):
        event = event_at(task_id, seq)
        payload = {**event.payload, "n": 99} if seq == 3 else event.payload
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {chain.CREATED_AT_SQL.format(column='created_at')}"
                " FROM audit_event WHERE id = %s",
                [event.pk],
            )
            created = cursor.fetchone()[0]
        content = chain.event_content(
            event_id=event.pk, tenant_id=event.tenant_id, task_id=task_id,
            operation_id=None, code=event.code, actor_type=event.actor_type,
            actor_id=event.actor_id, reason_code=None, contract_key=None,
            contract_version=None, payload=payload, trace_id="", span_id="",
            created_at=created, payload_digest=chain.payload_digest(payload),
        )  # fmt: skip
        digest = chain.event_hash(prev_hash=prev, content=content)
        statements.append(
            (
                "UPDATE audit_event SET payload = %s::jsonb, payload_digest = %s,"
                " prev_hash = %s, hash = %s WHERE id = %s",
                [
                    audit_services.json_text(payload),
                    chain.payload_digest(payload),
                    prev,
                    digest,
                    event.pk,
                ],
            )
        )
        prev = digest
    superuser(*statements)
    code, output = verify(trail["tenant"])
    assert (code, kind_of(output)) == (1, "altered")
    assert "not the event and hash the checkpoint signed" in output


def test_a_whole_chain_removed_with_its_checkpoints_is_detected(
    trail: dict[str, Any], superuser: Any
) -> None:
    superuser(
        ("DELETE FROM audit_event WHERE task_id = %s", [trail["b"]]),
        ("DELETE FROM audit_checkpoint WHERE task_id = %s", [trail["b"]]),
    )
    code, output = verify(trail["tenant"])
    assert (code, kind_of(output)) == (1, "deleted")
    assert "signed count" in output


def test_checkpoint_with_a_changed_count_is_forged(
    trail: dict[str, Any], superuser: Any
) -> None:
    superuser(
        (
            "UPDATE audit_checkpoint SET event_count = event_count - 3"
            " WHERE tenant_id = %s",
            [trail["tenant"].pk],
        )
    )
    code, output = verify(trail["tenant"])
    assert (code, kind_of(output)) == (1, "forged checkpoint")


@pytest.mark.parametrize("claimed_key", ["own", "real"])
def test_checkpoint_signed_with_another_key_is_forged(
    trail: dict[str, Any], superuser: Any, claimed_key: str
) -> None:
    # given a forger's checkpoint claiming chain A ends at #3 (to cover a cut)
    forger = Ed25519PrivateKey.generate()
    real = checkpoints.signing_key()
    key_id = (
        checkpoints.key_id_of(forger.public_key())
        if claimed_key == "own"
        else real.key_id
    )
    third = event_at(trail["a"], 3)
    signed_at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
    fields: dict[str, Any] = {
        "tenant_id": trail["tenant"].pk,
        "task_id": trail["a"],
        "head_seq": 3,
        "head_event_id": third.pk,
        "head_hash": third.hash,
        "event_count": 8,
        "signed_at": signed_at,
        "key_id": key_id,
    }
    signature = forger.sign(checkpoints.signed_message(**fields)).hex()
    superuser(
        (
            "INSERT INTO audit_checkpoint (id, tenant_id, task_id, head_seq,"
            " head_event_id, head_hash, event_count, signed_at, key_id, signature)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            [uuid.uuid4(), *fields.values(), signature],
        ),
        (
            "DELETE FROM audit_event WHERE task_id = %s AND chain_seq > 3",
            [trail["a"]],
        ),
    )
    code, output = verify(trail["tenant"])
    assert (code, kind_of(output)) == (1, "forged checkpoint")


def test_checkpoints_are_append_only(trail: dict[str, Any]) -> None:
    """The app role holds no UPDATE or DELETE on them; as a superuser that lends it
    both, the trigger still refuses."""
    from django.db import ProgrammingError

    with pytest.raises(ProgrammingError) as caught, transaction.atomic():
        Checkpoint.objects.filter(tenant=trail["tenant"]).update(event_count=0)
    assert caught.value.__cause__.sqlstate == "42501"  # type: ignore[union-attr]
    with connect_as("admin") as conn:
        conn.execute("GRANT UPDATE, DELETE ON audit_checkpoint TO portal_app")
        conn.execute("SET LOCAL ROLE portal_app")
        conn.execute(  # the tenant's scope: row-level security shows the rows
            "SELECT set_config('portal.tenant_ids', %s, true)",
            [str(trail["tenant"].pk)],
        )
        for statement in (
            "UPDATE audit_checkpoint SET event_count = 0",
            "DELETE FROM audit_checkpoint",
        ):
            with (
                pytest.raises(IntegrityConstraintViolation) as refused,
                conn.transaction(),  # a savepoint
            ):
                conn.execute(statement)
            assert refused.value.diag.constraint_name == (
                "audit_checkpoint_append_only_trg"
            )
        conn.rollback()


def test_checkpoint_job_signs_only_moved_heads(trail: dict[str, Any]) -> None:
    # given everything checkpointed, then one more event on chain B
    before = Checkpoint.objects.count()
    assert checkpoint_audit_job() == {}
    append(trail["tenant"], trail["b"], 4)
    # when the job runs
    written = checkpoint_audit_job()
    # then it signs chain B's new head only, with the tenant's new count
    assert written == {str(trail["tenant"].pk): 1}
    newest = Checkpoint.objects.order_by("-signed_at").first()
    assert newest is not None
    assert (newest.task_id, newest.head_seq, newest.event_count) == (trail["b"], 4, 11)
    assert Checkpoint.objects.count() == before + 1
    assert verify(trail["tenant"])[0] == 0


def test_the_migration_backfill_chains_old_events(
    trail: dict[str, Any], superuser: Any
) -> None:
    # given events from before the chain (no links, no payload digests: format v1)
    # and no checkpoints, nor head rows (audit migration 0014 made them later), nor
    # transparency log (0021)
    superuser(
        ("DELETE FROM audit_treehead", []),
        ("DELETE FROM audit_logentry", []),
        ("DELETE FROM audit_checkpoint", []),
        ("DELETE FROM audit_chainhead", []),
        (
            "UPDATE audit_event SET chain_seq = NULL, prev_hash = NULL, hash = NULL,"
            " payload_digest = NULL",
            [],
        ),
    )
    # when the migration's backfill runs
    migration = importlib.import_module("audit.migrations.0009_event_hash_chain")
    with (  # as migrations run: as the owner
        db_roles.connected_as("default", db_roles.owner_url()),
        connection.schema_editor() as editor,
    ):
        migration.chain_existing_events(None, editor)
    call_command("checkpoint_audit", stdout=io.StringIO())
    # then the trail verifies as one written through event_append
    code, output = verify(trail["tenant"])
    assert code == 0, output


def test_parallel_appends_to_one_task_keep_one_line(tenant: Tenant) -> None:
    # given eight connections appending to one task's chain at once, holding no
    # task lock (the chain's own lock lines them up)
    task_id = uuid.uuid4()
    barrier = threading.Barrier(8, timeout=10)

    def write(n: int) -> Callable[[], None]:
        def run() -> None:
            barrier.wait()
            for i in range(5):
                append(tenant, task_id, n * 10 + i)

        return run

    outcomes = run_in_threads(*(write(n) for n in range(8)))
    assert not [o for o in outcomes if isinstance(o, BaseException)]
    # then the 40 events form one line and the trail verifies
    events = list(Event.objects.filter(task_id=task_id).order_by("chain_seq"))
    assert [e.chain_seq for e in events] == list(range(1, 41))
    assert all(b.prev_hash == a.hash for a, b in itertools.pairwise(events))
    call_command("checkpoint_audit", stdout=io.StringIO())
    assert verify(tenant)[0] == 0


def test_parallel_tenant_level_events_keep_one_line(tenant: Tenant) -> None:
    barrier = threading.Barrier(6, timeout=10)

    def write() -> None:
        barrier.wait()
        for i in range(4):
            append(tenant, None, i)

    outcomes = run_in_threads(*(write for _ in range(6)))
    assert not [o for o in outcomes if isinstance(o, BaseException)]
    events = list(
        Event.objects.filter(task_id=None, tenant=tenant).order_by("chain_seq")
    )
    assert [e.chain_seq for e in events] == list(range(1, 25))
    call_command("checkpoint_audit", stdout=io.StringIO())
    assert verify(tenant)[0] == 0
