"""Tenant deletion by the declared policy (tenant_deletion/, docs/tenant-deletion.md).

Every check runs over the model registry, not a hand-kept list: a model added later
with a ``tenant`` field is checked here without anyone editing this file, and the seed
must fill it or ``_assert_seeded`` fails.
"""

from __future__ import annotations

import datetime as dt
import io
import itertools
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.apps import apps
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import ProgrammingError, connection, transaction
from django.db.models import Model
from guardian.shortcuts import assign_perm

from audit import checkpoints, retention
from audit.models import (
    ChainHead,
    Checkpoint,
    Event,
    EventCode,
    LogEntry,
    Outbox,
    RetentionAnchor,
    RetentionPolicy,
    TreeHead,
)
from console.takeover_desk import comments as desk_comments
from limits.models import Budget, RateLimit
from policies import services as policy_services
from portal import db_roles
from portal import selectors as portal_selectors
from portal import services as portal_services
from portal.actors import Actor, ActorType
from portal.db import db_now
from portal.exceptions import TenantNotFound
from portal.models import (
    AgentGrant,
    AgentRequestWindow,
    EventsOnDelete,
    IdempotentRequest,
    IdempotentRequestState,
    Role,
    Tenant,
)
from portal.roles import ROLE_PERMISSIONS
from tasks import services as tasks_services
from tasks.models import (
    Approval,
    ApprovalDecision,
    Credential,
    Escalation,
    ObjectVersion,
    Operation,
    OperationState,
    Task,
    TaskState,
)
from tenant_deletion import services as deletion
from tenant_deletion.exceptions import (
    TenantAlreadyDeleted,
    TenantDeletionPolicyIncomplete,
)
from tenant_deletion.models import Tombstone
from tests.support.audit_events import append_at
from tests.support.contracts import customer_issue_spec
from tests.support.db import connect_as
from tests.support.tenancy import models_with_a_tenant_field, tenant_fingerprint

# The deletion runs on a connection as the operator, as ``manage.py delete_tenant``
# runs it; the data is committed for it to see.
pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM = Actor.system("delete_tenant")
SPEC = customer_issue_spec(fields=["email"], target="desk")
_serial = itertools.count(1)


def rows_of(tenant_id: uuid.UUID) -> dict[str, int]:
    """Row count per tenant-owned table for one tenant."""
    return {
        model._meta.db_table: model._base_manager.filter(tenant_id=tenant_id).count()
        for model in models_with_a_tenant_field()
    }


def every_table_count() -> dict[str, int]:
    """Row count of every table Django knows, tenant-owned or not."""
    return {
        model._meta.db_table: model._base_manager.count()
        for model in apps.get_models(include_auto_created=True)
        if not model._meta.proxy
    }


