"""Tenant deletion: the one privileged purge path (docs/tenant-deletion.md).

The audit trail is append-only and published contract versions are immutable
(docs/architecture.md, invariants 5 and 8); their triggers let a row go only when the
current user owns the table. Nobody who runs the portal owns anything: a deletion
removes those rows through the owner's ``SECURITY DEFINER`` function
``tenant_deletion_purge`` (this package's migration 0001), which only the operator
role may execute. ``tenant_delete`` therefore runs on a connection as the operator
(``manage.py delete_tenant`` opens it); on the app role's it is refused. The
function deletes the tenant's published contracts once its tasks are gone and then,
by the tenant's ``events_on_delete`` (which the app role cannot change), either
purges the trail together with the tenant row or marks the row deleted. A purge
keeps the tenant's transparency log, which ends in a tombstone signed here first
(the function refuses to purge without it).

The policy is declared once, here, as data: what is revoked, in which order tables are
emptied, and what happens to events. ``tenant_delete`` refuses to run when the model
registry holds a tenant-owned table that the policy does not name, so a new model
cannot be left behind silently.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import httpx
from django.apps import apps
from django.db import IntegrityError, connection, transaction
from django.db.backends.utils import CursorWrapper
from django.db.models import Model
from guardian.utils import get_group_obj_perms_model, get_user_obj_perms_model

from audit import checkpoints, merkle, payloads, tlog, witness_client
from audit import services as audit_services
from audit.models import (
    ChainHead,
    Checkpoint,
    Event,
    EventCode,
    LogEntry,
    Outbox,
    RetentionAnchor,
    RetentionPolicy,
    RetentionPurge,
    TreeHead,
)
from console.models import DeskComment
from limits.models import Budget, LimitUsage, RateLimit
from policies.models import PolicySet
from portal import db as portal_db
from portal.actors import Actor
from portal.exceptions import TenantNotFound
from portal.models import (
    Agent,
    AgentGrant,
    AgentKey,
    AgentRequestWindow,
    EventsOnDelete,
    IdempotentRequest,
    Invitation,
    Membership,
    Tenant,
)
from routing.models import (
    Assignment,
    Group,
    GroupMember,
    Notification,
    RoutingRule,
    Webhook,
)
from tasks.models import (
    Approval,
    ApprovalDecision,
    Connector,
    Contract,
    Credential,
    Escalation,
    ObjectVersion,
    Operation,
    Task,
)

from .exceptions import TenantAlreadyDeleted, TenantDeletionPolicyIncomplete
from .models import Tombstone, TombstoneStamp

# Step a: grants die first. Inside one transaction the order is not visible from
# outside, but it takes the row locks on keys and credentials before anything else,
# and if deletion is ever split into batches no grant can outlive the data it opens.
# (model, SET clause, "still live" predicate); the predicate also counts for reports.
REVOCATIONS: Final[tuple[tuple[type[Model], str, str], ...]] = (
    (Credential, "revoked_at = app_now()", "revoked_at IS NULL"),
    (
        Approval,
        "state = 'expired', decided_at = app_now()",
        "state IN ('waiting', 'approved')",
    ),
    (AgentKey, "revoked_at = app_now()", "revoked_at IS NULL"),
    (Agent, "is_active = false", "is_active"),
)

# Step b: children before parents. The composite foreign keys are NOT DEFERRABLE, so
# a parent row cannot go while a child still points at it, even inside one
# transaction. Events are not here: step c decides about them.
DELETION_ORDER: Final[tuple[type[Model], ...]] = (
    Credential,  # -> operation
    ApprovalDecision,  # -> approval
    Approval,  # -> operation
    Escalation,  # -> task, operation
    DeskComment,  # -> task; the operator's DELETE (comments are append-only)
    Notification,  # routing: e-mails and webhook posts, sent or not
    Assignment,  # -> group
    RoutingRule,  # -> group
    GroupMember,  # -> group
    Webhook,
    Group,
    Outbox,  # -> event
    RetentionPolicy,
    Operation,  # -> task
    Task,  # -> contract (key, version)
    ObjectVersion,
    Connector,  # holds the tenant's signing keys: gone with the tenant
    Contract,  # published and retired versions: the purge function deletes them
    PolicySet,  # published ones too: their trigger lets the operator delete
    Invitation,  # open ones too: a link of a deleted tenant opens nothing
    Membership,
    AgentGrant,  # -> agent
    IdempotentRequest,  # -> agent; stored API answers of the tenant's agents
    LimitUsage,  # -> rate limit, budget
    RateLimit,  # -> agent
    Budget,  # -> agent
    AgentRequestWindow,  # -> agent
    AgentKey,  # -> agent
    Agent,
)
# What only the owner's ``tenant_deletion_purge`` deletes (the operator runs it).
_PRIVILEGED: Final[frozenset[type[Model]]] = frozenset(
    {
        Contract,
        Event,
        Checkpoint,
        RetentionPurge,
        RetentionAnchor,
        ChainHead,
        Tenant,
    }
)
# What vouches for the events (checkpoints, retention's purge records and anchors)
# goes or stays with them, and so do the chains' head rows (a kept tenant's chain
# goes on with ``tenant.deleted``).
_WITH_EVENTS: Final[tuple[type[Model], ...]] = (
    ChainHead,
    Checkpoint,
    RetentionAnchor,
    RetentionPurge,
)
# The transparency log's leaves (event hashes) and signed heads stay in either
# case: under ``purge`` the log ends in a signed tombstone (``Tombstone``), so a
# proof given out before the purge can still be checked against it.
_LOG: Final[tuple[type[Model], ...]] = (LogEntry, TreeHead)


@dataclass(frozen=True, kw_only=True)
class TenantDeletionReport:
    """What a tenant deletion revoked, deleted and kept, as row counts per table.

    With ``dry_run`` the counts are what would be revoked, deleted and kept; nothing
    was changed. ``event_id`` is the appended ``tenant.deleted`` event (keep policy,
    real run only); it is not counted in ``kept``.
    """

    tenant_id: uuid.UUID
    slug: str
    events_on_delete: str
    dry_run: bool
    revoked: Mapping[str, int]
    deleted: Mapping[str, int]
    kept: Mapping[str, int]
    event_id: uuid.UUID | None = None

    def event_data(self) -> payloads.TenantDeleted:
        """The counts as an event payload.

        Tables are values, not keys: the redaction policy blanks any value under a
        key that looks sensitive, and ``tasks_credential`` would be one.
        """

        def rows(counts: Mapping[str, int]) -> list[payloads.TableRows]:
            return [{"table": table, "rows": n} for table, n in counts.items()]

        return {
            "slug": self.slug,
            "events_on_delete": self.events_on_delete,
            "revoked": rows(self.revoked),
            "deleted": rows(self.deleted),
            "kept": rows(self.kept),
        }


def tenant_owned_models() -> list[type[Model]]:
    """Every installed model with a foreign key to ``Tenant``, from the registry.

    Proxy models (the takeover desk's ``console.TakeoverItem``) are left out: they
    share their concrete model's table, which the policy already covers.
    """
    return [
        model
        for model in apps.get_models()
        if not model._meta.proxy
        and any(
            field.many_to_one and field.related_model is Tenant
            for field in model._meta.concrete_fields
        )
    ]


def _tenant_column(model: type[Model]) -> str:
    for field in model._meta.concrete_fields:
        if field.many_to_one and field.related_model is Tenant:
            return str(field.column)
    raise TenantDeletionPolicyIncomplete(table=model._meta.db_table)


def _object_permission_models() -> tuple[type[Model], ...]:
    """django-guardian's generic object-permission tables (users, then groups)."""
    return (get_user_obj_perms_model(), get_group_obj_perms_model())


def _check_policy_covers_registry() -> None:
    covered = {*DELETION_ORDER, Event, *_WITH_EVENTS, *_LOG}
    missing = [m for m in tenant_owned_models() if m not in covered]
    if missing:
        raise TenantDeletionPolicyIncomplete(
            tables=sorted(model._meta.db_table for model in missing)
        )


@dataclass(frozen=True, kw_only=True)
class _Purge:
    """One tenant's statements: counted on a dry run, executed otherwise."""

    cursor: CursorWrapper
    tenant_id: uuid.UUID
    dry_run: bool

    def _count(self, sql: str, params: Mapping[str, Any]) -> int:
        self.cursor.execute(sql, params)
        row = self.cursor.fetchone()
        return int(row[0]) if row else 0

    def _rows_where(self, model: type[Model]) -> tuple[str, str]:
        return model._meta.db_table, f"{_tenant_column(model)} = %(tenant)s"

    def revoke(self, model: type[Model], assignment: str, live: str) -> int:
        table, where = self._rows_where(model)
        params = {"tenant": self.tenant_id}
        if self.dry_run:
            return self._count(
                f"SELECT count(*) FROM {table} WHERE {where} AND {live}", params
            )
        self.cursor.execute(
            f"UPDATE {table} SET {assignment} WHERE {where} AND {live}", params
        )
        return self.cursor.rowcount

    def count(self, model: type[Model]) -> int:
        table, where = self._rows_where(model)
        return self._count(
            f"SELECT count(*) FROM {table} WHERE {where}", {"tenant": self.tenant_id}
        )

    def delete(self, model: type[Model]) -> int:
        """Delete the tenant's rows of ``model``; a privileged table is only
        counted here (``privileged`` deletes it, at the end)."""
        if self.dry_run or model in _PRIVILEGED:
            return self.count(model)
        table, where = self._rows_where(model)
        self.cursor.execute(
            f"DELETE FROM {table} WHERE {where}", {"tenant": self.tenant_id}
        )
        return self.cursor.rowcount

    def privileged(self) -> dict[str, int]:
        """The owner's function, run by the operator: published contracts, then
        the trail with the tenant row (``purge``) or the tombstone (``keep``).

        Rows deleted per table, as the function reports them; nothing on a dry run.
        """
        if self.dry_run:
            return {}
        self.cursor.execute(
            "SELECT relation, deleted FROM tenant_deletion_purge(%(tenant)s)",
            {"tenant": self.tenant_id},
        )
        return {str(table): int(rows) for table, rows in self.cursor.fetchall()}

    def delete_object_permissions(self, permission_model: type[Model]) -> int:
        """Guardian grants on the tenant and on every object it owns.

        They point at their object through (content type, text pk) with no foreign
        key, so they are found through the objects and must go while those exist.
        """
        owned = [
            "SELECT %(tenant_app)s::text, %(tenant_model)s::text, %(tenant)s::text"
        ] + [
            f"SELECT '{m._meta.app_label}', '{m._meta.model_name}', "
            f"{m._meta.pk.column}::text FROM {m._meta.db_table} "
            f"WHERE {_tenant_column(m)} = %(tenant)s"
            for m in tenant_owned_models()
        ]
        matches = f"""
            FROM {permission_model._meta.db_table} p
            JOIN django_content_type ct ON ct.id = p.content_type_id
            JOIN ({" UNION ALL ".join(owned)}) AS o (app_label, model, object_pk)
              ON (ct.app_label, ct.model, p.object_pk)
               = (o.app_label, o.model, o.object_pk)
        """
        params: dict[str, Any] = {
            "tenant": self.tenant_id,
            "tenant_app": Tenant._meta.app_label,
            "tenant_model": Tenant._meta.model_name,
        }
        if self.dry_run:
            return self._count(f"SELECT count(*) {matches}", params)
        pk = permission_model._meta.pk.column
        self.cursor.execute(
            f"""
            DELETE FROM {permission_model._meta.db_table} WHERE {pk} IN (
                SELECT p.{pk} {matches}
            )
            """,
            params,
        )
        return self.cursor.rowcount


def _tombstone_sign(
    *,
    cursor: CursorWrapper,
    tenant_id: uuid.UUID,
    slug: str,
    key: checkpoints.SigningKey,
) -> Tombstone:
    """End the tenant's log in a signed tombstone (docs/tenant-deletion.md).

    Under the checkpoint job's tenant lock (waiting for a run in progress), the
    events no leaf names yet get their places and a signed head, as the job would
    give them (``tree_head_sign``); the tombstone is then the note of that last
    head (size and root) with the tombstone line, signed by the same key. The
    purge function refuses to purge without it.
    """
    # The lock tenant_checkpoint takes (audit/checkpoints.py): one log writer.
    cursor.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
        [f"audit.checkpoint:{tenant_id}"],
    )
    checkpoints.tree_head_sign(tenant_id=tenant_id, key=key)
    head = TreeHead.objects.filter(tenant_id=tenant_id).order_by("-size").first()
    size, root = (
        (head.size, bytes.fromhex(head.root_hash)) if head else (0, merkle.EMPTY_ROOT)
    )
    body = tlog.checkpoint_body(
        origin=tlog.origin_of(tenant_id),
        size=size,
        root=root,
        extensions=[tlog.TOMBSTONE_LINE],
    )
    cursor.execute("SELECT clock_timestamp()")
    (signed_at,) = cursor.fetchone()
    return Tombstone.objects.create(
        tenant_id=tenant_id,
        slug=slug,
        size=size,
        root_hash=root.hex(),
        note=checkpoints.tree_note_sign(body=body, key=key),
        key_id=key.key_id,
        signed_at=signed_at,
    )