def object_permission_count(obj: Model) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT (SELECT count(*) FROM guardian_userobjectpermission
                    WHERE object_pk = %(pk)s)
                 + (SELECT count(*) FROM guardian_groupobjectpermission
                    WHERE object_pk = %(pk)s)
            """,
            {"pk": str(obj.pk)},
        )
        return cursor.fetchone()[0]


def tenant_delete(**kwargs: Any) -> deletion.TenantDeletionReport:
    """``deletion.tenant_delete`` on a connection as the operator role."""
    with db_roles.connected_as("default", db_roles.operator_url()):
        return deletion.tenant_delete(**kwargs)


def _assert_seeded(tenant: Tenant) -> None:
    empty = [table for table, n in rows_of(tenant.pk).items() if n == 0]
    assert not empty, f"extend populate() so these tables hold rows: {empty}"


@pytest.fixture
def populate(
    make_task: Callable[..., Task], make_operation: Callable[..., Operation]
) -> Callable[[Tenant], dict[str, Any]]:
    """Fill every tenant-owned table for a tenant, through the services mostly."""

    def fill(tenant: Tenant) -> dict[str, Any]:
        n = next(_serial)
        agent = portal_services.agent_create(tenant=tenant, name=f"agent-{n}")
        portal_services.agent_key_issue(agent=agent)
        user = User.objects.create_user(username=f"person-{n}")
        portal_services.membership_grant(tenant=tenant, user=user, role=Role.SUPPORT)
        with transaction.atomic():  # an open invitation, made as the console makes it
            portal_services.invitation_write(
                tenant=tenant,
                invited_by_id=user.pk,
                email=f"new-{n}@example.com",
                role=Role.REVIEWER,
                valid_s=3600,
            )
        AgentGrant.objects.create(
            tenant=tenant, agent=agent, action="create_ticket", target="desk"
        )
        actor = Actor.of_agent(agent)

        contract = tasks_services.contract_create(
            tenant=tenant, key="issue", spec=SPEC, publish=True
        )
        tasks_services.contract_create(tenant=tenant, key="issue", spec=SPEC)  # draft
        tasks_services.task_register(
            tenant=tenant,
            actor=actor,
            client_task_id=f"client-{n}",
            workflow_key="customer-issue",
            workflow_version="1",
            object_type="customer_issue",
            object_id=f"issue-{n}",
            object_version="1",
            contract_key="issue",
            contract_version=1,
        )
        task = tasks_services.task_claim_next(
            tenant=tenant, owner="worker-1", actor=actor
        )
        assert task is not None
        # The agent's limits: the reservation below charges both (limits/).
        RateLimit.objects.create(
            tenant=tenant, agent=agent, action="create_ticket", max_calls=10
        )
        Budget.objects.create(
            tenant=tenant, agent=agent, action="create_ticket", argument="n",
            max_total=10**6,
        )  # fmt: skip
        AgentRequestWindow.objects.create(
            tenant=tenant, agent=agent, window_start=db_now(), requests=1
        )
        reservation = tasks_services.operation_reserve(
            tenant=tenant,
            task_id=task.pk,
            lease_token=task.lease_token,
            idempotency_key=f"key-{n}",
            action="create_ticket",
            target="desk",
            input={"n": n},
            actor=actor,
        )
        expires_at = db_now() + dt.timedelta(hours=1)
        for revoked_at in (None, db_now()):
            Credential.objects.create(
                tenant=tenant,
                operation=reservation.operation,
                object_type="customer_issue",
                object_id=f"issue-{n}",
                fields=["email"],
                action="create_ticket",
                target="desk",
                secret_hash="0" * 64,
                expires_at=expires_at,
                revoked_at=revoked_at,
            )
        tasks_services.object_version_record(
            tenant=tenant,
            object_type="customer_issue",
            object_id=f"issue-{n}",
            version="7",
        )
        # Rows made by the shared fixtures too, in other states.
        make_operation(
            task=make_task(tenant=tenant, state=TaskState.RUNNING, leased=True),
            state=OperationState.VERIFIED,
        )
        IdempotentRequest.objects.create(
            tenant=tenant,
            agent=agent,
            key=f"request-{n}",
            fingerprint="0" * 64,
            state=IdempotentRequestState.COMPLETED,
            response_status=201,
            locked_until=expires_at,
            expires_at=expires_at,
        )
        tasks_services.connector_save(
            tenant=tenant, target="desk", values={"base_url": "https://desk-9.example/"}
        )
        Escalation.objects.create(
            tenant=tenant,
            task=task,
            operation=reservation.operation,
            reason_code="FIELD_STALE",
            evidence={"fields": ["email"]},
        )
        # A desk comment: append-only for the app role; the operator deletes it.
        desk_comments.desk_comment_add(task=task, user=user, body="called the customer")
        # A waiting approval with one person's decision: the deletion expires it
        # (a revocation) before the decision and the approval can go.
        approval = Approval.objects.create(
            tenant=tenant,
            operation=reservation.operation,
            input_hash=reservation.operation.input_hash,
            quorum=2,
            state="waiting",
        )
        ApprovalDecision.objects.create(
            tenant=tenant,
            approval=approval,
            person=user,
            verdict="approve",
            saw_digest="d" * 64,
        )
        group = Group.objects.create(name=f"reviewers-{n}")
        assign_perm("tasks.view_task", user, task)
        assign_perm("portal.view_tenant", user, tenant)
        assign_perm("tasks.view_contract", group, contract)
        RetentionPolicy.objects.create(tenant=tenant, event_months=12, payload_days=30)
        # A published policy set (its trigger lets only the operator delete it)
        # and a draft.
        permit_all = policy_services.policy_set_draft(
            tenant=tenant, text="permit(principal, action, resource);"
        )
        policy_services.policy_set_publish(
            tenant=tenant, version=permit_all.version, contract_specs=[SPEC]
        )
        policy_services.policy_set_draft(
            tenant=tenant, text="forbid(principal, action, resource);"
        )
        # A purge record and its anchor, written by audit_retention_purge (the
        # owner's; the app role may only read them) for an event past the policy.
        with connection.cursor() as cursor:
            # deferred foreign keys checked at once, as separate transactions
            # would: retention alters the partition they wait on
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        append_at(tenant, task.pk, dt.datetime.now(dt.UTC) - dt.timedelta(days=400), n)
        assert retention.tenant_events_purge(tenant_id=tenant.pk) == 1
        assert RetentionAnchor.objects.filter(tenant=tenant, task_id=task.pk).exists()
        checkpoints.tenant_checkpoint(
            tenant_id=tenant.pk, key=checkpoints.signing_key()
        )
        return {"task": task, "contract": contract}

    return fill


@pytest.fixture
def keep_tenant(make_tenant: Callable[..., Tenant]) -> Tenant:
    return make_tenant(events_on_delete=EventsOnDelete.KEEP)


@pytest.fixture
def purge_tenant(make_tenant: Callable[..., Tenant]) -> Tenant:
    return make_tenant(events_on_delete=EventsOnDelete.PURGE)


# --- The two policies ---------------------------------------------------------------


def test_keep_policy_empties_every_table_but_events_and_leaves_a_tombstone(
    keep_tenant, populate
):
    """Under "keep" only audit_event rows and the tenant row (tombstoned) remain."""
    # given a tenant with rows in every tenant-owned table
    populate(keep_tenant)
    _assert_seeded(keep_tenant)
    events_before = Event.objects.filter(tenant=keep_tenant).count()
    signed = Checkpoint.objects.filter(tenant=keep_tenant).count()
    heads = ChainHead.objects.filter(tenant=keep_tenant).count()
    tenant_chain_new = not ChainHead.objects.filter(
        tenant=keep_tenant, task_id=None
    ).exists()
    logged = LogEntry.objects.filter(tenant=keep_tenant).count()
    tree_heads = TreeHead.objects.filter(tenant=keep_tenant).count()

    # when it is deleted
    report = tenant_delete(tenant=keep_tenant, actor=SYSTEM)

    # then every tenant-owned table is empty for it, except the kept events and
    # the checkpoints, retention records and transparency log that vouch for them
    vouching = {
        "audit_retentionpurge": 1,
        "audit_retentionanchor": 1,
        "audit_logentry": logged,
        "audit_treehead": tree_heads,
    }
    left = {table: n for table, n in rows_of(keep_tenant.pk).items() if n}
    assert left == {
        "audit_event": events_before + 1,
        "audit_checkpoint": signed,
        # the chains go on: tenant.deleted moves (or starts) the tenant chain's head
        "audit_chainhead": heads + tenant_chain_new,
        **vouching,
    }
    keep_tenant.refresh_from_db()
    assert keep_tenant.deleted_at is not None
    assert report.kept == {
        "audit_event": events_before,
        "audit_checkpoint": signed,
        "audit_chainhead": heads,
        **vouching,
        "portal_tenant": 1,
    }
    assert "audit_event" not in report.deleted
    # and one tenant.deleted event records the counts, with no outbox row
    event = Event.objects.get(tenant=keep_tenant, code=EventCode.TENANT_DELETED)
    assert event.pk == report.event_id
    assert (event.actor_type, event.actor_id) == (ActorType.SYSTEM, "delete_tenant")
    assert event.payload["events_on_delete"] == "keep"
    assert {"table": "tasks_credential", "rows": 2} in event.payload["deleted"]
    assert {"table": "tasks_credential", "rows": 1} in event.payload["revoked"]
    assert not Outbox.objects.filter(event_id=event.pk).exists()
    # and the tenant is gone for every reader
    with pytest.raises(TenantNotFound):
        portal_selectors.tenant_get(tenant_id=keep_tenant.pk)


def test_purge_policy_empties_every_table_and_removes_the_tenant(
    purge_tenant, populate
):
    """Under "purge" no row of the tenant is left anywhere, the tenant row included,
    but its transparency log, which ends in a signed tombstone."""
    # given a tenant with rows in every tenant-owned table
    populate(purge_tenant)
    _assert_seeded(purge_tenant)
    events_before = Event.objects.filter(tenant=purge_tenant).count()
    tree_heads = TreeHead.objects.filter(tenant=purge_tenant).count()

    # when it is deleted
    report = tenant_delete(tenant=purge_tenant, actor=SYSTEM)

    # then nothing of it is left but the log: a leaf per event (those no run had
    # placed yet were placed under one more head) and the tombstone
    left = {table: n for table, n in rows_of(purge_tenant.pk).items() if n}
    log = {"audit_logentry": events_before, "audit_treehead": left["audit_treehead"]}
    assert left == log
    assert left["audit_treehead"] - tree_heads in (0, 1)
    assert not Tenant.objects.filter(pk=purge_tenant.pk).exists()
    assert report.kept == {**log, "tenant_deletion_tombstone": 1}
    tombstone = Tombstone.objects.get(tenant_id=purge_tenant.pk)
    assert (tombstone.slug, tombstone.size) == (purge_tenant.slug, events_before)
    assert report.deleted["audit_event"] == events_before
    assert report.deleted["portal_tenant"] == 1
    assert report.event_id is None


@pytest.mark.parametrize("policy", EventsOnDelete.values)
def test_another_tenants_rows_are_untouched(make_tenant, populate, policy):
    """Every tenant-owned table holds exactly the other tenant's rows, unchanged."""
    # given two populated tenants
    doomed = make_tenant(events_on_delete=policy)
    bystander = make_tenant(events_on_delete=policy)
    populate(doomed)
    kept = populate(bystander)
    _assert_seeded(bystander)
    before = tenant_fingerprint(bystander.pk)
    permissions = object_permission_count(kept["task"])

    # when one is deleted
    tenant_delete(tenant=doomed, actor=SYSTEM)

    # then the other's rows, contents and object permissions are as they were
    assert tenant_fingerprint(bystander.pk) == before
    assert object_permission_count(kept["task"]) == permissions == 1
    assert object_permission_count(kept["contract"]) == 1


def test_object_permissions_on_the_tenant_and_its_objects_go(keep_tenant, populate):
    """Guardian grants have no foreign key; the deletion finds them by object."""
    seeded = populate(keep_tenant)
    assert object_permission_count(seeded["task"]) == 1

    report = tenant_delete(tenant=keep_tenant, actor=SYSTEM)

    assert object_permission_count(seeded["task"]) == 0
    assert object_permission_count(seeded["contract"]) == 0
    assert object_permission_count(keep_tenant) == 0
    # the two granted by hand, and those the support membership carries on the tenant
    assert report.deleted["guardian_userobjectpermission"] == 2 + len(
        ROLE_PERMISSIONS[Role.SUPPORT]
    )
    assert report.deleted["guardian_groupobjectpermission"] == 1


def test_revocation_comes_first_and_counts_only_live_grants(keep_tenant, populate):
    """The report lists revocations first; an already revoked credential is not one."""
    populate(keep_tenant)

    report = tenant_delete(tenant=keep_tenant, actor=SYSTEM)

    assert report.revoked == {
        "tasks_credential": 1,
        "tasks_approval": 1,
        "portal_agentkey": 1,
        "portal_agent": 1,
    }
    assert list(report.deleted)[:2] == [
        "guardian_userobjectpermission",
        "guardian_groupobjectpermission",
    ]
    assert list(report.deleted)[2:] == [
        m._meta.db_table for m in deletion.DELETION_ORDER
    ]