def _tenant_lock(*, cursor: CursorWrapper, tenant_id: uuid.UUID) -> tuple[str, str]:
    """Lock the tenant row; its (slug, events_on_delete) as they are now.

    The lock conflicts with the key-share lock every foreign-key check takes, so a
    child row written concurrently cannot commit before this transaction ends; see
    "Limits" in docs/tenant-deletion.md for what happens to it then.
    """
    cursor.execute(
        """
        SELECT slug, events_on_delete, deleted_at FROM portal_tenant
        WHERE id = %s FOR UPDATE
        """,
        [tenant_id],
    )
    row = cursor.fetchone()
    if row is None:  # purged before: the row itself is gone
        raise TenantNotFound(tenant_id=str(tenant_id))
    slug, events_on_delete, deleted_at = row
    if deleted_at is not None:
        raise TenantAlreadyDeleted(slug=slug, deleted_at=deleted_at.isoformat())
    return slug, events_on_delete


@portal_db.translate_integrity_errors
@transaction.atomic(durable=True)
def tenant_delete(
    *,
    tenant: Tenant,
    actor: Actor,
    dry_run: bool = False,
    key: checkpoints.SigningKey | None = None,
) -> TenantDeletionReport:
    """Delete a tenant by the declared policy, in one transaction (all or nothing).

    Order: lock the tenant row; (a) revoke credentials and agent keys and deactivate
    agents; (b) delete object permissions, then every tenant-owned table, children
    before parents; (c) events by ``tenant.events_on_delete``: ``keep`` keeps them,
    appends one ``tenant.deleted`` event (no outbox row) and marks the tenant row
    deleted; ``purge`` signs the tombstone of the tenant's transparency log
    (``key``, by default the configured audit signing key), deletes the events and
    then the tenant row, and keeps the log.

    Guarantee: with ``dry_run`` only counts are read (the tenant row is still locked
    for a consistent answer) and nothing changes. Published contracts, the trail and
    the tenant row go, or the row is marked deleted, through the owner's purge
    function alone, which only the operator role may execute: call this on a
    connection as the operator (``db_roles.connected_as("default",
    db_roles.operator_url())``, as ``manage.py delete_tenant`` does).

    Raises:
        SigningKeyMissing: a purge, and no audit signing key is configured;
            nothing was changed.
        TenantAlreadyDeleted: the tenant row is a tombstone already.
        TenantNotFound: the tenant row is gone (purged before).
        TenantDeletionPolicyIncomplete: a tenant-owned model is not in the policy;
            nothing was changed.
    """
    _check_policy_covers_registry()
    with connection.cursor() as cursor:
        slug, events_on_delete = _tenant_lock(cursor=cursor, tenant_id=tenant.pk)
        purge = _Purge(cursor=cursor, tenant_id=tenant.pk, dry_run=dry_run)

        revoked = {
            model._meta.db_table: purge.revoke(model, assignment, live)
            for model, assignment, live in REVOCATIONS
        }

        deleted = {
            model._meta.db_table: purge.delete_object_permissions(model)
            for model in _object_permission_models()
        }
        for model in DELETION_ORDER:
            deleted[model._meta.db_table] = purge.delete(model)

        kept: dict[str, int] = {}
        if events_on_delete == EventsOnDelete.PURGE:
            if not dry_run:
                _tombstone_sign(
                    cursor=cursor,
                    tenant_id=tenant.pk,
                    slug=slug,
                    key=key or checkpoints.signing_key(),
                )
            deleted[Event._meta.db_table] = purge.delete(Event)
            # The checkpoints and purge records vouch for the events: they go too.
            for model in _WITH_EVENTS:
                deleted[model._meta.db_table] = purge.delete(model)
            deleted[Tenant._meta.db_table] = 1
            for model in _LOG:
                kept[model._meta.db_table] = purge.count(model)
            kept[Tombstone._meta.db_table] = 1
        else:
            kept[Event._meta.db_table] = purge.count(Event)
            for model in (*_WITH_EVENTS, *_LOG):
                kept[model._meta.db_table] = purge.count(model)
            kept[Tenant._meta.db_table] = 1
        # Counted above in the report's order; the function's own counts win.
        deleted.update(purge.privileged())

        report = TenantDeletionReport(
            tenant_id=tenant.pk,
            slug=slug,
            events_on_delete=events_on_delete,
            dry_run=dry_run,
            revoked=revoked,
            deleted=deleted,
            kept=kept,
        )
        if dry_run or events_on_delete == EventsOnDelete.PURGE:
            return report
        # The tenant's outbox has just been emptied and nobody downstream acts for
        # a deleted tenant: the fact goes into the trail only.
        # The function has marked the tenant row deleted already.
        event_id = audit_services.event_append(
            tenant_id=tenant.pk,
            code=EventCode.TENANT_DELETED,
            actor=actor,
            data=report.event_data(),
            publish=False,
        )
    return dataclasses.replace(report, event_id=event_id)