def test_the_report_names_every_tenant_owned_table(make_tenant, populate):
    """Each registry table appears in the report, deleted or kept."""
    for policy in EventsOnDelete.values:
        tenant = make_tenant(events_on_delete=policy)
        populate(tenant)
        report = tenant_delete(tenant=tenant, actor=SYSTEM, dry_run=True)
        named = set(report.deleted) | set(report.kept)
        assert {m._meta.db_table for m in models_with_a_tenant_field()} <= named


def test_the_purge_function_refuses_a_tenant_already_deleted(keep_tenant, populate):
    """The owner's purge function refuses what a tenant deletion would not do:
    a kept tenant's trail stays, even for the operator."""
    populate(keep_tenant)
    tenant_delete(tenant=keep_tenant, actor=SYSTEM)
    kept = Event.objects.filter(tenant=keep_tenant).count()
    assert kept > 0
    with connect_as("operator") as operator:
        operator.execute(
            "SELECT set_config('portal.tenant_ids', %s, true)", [str(keep_tenant.pk)]
        )
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as caught:
            operator.execute(
                "SELECT * FROM tenant_deletion_purge(%s)", [keep_tenant.pk]
            )
    assert "gone or deleted" in str(caught.value)
    assert Event.objects.filter(tenant=keep_tenant).count() == kept


def test_on_the_app_roles_connection_the_deletion_is_refused_whole(
    purge_tenant, populate
):
    """Only the operator may delete what the trail, the desk's comments and the
    published rules hold; the app role is refused at the first such table, and
    nothing else went either.

    The first wall it meets is the desk comments' table: comments are append-only,
    so the app role has no DELETE privilege on it at all (docs/database-roles.md),
    even for a tenant without comments. Behind it stand the published policy set's
    guard (only the operator deletes one; tests/db/test_policy_sets.py) and the purge
    function, whose EXECUTE is refused to the app role (42501;
    tests/db/test_trail_erasure.py).
    """
    populate(purge_tenant)
    before = tenant_fingerprint(purge_tenant.pk)
    with pytest.raises(ProgrammingError) as refused:
        deletion.tenant_delete(tenant=purge_tenant, actor=SYSTEM)
    assert isinstance(refused.value.__cause__, psycopg.errors.InsufficientPrivilege)
    assert "console_deskcomment" in str(refused.value)
    assert tenant_fingerprint(purge_tenant.pk) == before


def test_a_forgotten_model_stops_the_deletion(keep_tenant, populate, monkeypatch):
    """A tenant-owned table missing from the policy refuses the whole deletion."""
    populate(keep_tenant)
    before = tenant_fingerprint(keep_tenant.pk)
    forgetful = tuple(m for m in deletion.DELETION_ORDER if m is not ObjectVersion)
    monkeypatch.setattr(deletion, "DELETION_ORDER", forgetful)

    with pytest.raises(TenantDeletionPolicyIncomplete) as caught:
        tenant_delete(tenant=keep_tenant, actor=SYSTEM)

    assert caught.value.context == {"tables": ["tasks_objectversion"]}
    assert tenant_fingerprint(keep_tenant.pk) == before


# --- Dry run ------------------------------------------------------------------------


@pytest.mark.parametrize("policy", EventsOnDelete.values)
def test_dry_run_changes_nothing_and_prints_the_counts(make_tenant, populate, policy):
    """``--dry-run`` leaves every table as it was and prints per-table counts."""
    tenant = make_tenant(events_on_delete=policy)
    populate(tenant)
    before = tenant_fingerprint(tenant.pk)
    tables_before = every_table_count()
    out = io.StringIO()

    call_command("delete_tenant", tenant.slug, "--dry-run", stdout=out)

    assert tenant_fingerprint(tenant.pk) == before
    assert every_table_count() == tables_before
    text = out.getvalue()
    assert "Dry run: nothing was changed." in text
    assert f"3. events ({policy}):" in text
    credentials = Credential.objects.filter(tenant=tenant).count()
    tasks = Task.objects.filter(tenant=tenant).count()
    assert _line(text, "Would revoke", "tasks_credential") == credentials - 1
    assert _line(text, "Would delete", "tasks_task") == tasks
    section = "Would keep" if policy == EventsOnDelete.KEEP else "Would delete"
    assert (
        _line(text, section, "audit_event")
        == Event.objects.filter(tenant=tenant).count()
    )


def _line(text: str, section: str, table: str) -> int:
    """The count printed for ``table`` under the ``section:`` heading."""
    lines = text.splitlines()
    start = lines.index(f"{section}:") + 1
    for line in lines[start:]:
        if not line.startswith("  "):
            break
        name, count = line.split()
        if name == table:
            return int(count)
    raise AssertionError(f"{table} not under {section!r}:\n{text}")