def tombstone_witness(*, tenant_id: uuid.UUID) -> list[str]:
    """After the purge committed: the tenant's tombstone to each configured witness
    (``PORTAL_AUDIT_WITNESSES``), each cosignature stored (``TombstoneStamp``).

    The tombstone goes as the log's last checkpoint, with a consistency proof from
    the last head that witness cosigned (``witness_client.note_cosign``): the
    witness's state for the tenant's origin then is the tombstone, a copy of the
    purge outside the portal's database. Call as the operator, in the tenant's
    scope, outside any transaction (HTTP). Safe to repeat: a witness whose
    cosignature is stored is not asked again. Returns the names of the configured
    witnesses that did not cosign (down, refused: logged).

    Raises:
        Tombstone.DoesNotExist: the tenant was not purged.
    """
    portal_db.forbid_transaction("the witnesses are asked over HTTP")
    tombstone = Tombstone.objects.get(tenant_id=tenant_id)
    have = set(
        TombstoneStamp.objects.filter(tombstone=tombstone).values_list(
            "signer", flat=True
        )
    )
    missing = []
    with httpx.Client() as client:
        for config in witness_client.configured():
            if config.name in have:
                continue
            cosigned = witness_client.note_cosign(
                tenant_id=tenant_id,
                note=tombstone.note,
                size=tombstone.size,
                config=config,
                client=client,
            )
            if cosigned is None:
                missing.append(config.name)
                continue
            try:
                with transaction.atomic():
                    TombstoneStamp.objects.create(
                        tombstone=tombstone,
                        signer=config.name,
                        stamp=cosigned.line,
                        stamped_at=cosigned.stamped_at,
                    )
            except IntegrityError:  # a concurrent call stored this witness's first
                pass
    return missing