@pytest.mark.parametrize("policy", EventsOnDelete.values)
def test_the_dry_run_predicts_the_real_deletion(make_tenant, populate, policy):
    """The counts of a dry run equal what the real run then revokes, deletes, keeps."""
    tenant = make_tenant(events_on_delete=policy)
    populate(tenant)

    preview = tenant_delete(tenant=tenant, actor=SYSTEM, dry_run=True)
    report = tenant_delete(tenant=tenant, actor=SYSTEM)

    assert preview.dry_run
    assert not report.dry_run
    assert preview.event_id is None
    assert (preview.revoked, preview.deleted, preview.kept) == (
        report.revoked,
        report.deleted,
        report.kept,
    )


# --- The command --------------------------------------------------------------------


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_command_refuses_without_yes_when_stdin_is_not_a_terminal(
    keep_tenant, populate
):
    """No TTY and no ``--yes``: refused, with the way out in the message."""
    populate(keep_tenant)
    before = tenant_fingerprint(keep_tenant.pk)

    with pytest.raises(CommandError, match="--yes"):
        call_command(
            "delete_tenant", keep_tenant.slug, stdin=io.StringIO(), stdout=io.StringIO()
        )

    assert tenant_fingerprint(keep_tenant.pk) == before


def test_the_command_deletes_once_the_slug_is_typed(keep_tenant, populate):
    """On a terminal the operator confirms by typing the slug."""
    populate(keep_tenant)
    out = io.StringIO()

    call_command(
        "delete_tenant",
        keep_tenant.slug,
        stdin=FakeTty(keep_tenant.slug + "\n"),
        stdout=out,
    )

    keep_tenant.refresh_from_db()
    assert keep_tenant.deleted_at is not None
    text = out.getvalue()
    assert "Would delete:" in text  # the preview shown before the question
    assert "Deleted:" in text
    assert f"Tenant {keep_tenant.slug!r} deleted; events kept" in text


def test_the_command_refuses_a_mistyped_confirmation(purge_tenant, populate):
    populate(purge_tenant)
    before = tenant_fingerprint(purge_tenant.pk)

    with pytest.raises(CommandError, match="did not match"):
        call_command(
            "delete_tenant",
            purge_tenant.slug,
            stdin=FakeTty("something-else\n"),
            stdout=io.StringIO(),
        )

    assert tenant_fingerprint(purge_tenant.pk) == before


def test_the_command_with_yes_deletes_and_prints_what_went(purge_tenant, populate):
    populate(purge_tenant)
    out = io.StringIO()

    call_command("delete_tenant", purge_tenant.slug, "--yes", stdout=out)

    assert not Tenant.objects.filter(pk=purge_tenant.pk).exists()
    assert _line(out.getvalue(), "Deleted", "portal_tenant") == 1
    assert "Kept:\n" in out.getvalue()
    assert _line(out.getvalue(), "Kept", "tenant_deletion_tombstone") == 1
    assert _line(out.getvalue(), "Kept", "audit_logentry") > 0


def test_an_unknown_slug_is_a_clear_error(db):
    with pytest.raises(CommandError, match="No tenant with slug 'nobody'"):
        call_command("delete_tenant", "nobody", "--yes", stdout=io.StringIO())


# --- Deleting twice -----------------------------------------------------------------


def test_deleting_an_already_deleted_tenant_errors(keep_tenant, populate):
    """A tombstone cannot be deleted again, by the service or the command."""
    populate(keep_tenant)
    tenant_delete(tenant=keep_tenant, actor=SYSTEM)
    events = Event.objects.filter(tenant=keep_tenant).count()

    with pytest.raises(TenantAlreadyDeleted):
        tenant_delete(tenant=keep_tenant, actor=SYSTEM)
    with pytest.raises(TenantAlreadyDeleted):
        tenant_delete(tenant=keep_tenant, actor=SYSTEM, dry_run=True)
    with pytest.raises(CommandError, match="already deleted"):
        call_command("delete_tenant", keep_tenant.slug, "--yes", stdout=io.StringIO())

    assert Event.objects.filter(tenant=keep_tenant).count() == events


def test_a_purged_tenant_is_not_found_again(purge_tenant):
    tenant_delete(tenant=purge_tenant, actor=SYSTEM)

    with pytest.raises(TenantNotFound):
        tenant_delete(tenant=purge_tenant, actor=SYSTEM)
